//! The same uid with different content is a conflict: the whole batch is
//! refused and handed back, never diverted, and nothing of it is committed.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn a_conflicting_uid_hands_the_batch_back() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("t1", 3)).persisted);

    let conflicting = vec![
        Message::new("user", "a brand new message").with_uid("fresh-1"),
        Message::new("user", "different content, same uid").with_uid("t1-1"),
    ];
    let out = store.append_batch(&sid("s1"), &conflicting);
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::UidConflict));
    assert_eq!(out.action, Some(ActionKind::FailClosed));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 0, 2));
    assert!(out.receipt.is_none());
    assert_eq!(out.error.as_deref(), Some("session_persistence_failed:uid_conflict"));
    let copy = out.report.copy.expect("copy");
    assert_eq!(copy.code, "uid_conflict.handed_back");
    assert!(!copy.body.to_lowercase().contains("a copy was kept"));

    assert!(!home.divert_file("s1").exists(), "a conflict is never diverted");
    let rows = home.rows("s1");
    assert_eq!(rows.len(), 3, "the new message in the refused batch was rolled back");
    assert!(rows.iter().all(|r| r.0 != "fresh-1"));
    let c = store.counters();
    assert_eq!((c.connections_opened, c.append_attempts, c.diverts), (1, 2, 0));
}
