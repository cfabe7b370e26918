//! A damaged FTS5 index (`SQLITE_CORRUPT_VTAB`) never fails a turn: the
//! index is off the commit path, so the batch commits on its first
//! attempt. The catch-up that indexes it finds the damage (`fts_index`),
//! marks the index for rebuild, and search scans every message instead; a
//! rebuild restores search through the index.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::search::{self, IndexHealth, SearchOptions};
use turnsafe_host::store::index::IndexError;
use turnsafe_policy::Cause;

fn fts_enabled(home: &Home) -> String {
    home.other()
        .query_row("SELECT value FROM state_meta WHERE key = 'fts_enabled'", [], |r| {
            r.get(0)
        })
        .unwrap()
}

fn search_index(home: &Home, word: &str) -> i64 {
    home.other()
        .query_row(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1",
            [word],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn a_corrupt_index_never_fails_a_turn_and_is_rebuilt() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("before", 3)).persisted);
    assert_eq!(store.catch_up_index(None).unwrap().indexed, 3);
    // Damage the index's structure record from another connection.
    home.other()
        .execute("UPDATE messages_fts_data SET block = X'FFFFFFFFFFFF' WHERE id = 10", [])
        .unwrap();

    let out = store.append_batch(&sid("s1"), &batch("during", 2));
    assert!(out.persisted, "{:?}", out.error);
    assert_eq!((out.cause, out.attempts, out.committed), (None, 1, 2));
    assert_eq!(fts_enabled(&home), "1", "the flush never looks at the index");

    // Indexing finds the damage and marks the index for rebuild.
    match store.catch_up_index(None) {
        Err(e @ IndexError::Damaged { marked: true, .. }) => assert_eq!(e.cause(), Some(Cause::FtsIndex)),
        other => panic!("expected damage, got {other:?}"),
    }
    assert_eq!(fts_enabled(&home), "0");
    assert!(matches!(store.catch_up_index(None), Err(IndexError::NeedsRebuild)));

    // Later writes are unaffected; search scans every message meanwhile.
    let later = store.append_batch(&sid("s1"), &batch("after", 2));
    assert!(later.persisted && later.cause.is_none() && later.attempts == 1);
    assert_eq!(home.rows("s1").len(), 7);
    let r = search::search(home.path(), "during", &SearchOptions::default()).unwrap();
    assert_eq!((r.hits.len(), r.unindexed, r.index), (2, 7, IndexHealth::Damaged));

    store.rebuild_fts().expect("rebuild");
    assert_eq!(fts_enabled(&home), "1");
    assert_eq!(search_index(&home, "during"), 2);
    assert_eq!(search_index(&home, "lorem"), 7);
    let r = search::search(home.path(), "during", &SearchOptions::default()).unwrap();
    assert_eq!((r.hits.len(), r.unindexed, r.index), (2, 0, IndexHealth::Current));
    assert_eq!(store.counters().connections_opened, 1);
}
