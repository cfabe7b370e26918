//! A commit writes only what the contracts need: the message rows and
//! their two indexes. No full-text index page (it catches up later), no
//! lease renewal while more than half the lease is left. Pages written per
//! commit are counted as WAL frames with `sqlite3_wal_hook`.
mod common;
use std::time::Duration;

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;
use turnsafe_host::store::StoreOptions;
use turnsafe_host::walstat::WalFrames;

fn turn(b: usize) -> Vec<Message> {
    (0..10)
        .map(|i| {
            Message::new(
                if i % 2 == 0 { "user" } else { "assistant" },
                &format!("batch {b:>4} message {i} {}", "x".repeat(210)),
            )
        })
        .collect()
}

#[test]
fn a_batch_writes_a_handful_of_pages_and_none_of_the_index() {
    let home = Home::new();
    let mut store = home.store();
    let wal = WalFrames::attach(store.connection().unwrap()).unwrap();
    // Past the first batches, which create the session and the first pages.
    for b in 0..20 {
        assert!(store.append_batch(&sid("s1"), &turn(b)).persisted);
    }
    let start = wal.get();
    for b in 20..120 {
        assert!(store.append_batch(&sid("s1"), &turn(b)).persisted);
    }
    let per_commit = wal.get().per_commit_since(start);
    // About 7.3 here: the table's last leaf and its parent as the table
    // grows, the two indexes' last leaves, and page 1 as the file grows.
    // With the index written inside the commit it is about 15; with
    // incremental auto-vacuum from creation, about 9.1 (the pointer-map
    // page), which is why a new database has none until a prune frees
    // pages.
    let auto_vacuum: i64 = home.other().query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).unwrap();
    assert_eq!(auto_vacuum, 0, "a new database has no auto-vacuum");
    assert!(per_commit <= 8.5, "{per_commit:.2} WAL frames per batch");
    let indexed: i64 = home
        .other()
        .query_row("SELECT count(*) FROM messages_fts_docsize", [], |r| r.get(0))
        .unwrap();
    assert_eq!(indexed, 0, "a commit wrote to the full-text index");
}

fn lease_expiry(home: &Home) -> i64 {
    home.other()
        .query_row("SELECT lease_expires_ms FROM sessions WHERE id = 's1'", [], |r| {
            r.get(0)
        })
        .unwrap()
}

#[test]
fn the_lease_is_renewed_once_half_its_ttl_has_passed() {
    let home = Home::new();
    let mut store = home.store_with(StoreOptions {
        lease_ttl: Duration::from_millis(1600),
        ..StoreOptions::default()
    });
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let first = lease_expiry(&home);
    assert!(store.append_batch(&sid("s1"), &batch("b", 2)).persisted);
    assert_eq!(lease_expiry(&home), first, "renewed with more than half its time left");
    std::thread::sleep(Duration::from_millis(900));
    assert!(store.append_batch(&sid("s1"), &batch("c", 2)).persisted);
    let renewed = lease_expiry(&home);
    assert!(
        renewed >= first + 900,
        "not renewed past half its time: {first} -> {renewed}"
    );
    // Still fenced: another writer cannot take a lease with time left.
    let mut other = home.store_with(StoreOptions {
        holder: "other".into(),
        ..StoreOptions::default()
    });
    let out = other.append_batch(&sid("s1"), &batch("d", 1));
    assert_eq!(out.cause, Some(turnsafe_policy::Cause::TurnLease));
}
