//! Another connection holds the write lock past the policy's patience:
//! the index cannot catch up (`locked`), and search scans the rows past its
//! watermark instead of waiting or failing.
mod common;
use common::*;
use rusqlite::Connection;
use turnsafe_host::backend::Backend;
use turnsafe_host::search::{self, IndexHealth, SearchOptions};
use turnsafe_host::store::index::IndexError;
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
