//! Fail closed, watched from below: a counting VFS under SQLite sees every
//! open and close of the main file, the WAL and the journal, and every
//! write transaction begun (the WAL write lock taken). The store keeps
//! counters of its own; these tests never read them, so an implementation
//! that reopened or retried through another path would be caught here.
//!
//! For every sticky cause, for a disk-class failure on a live handle, and
//! for a CANTOPEN that `append_batch` meets on an open handle:
//! - the main file is opened exactly once over the handle's life;
//! - nothing is closed before the handle drops;
//! - a batch the policy gives no retry begins exactly one transaction, and a
//!   sticky handle begins none for later batches.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::faultvfs::{self, Counter, Counts, Fault, FileKind, Op};
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::store::{SessionStore, StoreOptions};
use turnsafe_policy::Cause;

/// A store opened through the counting VFS, with a counter on its home.
fn counted_store(home: &Home) -> (SessionStore, Counter) {
    let counter = faultvfs::count(&home.path().to_string_lossy()).expect("counting VFS");
    let store = home.store_with(StoreOptions {
        vfs: Some(faultvfs::VFS_NAME.into()),
        ..StoreOptions::default()
    });
    (store, counter)
}

fn no_close(c: &Counts) {
    assert_eq!((c.main.closes, c.wal.closes), (0, 0), "{c:?}");
}

fn diverted(out: &FlushOutcome, cause: Cause) {
    assert!(!out.persisted, "{}", out.to_value());
    assert_eq!(out.cause, Some(cause), "{}", out.to_value());
    assert_eq!(out.diverted, 2, "{}", out.to_value());
}

/// Commit one batch, then break the store with `breaker`; the next batch
/// meets `cause` and every later one diverts without touching the db.
fn live_handle_goes_sticky(cause: Cause, breaker: impl FnOnce(&Home)) {
    let home = Home::new();
    let (mut store, counter) = counted_store(&home);
    assert!(store.append_batch(&sid("s1"), &batch("ok", 2)).persisted);
    let before = counter.counts();
    assert_eq!(before.main.opens, 1, "{before:?}");
    breaker(&home);

    let out = store.append_batch(&sid("s1"), &batch("hit", 2));
    diverted(&out, cause);
    let at_failure = counter.counts();
    assert_eq!(
        at_failure.main.write_locks - before.main.write_locks,
        1,
        "one write attempt for a cause with no retry: {at_failure:?}"
    );
    for i in 0..2 {
        let later = store.append_batch(&sid("s1"), &batch(&format!("later{i}"), 2));
        diverted(&later, cause);
    }
    let end = counter.counts();
    assert_eq!(end.main.opens, 1, "the main file was opened again: {end:?}");
    assert_eq!(
        end.main.write_locks, at_failure.main.write_locks,
        "a sticky handle began a write: {end:?}"
    );
    no_close(&end);
    drop(store);
    assert_eq!(counter.counts().main.closes, 1, "closed once, with the handle");
}

#[test]
fn corrupt_page_on_a_live_handle() {
    live_handle_goes_sticky(Cause::Corrupt, |home| corrupt_table_page(home, "messages"));
}

#[test]
fn sidecars_deleted_under_a_live_handle() {
    live_handle_goes_sticky(Cause::DeletedWal, |home| {
        for s in ["state.db-wal", "state.db-shm"] {
            std::fs::remove_file(home.path().join(s)).unwrap();
        }
    });
}

#[test]
fn db_replaced_under_a_live_handle() {
    live_handle_goes_sticky(Cause::Replaced, |home| {
        std::fs::rename(home.db(), home.path().join("moved.db")).unwrap();
        std::fs::write(home.db(), b"").unwrap();
    });
}

#[test]
fn corrupt_header_at_open_is_opened_once_and_never_written() {
    let home = Home::new();
    drop(home.store());
    let mut bytes = std::fs::read(home.db()).unwrap();
    bytes[..100].fill(0x5A);
    std::fs::write(home.db(), &bytes).unwrap();
    let _ = std::fs::remove_file(home.path().join("state.db-wal"));
    let _ = std::fs::remove_file(home.path().join("state.db-shm"));

    let (mut store, counter) = counted_store(&home);
    for i in 0..3 {
        let out = store.append_batch(&sid("s1"), &batch(&format!("b{i}"), 2));
        diverted(&out, Cause::Corrupt);
        if i == 0 {
            assert_eq!(out.operation, Some(turnsafe_policy::Operation::Open));
        }
    }
    assert_eq!(store.sticky(), Some(Cause::Corrupt));
    let c = counter.counts();
    assert_eq!(c.main.opens, 1, "{c:?}");
    no_close(&c);
    drop(store);
    assert_eq!(std::fs::read(home.db()).unwrap(), bytes, "the corrupt file was written");
    assert!(!home.path().join("state.db-wal").exists(), "a WAL was created");
}

#[test]
fn disk_class_failure_on_a_live_handle_is_not_retried() {
    let home = Home::new();
    let (mut store, counter) = counted_store(&home);
    assert!(store.append_batch(&sid("s1"), &batch("ok", 2)).persisted);
    let before = counter.counts();
    let fault = faultvfs::arm(Fault::new(&home.path().to_string_lossy(), Op::Write, FileKind::Wal, 1).persistent())
        .expect("arm");
    let out = store.append_batch(&sid("s1"), &batch("hit", 2));
    drop(fault);
    diverted(&out, Cause::Disk);
    let after = counter.counts();
    assert_eq!(after.main.write_locks - before.main.write_locks, 1, "{after:?}");
    assert_eq!(after.main.opens, 1, "{after:?}");
    no_close(&after);
    // Not sticky: with the fault gone, the same connection commits.
    assert!(store.append_batch(&sid("s1"), &batch("again", 2)).persisted);
    let end = counter.counts();
    assert_eq!(end.main.opens, 1, "{end:?}");
    no_close(&end);
}

/// The production path: `append_batch` on a handle that is open meets
/// SQLITE_CANTOPEN. SQLite's unix VFS answers CANTOPEN when it cannot open
/// the wal-index (`-shm`) it needs for a transaction, as under fd
/// exhaustion; the fault VFS gives that answer, with EMFILE, at the first
/// wal-index call of the write.
#[test]
fn cantopen_on_an_open_handle_is_diverted_once_without_a_reopen() {
    let home = Home::new();
    let (mut store, counter) = counted_store(&home);
    assert!(store.is_open());
    assert!(store.append_batch(&sid("s1"), &batch("ok", 2)).persisted);
    let opened = counter.counts();
    assert_eq!(opened.main.opens, 1, "{opened:?}");
    let fault = faultvfs::arm(
        Fault::new(&home.path().to_string_lossy(), Op::Shm, FileKind::Main, 1)
            .persistent()
            .code(rusqlite::ffi::SQLITE_CANTOPEN)
            .errno(libc::EMFILE),
    )
    .expect("arm");
    let out = store.append_batch(&sid("s1"), &batch("hit", 2));
    // A persistent fault fails every wal-index call: each attempt meets it
    // at its first one, so the calls it saw count the attempts.
    assert_eq!(fault.seen(), 1, "the write was attempted once");
    drop(fault);
    diverted(&out, Cause::Disk);
    assert_eq!(out.to_value()["error"], "session_persistence_failed:disk");
    let c = counter.counts();
    assert_eq!(c.main.opens, 1, "{c:?}");
    no_close(&c);
}
