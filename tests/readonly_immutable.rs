//! Read-only storage as root: `chattr +i` on the db or on the WAL. Both
//! reach the policy as SQLite's own READONLY and are diverted as `disk`.
mod common;
use common::privileged::Immutable;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_policy::{ActionKind, Cause};

/// The failure the policy saw was SQLite's own READONLY: primary code 8,
/// and an extended code whose low byte is 8 (not a message, not CANTOPEN).
fn assert_sqlite_readonly(out: &FlushOutcome) {
    let f = out.failure.as_ref().expect("the flush observed a failure");
    assert_eq!(f.code, Some(8), "not SQLITE_READONLY: {f:?}");
    let extended = f.extended_code.expect("an extended code");
    assert_eq!(
        extended & 0xff,
        8,
        "extended code {extended} is not a READONLY code: {f:?}"
    );
}

#[test]
fn an_immutable_db_file_diverts() {
    let home = Home::new();
    drop(home.store());
    let _imm = skip_unless!(Immutable::new(&home.db()));
    let mut store = home.store();
    let out = store.append_batch(&sid("s1"), &batch("x", 3));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Disk));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_sqlite_readonly(&out);
    assert_eq!(out.diverted, 3);
    receipt_lines(out.receipt.as_ref().unwrap());
    assert_eq!(out.report.copy.unwrap().code, "disk.diverted");
}

#[test]
fn an_immutable_wal_diverts() {
    let home = Home::new();
    let mut first = home.store();
    assert!(first.append_batch(&sid("s1"), &batch("a", 1)).persisted);
    drop(first);
    // The last close checkpointed and removed the WAL; recreate it.
    let other = home.other();
    other
        .execute_batch("PRAGMA journal_mode=WAL; UPDATE state_meta SET value = value WHERE key = 'generation'")
        .unwrap();
    assert!(home.path().join("state.db-wal").exists());
    let _imm = skip_unless!(Immutable::new(&home.path().join("state.db-wal")));
    let mut store = home.store();
    let out = store.append_batch(&sid("s1"), &batch("x", 2));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Disk));
    assert_sqlite_readonly(&out);
    assert_eq!(out.diverted, 2);
    drop(other);
}

#[test]
fn an_immutable_sessions_folder_fails_the_divert_without_a_claim() {
    let home = Home::new();
    drop(home.store());
    std::fs::create_dir(home.path().join("sessions")).unwrap();
    let _dir = skip_unless!(Immutable::new(&home.path().join("sessions")));
    let _db = skip_unless!(Immutable::new(&home.db()));
    let mut store = home.store();
    let out = store.append_batch(&sid("s1"), &batch("x", 2));
    assert_eq!(out.cause, Some(Cause::Disk));
    assert_eq!((out.diverted, out.handed_back), (0, 2));
    let e = out.divert_error.as_ref().unwrap();
    assert_eq!((e.operation, e.errno), ("open", Some(libc::EPERM as i64)));
    let copy = out.report.copy.unwrap();
    assert_eq!(copy.code, "disk.divert_failed");
    assert!(!copy.body.contains("sessions") && !copy.body.to_lowercase().contains("a copy was kept"));
}
