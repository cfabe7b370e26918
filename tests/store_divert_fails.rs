//! When the divert fails too (a file where `sessions/` should be), the
//! batch is handed back, the outcome says the divert failed, and no part
//! of the copy names a divert file.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::Cause;

#[test]
fn a_blocked_divert_is_reported_as_a_failed_divert() {
    let home = Home::new();
    drop(home.store());
    std::fs::write(home.path().join("sessions"), b"not a directory").unwrap();
    let mut store = home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    });
    let out = store.append_batch(&sid("s1"), &batch("x", 3));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Disk));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 0, 3));
    assert!(out.receipt.is_none());
    let err = out.divert_error.as_ref().expect("divert error");
    assert_eq!((err.operation, err.errno), ("open", Some(libc::ENOTDIR as i64)));
    let copy = out.copy.as_ref().expect("copy");
    assert_eq!(copy.code, "disk.divert_failed");
    let all = serde_json::to_string(&out.to_value()["copy"]).unwrap();
    assert!(!all.to_lowercase().contains("a copy was kept"), "{all}");
    assert!(!all.contains("sessions") && !all.contains(".jsonl"), "{all}");
    assert!(all.contains("open: not a directory (ENOTDIR)"), "{all}");
    // The outcome's own divert_error carries no path either.
    assert!(!out.to_value()["divert_error"].to_string().contains(".jsonl"));
    assert_eq!(store.counters().connections_opened, 1);
}

#[test]
fn a_missing_home_fails_open_and_divert_and_claims_nothing() {
    let home = Home::new();
    let missing = home.path().join("no").join("such");
    let mut store = turnsafe_host::store::SessionStore::new(&missing, StoreOptions::default());
    assert!(!store.is_open());
    let out = store.append_batch(&sid("s1"), &batch("x", 2));
    assert_eq!(out.cause, Some(Cause::Disk));
    assert_eq!(out.handed_back, 2);
    assert_eq!(out.divert_error.as_ref().map(|e| e.operation), Some("mkdir"));
    assert_eq!(out.copy.as_ref().map(|c| c.code.as_str()), Some("disk.divert_failed"));
    // The open was tried once, at creation: the first batch takes that
    // failure as its own and does not try again within the batch.
    assert_eq!(store.counters().open_attempts, 1);
    let out = store.append_batch(&sid("s1"), &batch("y", 1));
    assert_eq!(out.handed_back, 1);
    // A disk-class failure is not sticky: the next batch tries once more.
    assert_eq!(store.counters().open_attempts, 2);
    assert!(!missing.exists(), "nothing was created");
}
