//! Schema v1 (the index kept by an insert trigger) to v2 (the index catches
//! up behind a watermark), on databases the v1 writer made
//! (`tests/fixtures/`): the trigger goes; a complete index keeps every row
//! at the watermark; a degraded one stays marked for rebuild. A v1
//! database on a read-only home is searched as it is, unchanged.
mod common;
use std::path::Path;

use common::*;
use rusqlite::Connection;
use turnsafe_host::backend::Backend;
use turnsafe_host::search::{self, IndexHealth, SearchOptions};
use turnsafe_host::store::SCHEMA_VERSION;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A home holding a copy of a v1 fixture.
fn home_from(name: &str) -> Home {
    let home = Home::new();
    std::fs::copy(fixture(name), home.db()).unwrap();
    home
}

fn meta(c: &Connection, key: &str) -> Option<String> {
    c.query_row("SELECT value FROM state_meta WHERE key = ?1", [key], |r| r.get(0))
        .ok()
}

fn triggers(c: &Connection) -> Vec<String> {
    let mut s = c
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'trigger' ORDER BY name")
        .unwrap();
    s.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

fn version(c: &Connection) -> i64 {
    c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

fn uids(r: &search::SearchReport) -> Vec<String> {
    let mut u: Vec<String> = r.hits.iter().map(|h| h.uid.clone()).collect();
    u.sort();
    u
}

#[test]
fn the_fixtures_are_v1() {
    for name in ["v1-index-complete.db", "v1-index-degraded.db"] {
        // A copy: even a read-only open would leave sidecars next to the fixture.
        let home = home_from(name);
        let c = Connection::open_with_flags(home.db(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        assert_eq!(version(&c), 1, "{name}");
        assert_eq!(triggers(&c), ["messages_fts_insert"], "{name}");
        assert_eq!(meta(&c, "fts_watermark"), None, "{name}");
    }
}

#[test]
fn a_complete_v1_index_is_kept_up_to_its_highest_id() {
    let home = home_from("v1-index-complete.db");
    let mut store = home.store();
    assert!(store.is_open());
    let c = home.other();
    // Through version 2 to the current one.
    assert_eq!(version(&c), SCHEMA_VERSION);
    assert_eq!(meta(&c, "schema_version"), Some(SCHEMA_VERSION.to_string()));
    assert_eq!(triggers(&c), ["messages_fts_reindex", "messages_fts_unindex"]);
    assert_eq!(meta(&c, "fts_enabled").as_deref(), Some("1"));
    assert_eq!(meta(&c, "fts_watermark").as_deref(), Some("14"));
    let indexed: i64 = c
        .query_row("SELECT count(*) FROM messages_fts_docsize", [], |r| r.get(0))
        .unwrap();
    assert_eq!(indexed, 14, "every row indexed once");

    // Old rows are searched through the old index, with nothing to scan.
    let r = search::search(home.path(), "glacier", &SearchOptions::default()).unwrap();
    assert_eq!(uids(&r), ["b-0", "b-1"]);
    assert_eq!((r.unindexed, r.index), (0, IndexHealth::Current));

    // A new commit is not indexed at commit time, and search finds it.
    let mut more = batch("after", 2);
    more[0] = turnsafe_host::message::Message::new("user", "a lighthouse after the migration").with_uid("after-0");
    let out = store.append_batch(&sid("alpha"), &more);
    assert!(out.persisted && out.attempts == 1);
    assert_eq!(home.rows("alpha").len(), 14);
    let indexed: i64 = c
        .query_row("SELECT count(*) FROM messages_fts_docsize", [], |r| r.get(0))
        .unwrap();
    assert_eq!(indexed, 14);
    let r = search::search(home.path(), "lighthouse", &SearchOptions::default()).unwrap();
    assert_eq!(r.hits.len(), 13);
    assert!(uids(&r).contains(&"after-0".to_string()));
    assert_eq!(r.unindexed, 0);
    assert_eq!(meta(&c, "fts_watermark").as_deref(), Some("16"));
    // The seqs carried on from the v1 rows.
    let seqs: Vec<i64> = home.rows("alpha").iter().map(|r| r.1).collect();
    assert_eq!(seqs, (1..=14).collect::<Vec<_>>());
}

#[test]
fn a_degraded_v1_index_stays_marked_for_rebuild() {
    let home = home_from("v1-index-degraded.db");
    let mut store = home.store();
    let c = home.other();
    assert_eq!(version(&c), SCHEMA_VERSION);
    assert_eq!(meta(&c, "fts_enabled").as_deref(), Some("0"));
    assert_eq!(meta(&c, "fts_watermark").as_deref(), Some("0"));
    assert!(store.catch_up_index(None).is_err(), "a damaged index is not added to");

    // Search does not trust it: every row is scanned.
    let r = search::search(home.path(), "lighthouse", &SearchOptions::default()).unwrap();
    assert_eq!((r.hits.len(), r.unindexed, r.index), (12, 12, IndexHealth::Damaged));

    store.rebuild_fts().unwrap();
    assert_eq!(meta(&c, "fts_enabled").as_deref(), Some("1"));
    assert_eq!(meta(&c, "fts_watermark").as_deref(), Some("12"));
    let r = search::search(home.path(), "lighthouse", &SearchOptions::default()).unwrap();
    assert_eq!((r.hits.len(), r.unindexed, r.index), (12, 0, IndexHealth::Current));
}

#[test]
fn a_v1_database_is_searched_read_only_without_a_migration() {
    for (name, unindexed, health) in [
        ("v1-index-complete.db", 0, IndexHealth::Current),
        ("v1-index-degraded.db", 12, IndexHealth::Damaged),
    ] {
        let home = home_from(name);
        let before = std::fs::read(home.db()).unwrap();
        let opts = SearchOptions {
            read_only: true,
            ..SearchOptions::default()
        };
        let r = search::search(home.path(), "lighthouse", &opts).unwrap();
        assert_eq!((r.hits.len(), r.unindexed, r.index), (12, unindexed, health), "{name}");
        assert_eq!(std::fs::read(home.db()).unwrap(), before, "{name} was written");
    }
}
