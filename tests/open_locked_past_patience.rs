//! A write lock held by another connection while the store opens (and
//! must create its schema) is retried on the policy's plan inside the
//! flush; held past the patience, the batch is diverted with a receipt.
mod common;
use std::time::{Duration, Instant};

use common::*;
use rusqlite::Connection;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause, Operation};

#[test]
fn a_lock_held_past_patience_at_open_diverts_after_retrying() {
    let home = Home::new();
    let db = home.db();
    let (tx, rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let c = Connection::open(db).unwrap();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(6500));
        c.execute_batch("COMMIT").unwrap();
    });
    rx.recv().unwrap();
    let started = Instant::now();
    let mut store = home.store();
    let out = store.append_batch(&sid("s1"), &batch("x", 2));
    let waited = started.elapsed();
    assert!(!out.persisted, "{}", out.to_value());
    assert_eq!(out.operation, Some(Operation::Open));
    assert_eq!(out.cause, Some(Cause::Locked));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert!(out.attempts > 3, "retried within patience: {}", out.attempts);
    assert!(waited >= Duration::from_secs(4), "gave up early: {waited:?}");
    assert_eq!(out.diverted, 2);
    assert!(out.receipt.is_some());
    holder.join().unwrap();
    // Locked is not sticky: once the lock is gone, the next batch opens.
    assert!(store.sticky().is_none());
    assert!(store.append_batch(&sid("s1"), &batch("y", 1)).persisted);
}
