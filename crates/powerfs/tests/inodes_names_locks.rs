//! Handles follow inodes, not names; renames, hard links, `flock`, POSIX
//! `fcntl` locks and shared `mmap` behave as on a local filesystem.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use powerfs::{CutMode, PowerFs};
use turnsafe_tests::require;

fn fstat(f: &File) -> libc::stat {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), &mut st) }, 0);
    st
}

#[test]
fn unlinked_while_open_keeps_its_data_and_says_nlink_zero() {
    require!(PowerFs::available());
    let m = common::mount();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.at("wal"))
        .unwrap();
    f.write_all(b"frames before").unwrap();
    let before = fstat(&f);
    assert_eq!(before.st_nlink, 1);
    fs::remove_file(m.at("wal")).unwrap();
    assert!(!m.at("wal").exists());
    // Still readable and writable through the handle.
    f.write_all(b", frames after").unwrap();
    let mut s = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "frames before, frames after");
    let after = fstat(&f);
    assert_eq!(after.st_nlink, 0, "fstat on an unlinked file must say nlink == 0");
    assert_eq!((after.st_dev, after.st_ino), (before.st_dev, before.st_ino));
    // /proc/self/fd says "(deleted)", as on a local filesystem.
    let link = fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().ends_with("(deleted)"), "{link:?}");
    // A new file under the old name is another inode.
    fs::write(m.at("wal"), b"new").unwrap();
    assert_ne!(fs::metadata(m.at("wal")).unwrap().ino(), before.st_ino);
}

#[test]
fn inode_numbers_are_stable_and_a_replaced_file_gets_a_new_one() {
    require!(PowerFs::available());
    let m = common::mount();
    fs::write(m.at("db"), b"one").unwrap();
    let held = File::open(m.at("db")).unwrap();
    let ino = fstat(&held).st_ino;
    assert_eq!(fs::metadata(m.at("db")).unwrap().ino(), ino);
    fs::rename(m.at("db"), m.at("db2")).unwrap();
    assert_eq!(
        fs::metadata(m.at("db2")).unwrap().ino(),
        ino,
        "a rename keeps the inode"
    );
    fs::write(m.at("tmp"), b"two").unwrap();
    fs::rename(m.at("tmp"), m.at("db2")).unwrap();
    let now = fs::metadata(m.at("db2")).unwrap();
    assert_ne!(now.ino(), ino, "a file renamed over the old one is a new inode");
    assert_eq!(fstat(&held).st_nlink, 0, "the replaced inode has no name left");
    let mut s = String::new();
    (&held).read_to_string(&mut s).unwrap();
    assert_eq!(s, "one");
}

#[test]
fn hard_links_share_an_inode_and_survive_a_cut() {
    require!(PowerFs::available());
    let mut m = common::mount();
    common::write_synced(&m.at("a"), b"shared").unwrap();
    fs::hard_link(m.at("a"), m.at("b")).unwrap();
    let (a, b) = (fs::metadata(m.at("a")).unwrap(), fs::metadata(m.at("b")).unwrap());
    assert_eq!(a.ino(), b.ino());
    assert_eq!(b.nlink(), 2);
    common::sync_dir(m.path()).unwrap();
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    let (a, b) = (fs::metadata(m.at("a")).unwrap(), fs::metadata(m.at("b")).unwrap());
    assert_eq!(a.ino(), b.ino(), "still one inode after the cut");
    assert_eq!(fs::read(m.at("b")).unwrap(), b"shared");
}

#[test]
fn flock_excludes_across_open_files() {
    require!(PowerFs::available());
    let m = common::mount();
    fs::write(m.at("lock"), b"").unwrap();
    let one = File::open(m.at("lock")).unwrap();
    let two = File::open(m.at("lock")).unwrap();
    assert_eq!(
        unsafe { libc::flock(one.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let rc = unsafe { libc::flock(two.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, -1);
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EWOULDBLOCK));
    assert_eq!(unsafe { libc::flock(one.as_raw_fd(), libc::LOCK_UN) }, 0);
    assert_eq!(
        unsafe { libc::flock(two.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
}

fn setlk(fd: i32, typ: i32) -> i32 {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) }
}

#[test]
fn posix_locks_conflict_with_a_child_process() {
    require!(PowerFs::available());
    let m = common::mount();
    fs::write(m.at("db"), b"x").unwrap();
    let f = OpenOptions::new().read(true).write(true).open(m.at("db")).unwrap();
    assert_eq!(setlk(f.as_raw_fd(), libc::F_WRLCK), 0);
    let path = std::ffi::CString::new(m.at("db").into_os_string().into_encoded_bytes()).unwrap();
    let child_tries = |expect_ok: bool| {
        // The child does only async-signal-safe calls, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR) };
            let rc = setlk(fd, libc::F_WRLCK);
            let errno = unsafe { *libc::__errno_location() };
            let code = if rc == 0 {
                0
            } else if errno == libc::EAGAIN || errno == libc::EACCES {
                1
            } else {
                2
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        let code = libc::WEXITSTATUS(status);
        assert_eq!(code, if expect_ok { 0 } else { 1 }, "child lock result");
    };
    child_tries(false);
    assert_eq!(setlk(f.as_raw_fd(), libc::F_UNLCK), 0);
    child_tries(true);
}

#[test]
fn shared_mmap_is_coherent_and_durable_after_msync_and_fsync() {
    require!(PowerFs::available());
    let mut m = common::mount();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.at("shm"))
        .unwrap();
    f.set_len(8192).unwrap();
    f.sync_all().unwrap();
    common::sync_dir(m.path()).unwrap();
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let mem = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), 8192) };
    mem[4096..4101].copy_from_slice(b"hello");
    // A second descriptor sees the mapped write (one page cache).
    let other = File::open(m.at("shm")).unwrap();
    let mut buf = [0u8; 5];
    other.read_exact_at(&mut buf, 4096).unwrap();
    assert_eq!(&buf, b"hello");
    assert_eq!(unsafe { libc::msync(p, 8192, libc::MS_SYNC) }, 0);
    f.sync_all().unwrap();
    assert_eq!(unsafe { libc::munmap(p, 8192) }, 0);
    drop((f, other));
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    let data = fs::read(m.at("shm")).unwrap();
    assert_eq!(&data[4096..4101], b"hello");
}

#[test]
fn cut_with_open_files_detaches_and_leaves_no_mount() {
    require!(PowerFs::available());
    let mut m = common::mount();
    let f = File::create(m.at("open")).unwrap();
    m.cut(CutMode::DropPending).unwrap();
    // The handle is dead, as after a power loss.
    assert!((&f).write_all(b"x").is_err());
    drop(f);
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let mnt = m.path().to_string_lossy().into_owned();
    assert!(!mounts.contains(&mnt), "a mount is left at {mnt}");
    m.remount().unwrap();
    assert!(!m.at("open").exists());
}
