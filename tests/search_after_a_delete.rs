//! A delete keeps the index's watermark true: an indexed row leaves the
//! index first, and deleting the newest row lowers the watermark, so the id
//! SQLite hands out again is taken for unindexed, and search finds it.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::search::{self, SearchOptions};

fn uids(report: &search::SearchReport) -> Vec<String> {
    let mut u: Vec<String> = report.hits.iter().map(|h| h.uid.clone()).collect();
    u.sort();
    u
}

fn watermark(home: &Home) -> i64 {
    home.other()
        .query_row(
            "SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_watermark'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn a_delete_keeps_the_watermark_true() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("kept", 3)).persisted);
    store.catch_up_index(None).unwrap();
    assert_eq!(watermark(&home), 3);
    // Delete the newest row: it leaves the index first, and SQLite will
    // hand its id out again, so the watermark comes down below it.
    let other = home.other();
    other.execute("DELETE FROM messages WHERE uid = 'kept-2'", []).unwrap();
    assert_eq!(watermark(&home), 2);
    assert!(store.append_batch(&sid("s1"), &batch("reused", 1)).persisted);
    let id: i64 = other
        .query_row("SELECT id FROM messages WHERE uid = 'reused-0'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(id, 3, "the deleted row's id was reused");
    let r = search::search(home.path(), "reused", &SearchOptions::default()).unwrap();
    assert_eq!(uids(&r), ["reused-0"]);
    assert_eq!(
        search::search(home.path(), "kept", &SearchOptions::default())
            .unwrap()
            .hits
            .len(),
        2
    );
    // A delete below the top changes nothing but the index.
    other.execute("DELETE FROM messages WHERE uid = 'kept-0'", []).unwrap();
    assert_eq!(watermark(&home), 3);
    assert_eq!(
        uids(&search::search(home.path(), "kept", &SearchOptions::default()).unwrap()),
        ["kept-1"]
    );
    // The index agrees with its content table.
    other
        .execute(
            "INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)",
            [],
        )
        .unwrap();
}
