//! Ids come from a userspace generator seeded once from the OS. A forked
//! child (a Python worker forked after using turnsafe) inherits that state;
//! the generator notices the new pid and reseeds, so the child never
//! repeats the ids or seeds its parent mints next.
use std::io::Read;
use std::os::fd::FromRawFd;

use turnsafe_host::{ids, store};

const N: usize = 200;

#[test]
fn a_forked_child_never_repeats_its_parents_ids() {
    // Use the generator first, so the child inherits a live state.
    let warm: Vec<String> = (0..3).map(|_| store::mint_id()).collect();
    assert_eq!(warm.len(), 3);
    let mut fds = [0; 2];
    // SAFETY: a two-element array for pipe(2).
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only mints ids, writes them to the pipe and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut out = String::new();
        for _ in 0..N {
            out.push_str(&store::mint_id());
            out.push('\n');
            out.push_str(&format!("{:x}\n", ids::seed()));
        }
        let bytes = out.as_bytes();
        let mut written = 0;
        while written < bytes.len() {
            // SAFETY: writing our own buffer to the pipe's write end.
            let n = unsafe { libc::write(fds[1], bytes[written..].as_ptr().cast(), bytes.len() - written) };
            if n <= 0 {
                break;
            }
            written += n as usize;
        }
        // SAFETY: leave without running the parent's test harness.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the parent's copy of the write end, not used again.
    unsafe { libc::close(fds[1]) };
    let mut parent = Vec::new();
    for _ in 0..N {
        parent.push(store::mint_id());
        parent.push(format!("{:x}", ids::seed()));
    }
    // SAFETY: the read end, owned from here on.
    let mut reader = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    let mut text = String::new();
    reader.read_to_string(&mut text).unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let child: Vec<&str> = text.lines().collect();
    assert_eq!(child.len(), 2 * N, "the child wrote everything");
    let parent_set: std::collections::HashSet<&str> = parent.iter().map(String::as_str).collect();
    let repeated: Vec<&&str> = child.iter().filter(|c| parent_set.contains(**c)).collect();
    assert!(
        repeated.is_empty(),
        "the child repeated {} of its parent's values, first {:?}",
        repeated.len(),
        repeated.iter().take(3).collect::<Vec<_>>()
    );
}
