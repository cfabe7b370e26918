//! The guard probes the WAL before every commit without reading its times.
//! On filesystems with multigrain timestamps (ext4 since Linux 6.13), a
//! `stat` that returns the times forces the next write to stamp a new
//! fine-grained mtime, so every commit dirties the WAL's inode and
//! `fdatasync` writes it out: one more synchronous write per batch.
//! Watched from outside with strace: every probe of `state.db-wal` is a
//! `statx` for identity and link count only.

#[test]
fn the_guard_never_reads_the_wal_times() {
    turnsafe_tests::require!(turnsafe_tests::strace());
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let home = dir.path().join("home");
    const BATCHES: usize = 20;
    let batches: String = (0..BATCHES)
        .map(|b| format!("[{{\"role\":\"user\",\"content\":\"batch {b}\"}}]\n"))
        .collect();
    let out = assert_cmd::Command::new("strace")
        .args(["-f", "-y", "-e", "trace=stat,lstat,fstat,newfstatat,statx", "-o"])
        .arg(&trace)
        .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(["append", "--session", "s1", "--home"])
        .arg(&home)
        .write_stdin(batches)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = std::fs::read_to_string(&trace).unwrap();
    let wal: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("state.db-wal") && !l.contains("ENOENT"))
        .collect();
    // `statx(dirfd, path, flags, MASK, {...})`: the mask asked for, not what came back.
    let asks_identity_only = |l: &str| {
        l.split_once("statx(")
            .and_then(|(_, args)| args.split(", ").nth(3))
            .is_some_and(|mask| mask.contains("STATX_INO") && !mask.contains("TIME") && !mask.contains("BASIC"))
    };
    let identity_only = wal.iter().filter(|l| asks_identity_only(l)).count();
    let reads_times: Vec<&&str> = wal.iter().filter(|l| !asks_identity_only(l)).collect();
    // The guard still probes the WAL at every commit (its path and its descriptor).
    assert!(
        identity_only >= 2 * BATCHES,
        "{identity_only} identity probes:\n{}",
        wal.join("\n")
    );
    // SQLite reads them once or twice when it opens the WAL; never per batch.
    assert!(
        reads_times.len() <= 4,
        "{} stats of the WAL read its times:\n{}",
        reads_times.len(),
        reads_times.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n")
    );
}

/// Once the home and the main file have been still for longer than the
/// racy window, a commit neither lists the home for captures nor reads
/// the header again: one `statx` of the home and the guard's `statx`
/// stand for both. Watched from outside with strace, over batches sent
/// one at a time after such a pause (the first of them still reads both
/// once: what it last read was young).
#[test]
fn a_commit_lists_no_home_and_reads_no_header_when_nothing_moved() {
    use std::io::{BufRead, BufReader, Write as _};
    turnsafe_tests::require!(turnsafe_tests::strace());
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let home = dir.path().join("home");
    const BATCHES: usize = 20;
    let mut child = std::process::Command::new("strace")
        .args(["-f", "-y", "-e", "trace=read,getdents64,pread64", "-o"])
        .arg(&trace)
        .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(["append", "--session", "s1", "--home"])
        .arg(&home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = |stdin: &mut std::process::ChildStdin, b: usize| {
        // One write per line, so each batch is one read on the other side.
        let line = format!("[{{\"role\":\"user\",\"content\":\"batch {b}\"}}]\n");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(line.contains("\"persisted\":true"), "batch {b}: {line}");
    };
    send(&mut stdin, 0);
    // Past the window in which a stamp proves nothing.
    std::thread::sleep(turnsafe_host::stamps::racy_for(&home) + std::time::Duration::from_millis(300));
    for b in 1..=BATCHES {
        send(&mut stdin, b);
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    let trace = std::fs::read_to_string(&trace).unwrap();
    // The first batch after the pause reads both once more, since what it
    // last read was young; the quiet batches are the ones after it.
    let mut reads = trace
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("read(0<") && !l.ends_with("= 0"));
    let quiet_from = reads.nth(2).map(|(at, _)| at).expect("a third batch read");
    let quiet: Vec<&str> = trace.lines().skip(quiet_from).collect();
    let home_tag = format!("<{}>", home.display());
    let db_tag = format!("<{}>", home.join("state.db").display());
    let listings = quiet
        .iter()
        .filter(|l| l.contains("getdents64(") && l.contains(&home_tag))
        .count();
    let header_reads = quiet
        .iter()
        .filter(|l| l.contains("pread64(") && l.contains(&db_tag) && l.contains(", 4, 68)"))
        .count();
    // Before the pause the home and the header are young and read at every
    // batch; after it, neither.
    let before = trace.lines().take(quiet_from).collect::<Vec<_>>();
    assert!(
        before
            .iter()
            .any(|l| l.contains("getdents64(") && l.contains(&home_tag)),
        "the trace shows the home's listing at the open:\n{trace}"
    );
    assert_eq!(
        (listings, header_reads),
        (0, 0),
        "listings of the home and header reads over {} quiet batches:\n{}",
        BATCHES - 1,
        quiet.join("\n")
    );
}
