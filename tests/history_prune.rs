//! Retention (SQLite): prune moves what it does not keep to the archive,
//! deletes what sat in the archive long enough, keeps the search index
//! consistent, skips a session another writer holds, gives the freed pages
//! back to the file system (converting a database made before incremental
//! vacuum once), and a dry run changes nothing.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::history::{Keep, PruneOptions};
use turnsafe_host::store::StoreOptions;

fn opts(keep: Keep, archived_only: bool) -> PruneOptions {
    PruneOptions {
        keep,
        archived_only,
        session: None,
        dry_run: false,
    }
}

fn count(home: &Home, sql: &str) -> i64 {
    home.other().query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn keep_last_archives_the_rest_then_the_archive_is_pruned() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 10)).persisted);
    assert!(store.append_batch(&sid("s2"), &batch("b", 2)).persisted);

    let dry = store
        .prune(&PruneOptions {
            dry_run: true,
            ..opts(Keep::Last(3), false)
        })
        .unwrap();
    assert_eq!((dry.archived(), dry.deleted()), (7, 0));
    assert_eq!(home.rows("s1").len(), 10, "a dry run changes nothing");

    let r = store.prune(&opts(Keep::Last(3), false)).unwrap();
    assert_eq!((r.archived(), r.deleted()), (7, 0));
    let kept: Vec<i64> = home.rows("s1").iter().map(|r| r.1).collect();
    assert_eq!(kept, [8, 9, 10]);
    assert_eq!(home.rows("s2").len(), 2);
    assert_eq!(count(&home, "SELECT count(*) FROM archive WHERE reason = 'prune'"), 7);

    let r = store.prune(&opts(Keep::Last(3), true)).unwrap();
    assert_eq!((r.archived(), r.deleted()), (0, 4));
    assert_eq!(count(&home, "SELECT count(*) FROM archive"), 3);
    assert_eq!(r.space, "reclaimed");
}

#[test]
fn older_than_uses_when_rows_were_stored_and_archived() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("old", 4)).persisted);
    assert!(store.append_batch(&sid("s1"), &batch("new", 2)).persisted);
    // The first four were stored 40 days ago.
    home.other()
        .execute(
            "UPDATE messages SET created_ms = created_ms - 40 * 86400000 WHERE uid LIKE 'old-%'",
            [],
        )
        .unwrap();
    let r = store.prune(&opts(Keep::NewerThanMs(30 * 86_400_000), false)).unwrap();
    assert_eq!(r.archived(), 4);
    assert_eq!(
        home.rows("s1").iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
        ["new-0", "new-1"]
    );
    // Archived just now: kept by a 30-day prune of the archive, deleted by a 0s one.
    assert_eq!(
        store
            .prune(&opts(Keep::NewerThanMs(30 * 86_400_000), true))
            .unwrap()
            .deleted(),
        0
    );
    assert_eq!(store.prune(&opts(Keep::NewerThanMs(0), true)).unwrap().deleted(), 4);
    assert_eq!(count(&home, "SELECT count(*) FROM archive"), 0);
}

#[test]
fn the_search_index_stays_consistent() {
    let home = Home::new();
    let mut store = home.store();
    let mut b = batch("a", 6);
    b[0] = turnsafe_host::message::Message::new("user", "the zebra crossing");
    b[5] = turnsafe_host::message::Message::new("user", "a zebra again");
    assert!(store.append_batch(&sid("s1"), &b).persisted);
    store.catch_up_index(None).unwrap();
    store.prune(&opts(Keep::Last(2), false)).unwrap();
    let hits = turnsafe_host::search::search(home.path(), "zebra", &Default::default()).unwrap();
    assert_eq!(hits.hits.len(), 1, "{:?}", hits.hits);
    assert!(hits.hits[0].snippet.contains("again"));
    let watermark: i64 = home
        .other()
        .query_row(
            "SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_watermark'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(watermark <= count(&home, "SELECT COALESCE(MAX(id), 0) FROM messages"));
    // A new message is indexed and found.
    assert!(
        store
            .append_batch(
                &sid("s1"),
                &[turnsafe_host::message::Message::new("user", "zebra three")]
            )
            .persisted
    );
    let hits = turnsafe_host::search::search(home.path(), "zebra", &Default::default()).unwrap();
    assert_eq!(hits.hits.len(), 2);
}

#[test]
fn a_session_another_writer_holds_is_skipped_and_named() {
    let home = Home::new();
    let mut other = home.store_with(StoreOptions {
        holder: "other".into(),
        ..StoreOptions::default()
    });
    assert!(other.append_batch(&sid("held"), &batch("h", 5)).persisted);
    let mut store = home.store();
    assert!(store.append_batch(&sid("free"), &batch("f", 5)).persisted);
    store.release_all_leases();
    let r = store.prune(&opts(Keep::Last(1), false)).unwrap();
    assert_eq!(r.skipped, ["held"]);
    assert_eq!(home.rows("held").len(), 5);
    assert_eq!(home.rows("free").len(), 1);
}

#[test]
fn freed_pages_go_back_to_the_file_system_and_an_old_database_is_converted_once() {
    let home = Home::new();
    let mut store = home.store();
    let big: Vec<_> = (0..400)
        .map(|i| turnsafe_host::message::Message::new("user", &format!("{i} {}", "x".repeat(4000))))
        .collect();
    assert!(store.append_batch(&sid("s1"), &big).persisted);
    // A new database has no auto-vacuum (it would cost every commit a
    // page), as one made before version 4: the first freeing prune converts it.
    drop(store);
    assert_eq!(count(&home, "PRAGMA auto_vacuum"), 0);
    let size = || std::fs::metadata(home.db()).unwrap().len();
    let before = size();
    let mut store = home.store();
    store.prune(&opts(Keep::Last(10), false)).unwrap();
    let r = store.prune(&opts(Keep::NewerThanMs(0), true)).unwrap();
    assert_eq!(r.deleted(), 390);
    assert_eq!(r.space, "reclaimed", "{r:?}");
    assert!(r.reclaimed_bytes.unwrap() > 1_000_000, "{r:?}");
    assert_eq!(count(&home, "PRAGMA auto_vacuum"), 2, "converted");
    assert!(size() < before / 2, "{} -> {}", before, size());
}
