//! A lock held past the patience budget: the batch is diverted with a
//! receipt, and the flush fails closed.
mod common;
use std::time::Duration;

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause, RetryPlan};

#[test]
fn a_lock_held_past_patience_is_diverted() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);
    let holder = hold_write_lock(&home, Duration::from_millis(RetryPlan::PATIENCE_MS + 1500));
    let out = store.append_batch(&sid("s1"), &batch("b", 4));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Locked));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 4, 0));
    assert_eq!(out.error.as_deref(), Some("session_persistence_failed:locked"));
    let lines = receipt_lines(out.receipt.as_ref().expect("receipt"));
    assert_eq!(
        lines.iter().map(|l| l["uid"].as_str().unwrap()).collect::<Vec<_>>(),
        ["b-0", "b-1", "b-2", "b-3"]
    );
    assert_eq!(out.copy.as_ref().map(|c| c.code.as_str()), Some("locked.diverted"));
    holder.join().unwrap();
    // Not sticky: the next batch writes normally.
    assert!(store.sticky().is_none());
    assert!(store.append_batch(&sid("s1"), &batch("c", 1)).persisted);
    assert_eq!(store.counters().connections_opened, 1);
}
