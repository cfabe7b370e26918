//! Another connection holds the write lock for 2 s: the flush retries on
//! the policy's plan and ends persisted, without reopening: watched from
//! below by the counting VFS as SQLite's default, not only by the store's
//! own counters and handle identity.
mod common;
use std::time::{Duration, Instant};

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn a_two_second_lock_ends_persisted() {
    let home = Home::new();
    let watch = watch_opens(&home);
    let mut store = home.store();
    assert_eq!(watch.counts().main.opens, 1, "{:?}", watch.counts());
    let id = store.handle_identity();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let holder = hold_write_lock(&home, Duration::from_secs(2));
    let started = Instant::now();
    let before = watch.counts();
    let out = store.append_batch(&sid("s1"), &batch("b", 10));
    let during = watch.counts();
    holder.join().unwrap();
    // The holder's connection was opened before, and may close during the
    // flush; any open of state.db while it ran is a reopen.
    assert_eq!(
        during.main.opens, before.main.opens,
        "the flush reopened state.db: {during:?}"
    );
    assert_eq!(
        during.wal.opens, before.wal.opens,
        "the flush reopened the WAL: {during:?}"
    );
    assert!(out.persisted, "{:?}", out.error);
    assert!(started.elapsed() >= Duration::from_millis(1900));
    assert_eq!(out.cause, Some(Cause::Locked));
    assert_eq!(out.action, Some(ActionKind::Retry));
    assert!(out.attempts > 2, "retried: {}", out.attempts);
    assert_eq!(out.committed, 10);
    assert_eq!(out.copy.as_ref().map(|c| c.code.as_str()), Some("locked.persisted"));
    assert_eq!(home.rows("s1").len(), 12);
    let c = store.counters();
    assert_eq!((c.connections_opened, c.open_attempts, c.diverts), (1, 1, 0));
    assert_eq!(c.append_attempts, 1 + u64::from(out.attempts));
    assert_eq!(store.handle_identity(), id);
}
