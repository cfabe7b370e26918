//! A sticky cause (here real corruption: garbage over a page) makes the
//! handle divert every later batch without touching the database: watched
//! from below by the counting VFS as SQLite's default (no open, no close,
//! no write transaction), not only by the store's own counters.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn after_corruption_every_batch_is_diverted_without_touching_the_db() {
    let home = Home::new();
    let watch = watch_opens(&home);
    let mut store = home.store();
    let id = store.handle_identity();
    assert!(store.append_batch(&sid("s1"), &batch("ok", 2)).persisted);
    corrupt_table_page(&home, "messages");

    let before_hit = watch.counts();
    let out = store.append_batch(&sid("s1"), &batch("hit", 2));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Corrupt));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 2, 0));
    assert_eq!(store.sticky(), Some(Cause::Corrupt));
    let attempts_after_hit = store.counters().append_attempts;
    let after_hit = watch.counts();
    assert_eq!(
        after_hit.main.opens, before_hit.main.opens,
        "reopened at the hit: {after_hit:?}"
    );

    for i in 0..3 {
        let out = store.append_batch(&sid("s1"), &batch(&format!("later{i}"), 3));
        assert!(!out.persisted);
        assert_eq!(out.cause, Some(Cause::Corrupt));
        assert_eq!(out.attempts, 0, "the database is not touched");
        assert_eq!(out.diverted, 3);
        let r = out.report.receipt.expect("receipt");
        let lines = receipt_lines(&r);
        assert_eq!(lines[0]["uid"], format!("later{i}-0"));
        assert_eq!(lines[0]["cause"], "corrupt");
    }
    let later = watch.counts();
    assert_eq!(
        (later.main.opens, later.main.closes, later.main.write_locks),
        (after_hit.main.opens, after_hit.main.closes, after_hit.main.write_locks),
        "a sticky handle opened, closed or began a write on state.db: {later:?}"
    );
    let c = store.counters();
    assert_eq!(
        c.append_attempts, attempts_after_hit,
        "no write was attempted after the sticky cause"
    );
    assert_eq!((c.connections_opened, c.open_attempts, c.diverts), (1, 1, 4));
    assert_eq!(store.handle_identity(), id);
}
