//! The divert's own fsync fails (EIO from a failpoint on the file's fsync
//! or, for a new file, its folder's): no receipt exists, no copy claims
//! one, and the file is cut back to where the batch began. When even the
//! cut fails, the outcome names the residue and the copy says that lines
//! may remain, never that the messages are stored nowhere.
mod common;
use common::*;
use turnsafe_host::failpoint;
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::store::{SessionStore, StoreOptions};
use turnsafe_policy::Cause;

/// A store whose every write fails as `disk` (read-only open), so every
/// batch goes to the divert.
fn diverting_store(home: &Home) -> SessionStore {
    drop(home.store());
    home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    })
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
    let home = Home::new();
    let mut store = diverting_store(&home);
    let first = store.append_batch(&sid("s1"), &batch("kept", 2));
    assert!(first.receipt.is_some());
    let before = std::fs::read(home.divert_file("s1")).unwrap();

    let _eio = failpoint::fail_on(&["divert.fsync"], libc::EIO);
    let out = store.append_batch(&sid("s1"), &batch("lost", 2));
    let copy = claims_nothing(&out);
    let err = out.divert_error.as_ref().expect("divert error");
    assert_eq!((err.operation, err.errno), ("fsync", Some(i64::from(libc::EIO))));
    assert!(copy.contains("not stored anywhere"), "{copy}");
    assert!(out.divert_residue.is_none());
    assert_eq!(
        std::fs::read(home.divert_file("s1")).unwrap(),
        before,
        "the failed batch's lines were cut away"
    );
}

#[test]
fn a_failed_folder_fsync_for_a_new_divert_file_leaves_no_receipt() {
    let home = Home::new();
    let mut store = diverting_store(&home);
    let _eio = failpoint::fail_on(&["divert.fsync_dir"], libc::EIO);
    let out = store.append_batch(&sid("s1"), &batch("lost", 2));
    claims_nothing(&out);
    let err = out.divert_error.as_ref().expect("divert error");
    assert_eq!((err.operation, err.errno), ("fsync_dir", Some(i64::from(libc::EIO))));
    assert_eq!(std::fs::metadata(home.divert_file("s1")).unwrap().len(), 0);
}

#[test]
fn a_divert_that_cannot_be_cut_back_names_its_residue() {
    let home = Home::new();
    let mut store = diverting_store(&home);
    let first = store.append_batch(&sid("s1"), &batch("kept", 2));
    let kept = first.receipt.expect("receipt");
    let _eio = failpoint::fail_on(&["divert.fsync", "divert.truncate"], libc::EIO);
    let out = store.append_batch(&sid("s1"), &batch("maybe", 2));
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
}
