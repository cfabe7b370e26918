//! Focused tests of `write_file` and `create_dir_all`: stale and refused
//! temporary names, symlinks, paths relative to the current folder (in a
//! child process, so the test's own folder is not touched), and on powerfs
//! (the test filesystem that forgets what was not fsynced) real EIO from a
//! file's fsync, a write and a folder fsync, and a power cut after calls
//! that returned.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::PathBuf;
use std::process::Command;

use powerfs::{CutMode, Fault, FaultOp, PathMatch, PowerFs};

use super::*;
use crate::divert::{DivertLine, divert, sync_dir, sync_path_entries, verify_receipt};

fn tmp_name(name: &str) -> String {
    format!(".{name}.{}.tmp", std::process::id())
}

#[test]
fn a_stale_temporary_of_this_pid_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(tmp_name("f")), b"stale").unwrap();
    let path = dir.path().join("f");
    write_file(&path, b"fresh").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"fresh");
    assert!(!dir.path().join(tmp_name("f")).exists());
}

#[test]
fn a_temporary_name_that_cannot_be_removed_fails_with_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(tmp_name("f"))).unwrap();
    let e = write_file(&dir.path().join("f"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR), "{e}");
    assert!(!dir.path().join("f").exists());
}

#[test]
fn a_path_without_a_file_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for p in [PathBuf::from("/"), dir.path().join("..")] {
        let e = write_file(&p, b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}", p.display());
    }
}

#[test]
fn a_symlink_at_the_path_is_replaced_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, b"keep").unwrap();
    let path = dir.path().join("f");
    symlink(&target, &path).unwrap();
    write_file(&path, b"new").unwrap();
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file());
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
}

#[test]
fn create_dir_all_fails_under_a_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    assert!(create_dir_all(&dir.path().join("file/sub"), 0o700).is_err());
}

const CHILD: &str = "TURNSAFE_DURABLE_RELATIVE_CHILD";

#[test]
fn relative_paths_resolve_in_the_current_folder() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "durable::more_tests::relative_paths_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, dir.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"relative");
    for d in ["single", "d1", "d1/d2", "sessions"] {
        assert!(dir.path().join(d).is_dir(), "{d}");
    }
}

/// Run by [`relative_paths_resolve_in_the_current_folder`] in a child
/// whose current folder is a fresh temporary one; a no-op otherwise.
#[test]
fn relative_paths_child() {
    let Some(cwd) = std::env::var_os(CHILD) else { return };
    assert_eq!(std::env::current_dir().unwrap(), Path::new(&cwd));
    write_file(Path::new("f"), b"relative").unwrap();
    create_dir_all(Path::new("single"), 0o700).unwrap();
    create_dir_all(Path::new("d1/d2"), 0o700).unwrap();
    sync_path_entries(Path::new(".")).unwrap();
    sync_path_entries(Path::new("single")).unwrap();
    let m = crate::message::Message::new("user", "hi");
    let line = DivertLine {
        uid: "u1",
        seq: None,
        message: &m,
    };
    let r = divert(Path::new("sessions"), "s1", "b1", turnsafe_policy::Cause::Disk, &[line]).unwrap();
    assert_eq!(Path::new(&r.path), Path::new(&cwd).join("sessions/s1.jsonl"));
    assert!(verify_receipt(&r).unwrap());
}

/// A powerfs mount, everything under it durable to begin with.
struct Mounted {
    fs: PowerFs,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn new() -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).expect("mount powerfs");
        Mounted { fs, _dir: dir }
    }
    fn at(&self, rel: &str) -> PathBuf {
        self.fs.path().join(rel)
    }
    fn cut(&mut self) {
        self.fs.cut(CutMode::DropPending).unwrap();
        self.fs.remount().unwrap();
    }
}

#[test]
fn a_written_file_survives_a_power_cut() {
    turnsafe_tests::require!(PowerFs::available());
    let mut m = Mounted::new();
    write_file(&m.at("SETTLED"), b"first").unwrap();
    m.cut();
    assert_eq!(std::fs::read(m.at("SETTLED")).unwrap(), b"first");
    write_file(&m.at("SETTLED"), b"second, longer").unwrap();
    m.cut();
    assert_eq!(std::fs::read(m.at("SETTLED")).unwrap(), b"second, longer");
    let mode = std::fs::metadata(m.at("SETTLED")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn created_folders_survive_a_power_cut() {
    turnsafe_tests::require!(PowerFs::available());
    let mut m = Mounted::new();
    create_dir_all(&m.at("a/b/home"), 0o700).unwrap();
    // A folder someone else made and never synced: its entry is made
    // durable all the same.
    std::fs::create_dir(m.at("other")).unwrap();
    create_dir_all(&m.at("other"), 0o700).unwrap();
    m.cut();
    assert!(m.at("a/b/home").is_dir());
    assert!(m.at("other").is_dir());
}

#[test]
fn a_failed_fsync_or_write_keeps_the_old_file_and_leaves_no_temporary() {
    turnsafe_tests::require!(PowerFs::available());
    for op in [FaultOp::FileSync, FaultOp::Write] {
        let mut m = Mounted::new();
        write_file(&m.at("f"), b"old").unwrap();
        let id = m.fs.inject(Fault::new(op, PathMatch::exact(tmp_name("f"))));
        let e = write_file(&m.at("f"), b"new").unwrap_err();
        assert_eq!(m.fs.fault_fired(id), 1, "{op:?}");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{op:?}");
        assert_eq!(std::fs::read(m.at("f")).unwrap(), b"old", "{op:?}");
        assert!(!m.at(&tmp_name("f")).exists(), "{op:?}");
        m.cut();
        assert_eq!(std::fs::read(m.at("f")).unwrap(), b"old", "{op:?}");
    }
}

#[test]
fn a_failed_folder_fsync_fails_the_call() {
    turnsafe_tests::require!(PowerFs::available());
    let m = Mounted::new();
    std::fs::create_dir(m.at("home")).unwrap();
    sync_dir(m.fs.path()).unwrap();
    let id = m.fs.inject(Fault::new(FaultOp::DirSync, PathMatch::exact("home")));
    let e = write_file(&m.at("home/f"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_eq!(m.fs.fault_fired(id), 1);
    let e = create_dir_all(&m.at("home/new"), 0o700).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    let root = m.fs.inject(Fault::new(FaultOp::DirSync, PathMatch::exact("")));
    assert!(create_dir_all(&m.at("top/sub"), 0o700).is_err());
    assert_eq!(m.fs.fault_fired(root), 1);
}
