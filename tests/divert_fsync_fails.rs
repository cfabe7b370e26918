//! The divert's own fsync fails with a real EIO from the filesystem
//! (powerfs, the test filesystem: `Fault` on the file's fsync or, for a
//! new file, its folder's): no receipt exists, no copy claims one, and the
//! file is cut back to where the batch began. When even the cut fails (the
//! `ftruncate` fails too), the outcome names the residue and the copy says
//! that lines may remain, never that the messages are stored nowhere.
//! Each test then cuts the power: what survives is what was there before
//! the failed batch.
//!
//! No failpoint is left here: powerfs fails every call these tests need
//! (file fsync, folder fsync, ftruncate) in the kernel's own path. The
//! divert failpoints (`divert.*` in `turnsafe_host::failpoint::IO_POINTS`)
//! stay in the host for what powerfs cannot reach: a spawned `turnsafe`
//! on a filesystem it does not serve, through `TURNSAFE_IO_FAULT` (which
//! `release_binary_has_no_hooks.rs` proves the release binary ignores).
mod common;
use std::path::{Path, PathBuf};

use common::*;
use powerfs::{CutMode, Fault, FaultOp, PathMatch, PowerFs};
use turnsafe_host::backend::Backend;
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::store::{SessionStore, StoreOptions};
use turnsafe_policy::Cause;

/// A powerfs mount with a home on it (`home/state.db` made and closed).
struct Mounted {
    fs: PowerFs,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn new() -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).expect("mount powerfs");
        let home = fs.path().join("home");
        turnsafe_host::durable::create_dir_all(&home, 0o700).unwrap();
        drop(SessionStore::create(&home, StoreOptions::default()).unwrap());
        Mounted { fs, _dir: dir }
    }
    fn home(&self) -> PathBuf {
        self.fs.path().join("home")
    }
    fn divert_file(&self, session: &str) -> PathBuf {
        self.home().join("sessions").join(format!("{session}.jsonl"))
    }
    /// The power cut: only what was synced survives.
    fn cut(&mut self) {
        self.fs.cut(CutMode::DropPending).unwrap();
        self.fs.remount().unwrap();
    }
}

/// A store whose every write fails as `disk` (read-only open), so every
/// batch goes to the divert.
fn diverting_store(home: &Path) -> SessionStore {
    SessionStore::new(
        home,
        StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        },
    )
}

fn claims_nothing(out: &FlushOutcome) -> String {
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Disk));
    assert!(out.receipt.is_none(), "a receipt without a durable copy");
    assert_eq!((out.diverted, out.handed_back), (0, 2));
    let copy = out.to_value()["copy"].to_string();
    assert!(copy.contains("disk.divert_failed"), "{copy}");
    assert!(!copy.to_lowercase().contains("a copy was kept"), "{copy}");
    assert!(!copy.contains(".jsonl"), "{copy}");
    copy
}

#[test]
fn a_failed_fsync_of_an_existing_divert_file_leaves_no_receipt_and_no_bytes() {
    turnsafe_tests::require!(PowerFs::available());
    let mut m = Mounted::new();
    let mut store = diverting_store(&m.home());
    let first = store.append_batch(&sid("s1"), &batch("kept", 2));
    assert!(first.receipt.is_some());
    let before = std::fs::read(m.divert_file("s1")).unwrap();

    // The divert's fsync of its file fails; the cut-back's, the next one,
    // does not.
    let eio =
        m.fs.inject(Fault::new(FaultOp::FileSync, PathMatch::exact("home/sessions/s1.jsonl")).nth(1));
    let out = store.append_batch(&sid("s1"), &batch("lost", 2));
    assert_eq!(m.fs.fault_fired(eio), 1);
    let copy = claims_nothing(&out);
    let err = out.divert_error.as_ref().expect("divert error");
    assert_eq!((err.operation, err.errno), ("fsync", Some(i64::from(libc::EIO))));
    assert!(copy.contains("not stored anywhere"), "{copy}");
    assert!(out.divert_residue.is_none());
    assert_eq!(
        std::fs::read(m.divert_file("s1")).unwrap(),
        before,
        "the failed batch's lines were cut away"
    );
    drop(store);
    m.cut();
    assert_eq!(std::fs::read(m.divert_file("s1")).unwrap(), before, "after a power cut");
}

#[test]
fn a_failed_folder_fsync_for_a_new_divert_file_leaves_no_receipt() {
    turnsafe_tests::require!(PowerFs::available());
    let mut m = Mounted::new();
    let mut store = diverting_store(&m.home());
    let eio =
        m.fs.inject(Fault::new(FaultOp::DirSync, PathMatch::exact("home/sessions")));
    let out = store.append_batch(&sid("s1"), &batch("lost", 2));
    assert_eq!(m.fs.fault_fired(eio), 1);
    claims_nothing(&out);
    let err = out.divert_error.as_ref().expect("divert error");
    assert_eq!((err.operation, err.errno), ("fsync_dir", Some(i64::from(libc::EIO))));
    assert_eq!(std::fs::metadata(m.divert_file("s1")).unwrap().len(), 0);
    drop(store);
    // The folder's sync failed, so its new entry may be gone: the file is
    // gone or empty, never holding the batch.
    m.cut();
    let len = std::fs::metadata(m.divert_file("s1")).map_or(0, |md| md.len());
    assert_eq!(len, 0, "after a power cut");
}

#[test]
fn a_divert_that_cannot_be_cut_back_names_its_residue() {
    turnsafe_tests::require!(PowerFs::available());
    let mut m = Mounted::new();
    let mut store = diverting_store(&m.home());
    let first = store.append_batch(&sid("s1"), &batch("kept", 2));
    let kept = first.report.receipt.expect("receipt");
    let before = std::fs::read(m.divert_file("s1")).unwrap();
    let file = PathMatch::exact("home/sessions/s1.jsonl");
    let fsync = m.fs.inject(Fault::new(FaultOp::FileSync, file.clone()));
    let truncate = m.fs.inject(Fault::new(FaultOp::Truncate, file));
    let out = store.append_batch(&sid("s1"), &batch("maybe", 2));
    assert_eq!((m.fs.fault_fired(fsync), m.fs.fault_fired(truncate)), (1, 1));
    let copy = claims_nothing(&out);
    let residue = out.divert_residue.clone().expect("residue");
    assert_eq!(residue.path, kept.path);
    assert_eq!(residue.offset, kept.offset + kept.length);
    assert!(!copy.contains("not stored anywhere"), "{copy}");
    assert!(copy.contains("may remain in the session's divert file"), "{copy}");
    let v = out.to_value();
    assert_eq!(v["divert_residue"]["offset"], residue.offset);
    // The bytes really are there, from the residue's offset on.
    let data = std::fs::read(&residue.path).unwrap();
    let tail = std::str::from_utf8(&data[residue.offset as usize..]).unwrap();
    assert_eq!(tail.lines().count(), 2, "{tail}");
    assert!(tail.contains("maybe-0") && tail.contains("maybe-1"));
    drop(store);
    // The failed fsync lost them for good: a power cut leaves what the
    // receipt vouched for, and no residue.
    m.cut();
    assert_eq!(std::fs::read(m.divert_file("s1")).unwrap(), before, "after a power cut");
}
