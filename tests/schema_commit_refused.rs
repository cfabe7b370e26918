//! A new `state.db` is still in rollback mode while its schema is created,
//! and committing there waits for every reader of the file to finish. When
//! another writer opening the same new home is reading it, the creating
//! COMMIT is refused with SQLITE_BUSY, and SQLite leaves that transaction
//! open. Left open, it holds the file's locks and keeps every other writer
//! out, and the next try on the same connection finds itself inside a
//! transaction (where the switch to WAL is silently refused, which read as
//! `disk`). The migration rolls it back; the open waits the reader out.
mod common;
use std::time::Duration;

use common::*;
use rusqlite::Connection;
use turnsafe_host::backend::Backend;
use turnsafe_host::store::{SCHEMA_VERSION, StoreOptions, schema};

/// A connection on the new, empty file that holds a read (SHARED) lock.
fn reader(home: &Home) -> Connection {
    let r = Connection::open(home.db()).unwrap();
    r.execute_batch("BEGIN").unwrap();
    let _: i64 = r
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .unwrap();
    r
}

#[test]
fn a_refused_commit_leaves_no_transaction_open() {
    let home = Home::new();
    let creator = Connection::open(home.db()).unwrap();
    creator.busy_timeout(Duration::from_millis(10)).unwrap();
    let r = reader(&home);
    let e = schema::migrate(&creator, 7).unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy), "{e}");
    assert!(creator.is_autocommit(), "the refused transaction was rolled back");
    // Nothing was created, and the file's locks are free again: another
    // connection can write at once.
    let other = Connection::open(home.db()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE; ROLLBACK").unwrap();
    r.execute_batch("COMMIT").unwrap();
    let version: i64 = creator.query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap();
    assert_eq!(version, 0);
    schema::migrate(&creator, 7).unwrap();
    let version: i64 = creator.query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

#[test]
fn a_store_opening_a_new_home_waits_out_a_brief_reader() {
    let home = Home::new();
    std::fs::File::create(home.db()).unwrap();
    let r = reader(&home);
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        r.execute_batch("COMMIT").unwrap();
    });
    let mut store = home.store_with(StoreOptions::default());
    release.join().unwrap();
    assert!(store.open_error().is_none(), "{:?}", store.open_error());
    let out = store.append_batch(&sid("s1"), &batch("a", 2));
    assert!(out.persisted, "{}", out.to_value());
    assert_eq!((out.cause, out.attempts), (None, 1));
    assert_eq!(home.rows("s1").len(), 2);
}
