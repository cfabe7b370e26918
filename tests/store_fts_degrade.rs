//! A damaged FTS5 index (`SQLITE_CORRUPT_VTAB`): the messages are intact,
//! so the batch is written once without the index, the index is marked for
//! rebuild, later writes skip it, and a rebuild restores search.
mod common;
use common::*;
use turnsafe_policy::{ActionKind, Cause};

fn fts_enabled(home: &Home) -> String {
    home.other()
        .query_row("SELECT value FROM state_meta WHERE key = 'fts_enabled'", [], |r| {
            r.get(0)
        })
        .unwrap()
}

fn search(home: &Home, word: &str) -> i64 {
    home.other()
        .query_row(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1",
            [word],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn a_corrupt_index_is_degraded_then_rebuilt() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("before", 3)).persisted);
    // Damage the index's structure record from another connection.
    home.other()
        .execute("UPDATE messages_fts_data SET block = X'FFFFFFFFFFFF' WHERE id = 10", [])
        .unwrap();

    let out = store.append_batch(&sid("s1"), &batch("during", 2));
    assert!(out.persisted, "{:?}", out.error);
    assert_eq!(out.cause, Some(Cause::FtsIndex));
    assert_eq!(out.action, Some(ActionKind::DegradeFts));
    assert_eq!((out.attempts, out.committed), (2, 2));
    assert_eq!(out.copy.as_ref().map(|c| c.code.as_str()), Some("fts_index.persisted"));
    assert_eq!(fts_enabled(&home), "0");

    // Later writes skip the index without failing.
    let later = store.append_batch(&sid("s1"), &batch("after", 2));
    assert!(later.persisted && later.cause.is_none() && later.attempts == 1);
    assert_eq!(home.rows("s1").len(), 7);

    store.rebuild_fts().expect("rebuild");
    assert_eq!(fts_enabled(&home), "1");
    assert_eq!(search(&home, "during"), 2);
    assert_eq!(search(&home, "lorem"), 7);
    assert_eq!(store.counters().connections_opened, 1);
}
