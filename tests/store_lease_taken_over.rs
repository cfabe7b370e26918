//! Turn leases: a live lease fences other writers; an expired one may be
//! taken over, and the old holder is then fenced. Fencing never diverts.
mod common;
use std::time::Duration;

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::{ActionKind, Cause};

fn opts(holder: &str, ttl_ms: u64) -> StoreOptions {
    StoreOptions {
        holder: holder.into(),
        lease_ttl: Duration::from_millis(ttl_ms),
        ..StoreOptions::default()
    }
}

#[test]
fn a_live_lease_fences_and_an_expired_one_is_taken_over() {
    let home = Home::new();
    let mut a = home.store_with(opts("a", 600));
    let mut b = home.store_with(opts("b", 30_000));
    assert!(a.append_batch(&sid("s1"), &batch("a1", 2)).persisted);

    // B's first batch meets A's live lease.
    let out = b.append_batch(&sid("s1"), &batch("b1", 2));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::TurnLease));
    assert_eq!(out.action, Some(ActionKind::FailClosed));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 0, 2));
    assert_eq!(
        out.copy.as_ref().map(|c| c.code.as_str()),
        Some("turn_lease.handed_back")
    );
    assert_eq!(b.counters().append_attempts, 1, "fencing is not retried");

    // After A's lease expires, B takes the turn over.
    std::thread::sleep(Duration::from_millis(800));
    assert!(b.append_batch(&sid("s1"), &batch("b2", 2)).persisted);

    // A is now fenced, even though its own clock says nothing.
    let out = a.append_batch(&sid("s1"), &batch("a2", 2));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::TurnLease));
    assert_eq!(out.handed_back, 2);
    assert!(!home.divert_file("s1").exists(), "fencing never diverts");

    let uids: Vec<String> = home.rows("s1").into_iter().map(|r| r.0).collect();
    assert_eq!(uids, ["a1-0", "a1-1", "b2-0", "b2-1"]);
    assert_eq!(a.counters().connections_opened, 1);
    assert_eq!(b.counters().connections_opened, 1);
}

#[test]
fn releasing_the_lease_lets_the_next_writer_in_at_once() {
    let home = Home::new();
    let mut a = home.store_with(opts("a", 30_000));
    assert!(a.append_batch(&sid("s1"), &batch("a1", 1)).persisted);
    a.release_lease(&sid("s1"));
    let mut b = home.store_with(opts("b", 30_000));
    assert!(b.append_batch(&sid("s1"), &batch("b1", 1)).persisted);
}
