//! A sticky cause (here real corruption: garbage over a page) makes the
//! handle divert every later batch without touching the database.
mod common;
use common::*;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn after_corruption_every_batch_is_diverted_without_touching_the_db() {
    let home = Home::new();
    let mut store = home.store();
    let id = store.handle_identity();
    assert!(store.append_batch(&sid("s1"), &batch("ok", 2)).persisted);
    corrupt_table_page(&home, "messages");

    let out = store.append_batch(&sid("s1"), &batch("hit", 2));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Corrupt));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 2, 0));
    assert_eq!(store.sticky(), Some(Cause::Corrupt));
    let attempts_after_hit = store.counters().append_attempts;

    for i in 0..3 {
        let out = store.append_batch(&sid("s1"), &batch(&format!("later{i}"), 3));
        assert!(!out.persisted);
        assert_eq!(out.cause, Some(Cause::Corrupt));
        assert_eq!(out.attempts, 0, "the database is not touched");
        assert_eq!(out.diverted, 3);
        let r = out.receipt.expect("receipt");
        let lines = receipt_lines(&r);
        assert_eq!(lines[0]["uid"], format!("later{i}-0"));
        assert_eq!(lines[0]["cause"], "corrupt");
    }
    let c = store.counters();
    assert_eq!(
        c.append_attempts, attempts_after_hit,
        "no write was attempted after the sticky cause"
    );
    assert_eq!((c.connections_opened, c.open_attempts, c.diverts), (1, 1, 4));
    assert_eq!(store.handle_identity(), id);
}
