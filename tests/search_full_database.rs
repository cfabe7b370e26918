//! The database is full (`SQLITE_FULL` through `max_page_count`): the
//! index cannot catch up (`disk_full`), and search scans the rows past its
//! watermark.
mod common;
use std::time::Duration;

use common::*;
use rusqlite::Connection;
use turnsafe_host::backend::Backend;
use turnsafe_host::search::{self, IndexHealth, SearchOptions};
use turnsafe_host::store::index::IndexError;
use turnsafe_host::store::{StoreOptions, configure};
use turnsafe_policy::Cause;

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
