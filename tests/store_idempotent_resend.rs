//! Resending a batch that was already committed changes nothing and
//! counts as committed.
mod common;
use common::*;
use turnsafe_host::backend::Backend;

#[test]
fn an_identical_resend_is_committed_without_new_rows() {
    let home = Home::new();
    let mut store = home.store();
    let id = store.handle_identity();
    let b = batch("t1", 10);
    let first = store.append_batch(&sid("s1"), &b);
    assert!(first.persisted);
    assert_eq!((first.committed, first.attempts), (10, 1));
    assert!(first.cause.is_none() && first.action.is_none() && first.copy.is_none());

    let again = store.append_batch(&sid("s1"), &b);
    assert!(again.persisted, "{:?}", again.error);
    assert_eq!((again.committed, again.diverted, again.handed_back), (10, 0, 0));
    assert_eq!(home.rows("s1").len(), 10, "no duplicate rows");
    // Half old, half new: only the new ones become rows, in order.
    let mut mixed = batch("t1", 5);
    mixed.extend(batch("t2", 3));
    let out = store.append_batch(&sid("s1"), &mixed);
    assert!(out.persisted);
    assert_eq!(out.committed, 8);
    let rows = home.rows("s1");
    assert_eq!(rows.len(), 13);
    assert_eq!(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        (1..=13).collect::<Vec<i64>>()
    );

    let c = store.counters();
    assert_eq!(
        (c.connections_opened, c.open_attempts, c.append_attempts, c.diverts),
        (1, 1, 3, 0)
    );
    assert_eq!(store.handle_identity(), id, "same connection throughout");
    assert!(!home.divert_file("s1").exists());
}

#[test]
fn minted_uids_are_reported_and_stored() {
    let home = Home::new();
    let mut store = home.store();
    let msgs = vec![turnsafe_host::message::Message::new("user", "no uid here")];
    let out = store.append_batch(&sid("s1"), &msgs);
    assert!(out.persisted);
    assert_eq!(out.minted_uids.len(), 1);
    assert_eq!(out.uids, out.minted_uids);
    assert_eq!(home.rows("s1")[0].0, out.minted_uids[0]);
}
