//! Search never misses a committed message. The index catches up after
//! commits; when it cannot be written (a read-only handle, a lock held past
//! the policy's patience, a full database) the rows past its watermark are
//! scanned with `LIKE` and counted as `unindexed`. A delete keeps the
//! watermark true, so a reused id is never taken for indexed.
mod common;
use std::time::Duration;

use common::*;
use rusqlite::Connection;
use turnsafe_host::search::{self, IndexHealth, SearchOptions};
use turnsafe_host::store::index::IndexError;
use turnsafe_host::store::{StoreOptions, configure};
use turnsafe_policy::Cause;

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

/// A writer's connection on the home, configured as the store's is.
fn writer(home: &Home) -> Connection {
    let c = Connection::open(home.db()).unwrap();
    configure(
        &c,
        &StoreOptions {
            busy_timeout: Duration::from_millis(10),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    c
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

#[test]
fn a_lock_held_past_patience_leaves_rows_to_the_scan() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("held", 4)).persisted);
    drop(store);
    // Another connection holds the write lock for longer than the policy's patience.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let db = home.db();
    let holder = std::thread::spawn(move || {
        let c = Connection::open(db).unwrap();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        ready_tx.send(()).unwrap();
        let _ = rx.recv();
        c.execute_batch("COMMIT").unwrap();
    });
    ready_rx.recv().unwrap();
    let r = search::search(home.path(), "held", &SearchOptions::default()).unwrap();
    tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(r.hits.len(), 4);
    assert_eq!(r.unindexed, 4);
    assert_eq!(r.index, IndexHealth::Behind(Some(Cause::Locked)));
    assert!(matches!(
        r.catch_up,
        Err(IndexError::CannotWrite {
            cause: Cause::Locked,
            ..
        })
    ));
    assert_eq!(watermark(&home), 0);
}

#[test]
fn a_full_database_leaves_rows_to_the_scan() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("full", 120)).persisted);
    drop(store);
    let c = writer(&home);
    // SQLITE_FULL for any page the index would add.
    let pages: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    c.pragma_update(None, "max_page_count", pages).unwrap();
    let r = search::search_in(&c, true, "full", &SearchOptions::default()).unwrap();
    assert!(
        matches!(
            r.catch_up,
            Err(IndexError::CannotWrite {
                cause: Cause::DiskFull,
                ..
            })
        ),
        "{:?}",
        r.catch_up
    );
    assert_eq!((r.hits.len(), r.unindexed), (20, 120));
    assert_eq!(r.index, IndexHealth::Behind(Some(Cause::DiskFull)));
    let limited = SearchOptions {
        limit: 500,
        ..SearchOptions::default()
    };
    assert_eq!(search::search_in(&c, true, "full", &limited).unwrap().hits.len(), 120);
    assert_eq!(watermark(&home), 0);
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

#[test]
fn every_committed_message_is_found_whatever_the_watermark() {
    let home = Home::new();
    let mut store = home.store();
    let mut words = Vec::new();
    for b in 0..12 {
        let msgs: Vec<_> = (0..5)
            .map(|i| {
                let word = format!("w{b}x{i}");
                words.push(word.clone());
                turnsafe_host::message::Message::new("user", &format!("{word} and filler text"))
            })
            .collect();
        assert!(
            store
                .append_batch(&sid(if b % 2 == 0 { "even" } else { "odd" }), &msgs)
                .persisted
        );
        // Index some of the way, sometimes.
        if b % 3 == 1 {
            store.catch_up_index(Some(7)).unwrap();
        }
    }
    drop(store);
    let read_only = SearchOptions {
        read_only: true,
        ..SearchOptions::default()
    };
    let unindexed = search::search(home.path(), "filler", &read_only).unwrap().unindexed;
    assert!(unindexed > 0 && unindexed < 60, "{unindexed}");
    for w in &words {
        let r = search::search(home.path(), w, &read_only).unwrap();
        assert_eq!(r.hits.len(), 1, "{w} missed");
    }
}
