//! A read-only handle cannot index: search scans the committed rows past
//! the index's watermark with `LIKE`, reports them as `unindexed`, and
//! writes nothing; writable again, it indexes them first.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::search::{self, IndexHealth, SearchOptions};

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
fn a_read_only_handle_scans_what_the_index_lacks() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("early", 3)).persisted);
    assert_eq!(store.catch_up_index(None).unwrap().indexed, 3);
    assert!(store.append_batch(&sid("s1"), &batch("late", 2)).persisted);
    drop(store);

    let opts = SearchOptions {
        read_only: true,
        ..SearchOptions::default()
    };
    let r = search::search(home.path(), "lorem", &opts).unwrap();
    assert_eq!(r.hits.len(), 5);
    assert_eq!(r.unindexed, 2);
    assert_eq!(r.index, IndexHealth::Behind(None));
    assert_eq!(watermark(&home), 3, "a read-only search indexes nothing");
    // Only the late rows hold "late": found by the scan alone.
    let r = search::search(home.path(), "late message", &opts).unwrap();
    assert_eq!(uids(&r), ["late-0", "late-1"]);
    assert!(
        r.hits[0].snippet.starts_with("[late] message 0: lorem ipsum"),
        "{}",
        r.hits[0].snippet
    );

    // Writable, it indexes first and scans nothing.
    let r = search::search(home.path(), "late", &SearchOptions::default()).unwrap();
    assert_eq!((r.hits.len(), r.unindexed, r.index), (2, 0, IndexHealth::Current));
    assert_eq!(watermark(&home), 5);
}
