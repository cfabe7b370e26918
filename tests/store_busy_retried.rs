//! Another connection holds the write lock for 2 s: the flush retries on
//! the policy's plan and ends persisted, without reopening.
mod common;
use std::time::{Duration, Instant};

use common::*;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn a_two_second_lock_ends_persisted() {
    let home = Home::new();
    let mut store = home.store();
    let id = store.handle_identity();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let holder = hold_write_lock(&home, Duration::from_secs(2));
    let started = Instant::now();
    let out = store.append_batch(&sid("s1"), &batch("b", 10));
    holder.join().unwrap();
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
