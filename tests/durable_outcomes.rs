//! `durable` says what a commit is worth across a power cut. Under
//! `synchronous=FULL` (the default) every COMMIT syncs the WAL and each
//! outcome says `durable: true`; under `synchronous=NORMAL` a COMMIT
//! returns before its sync, and each outcome says `durable: false`.
//!
//! Proven on powerfs, which forgets what was not synced: under NORMAL a cut
//! loses acknowledged messages, and every one of them was in an outcome
//! marked `durable: false`; under FULL a cut loses nothing. On PostgreSQL,
//! `synchronous_commit=off` is told the same way.
mod common;
use std::path::Path;

use common::*;
use powerfs::{CutMode, PowerFs};
use turnsafe_host::backend::Backend;
use turnsafe_host::store::{SessionStore, StoreOptions, Synchronous};

/// Stored uids, counted with our own read-only connection.
fn stored(home: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open_with_flags(home.join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open state.db read-only");
    let mut s = c.prepare("SELECT uid FROM messages").expect("prepare");
    s.query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect::<Result<Vec<String>, _>>())
        .expect("read uids")
}

/// Append `batches` batches of 2 on a mount, cut with the store still
/// open, remount; the acknowledged uids with their `durable` flag, and the
/// uids that survived.
fn append_then_cut(synchronous: Synchronous, batches: usize, mode: CutMode) -> (Vec<(String, bool)>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).expect("mount powerfs");
    let home = fs.path().to_path_buf();
    let mut acked = Vec::new();
    {
        let mut store = SessionStore::new(
            &home,
            StoreOptions {
                synchronous,
                ..StoreOptions::default()
            },
        );
        for b in 0..batches {
            let out = store.append_batch(&sid("s1"), &batch(&format!("b{b}"), 2));
            assert!(out.persisted, "{}", out.to_value());
            assert_eq!(out.to_value()["durable"], serde_json::json!(out.durable));
            acked.extend(out.uids.iter().map(|u| (u.clone(), out.durable)));
        }
        // The power goes while the store is open: no close, no checkpoint.
        fs.cut(mode).expect("cut");
        drop(store);
    }
    fs.remount().expect("remount");
    let survived = stored(&home);
    drop(fs);
    (acked, survived)
}

#[test]
fn under_normal_every_message_a_cut_loses_was_marked_not_durable() {
    turnsafe_tests::require!(PowerFs::available());
    let (acked, survived) = append_then_cut(Synchronous::Normal, 20, CutMode::DropPending);
    assert!(
        acked.iter().all(|(_, durable)| !durable),
        "NORMAL commits are not durable"
    );
    let lost: Vec<&(String, bool)> = acked.iter().filter(|(u, _)| !survived.contains(u)).collect();
    // The model tells the two apart: under NORMAL the cut does take
    // acknowledged messages, so the flag is not decoration.
    assert!(
        !lost.is_empty(),
        "a cut under NORMAL lost nothing: the test proves nothing"
    );
    assert!(
        lost.iter().all(|(_, durable)| !durable),
        "a message marked durable was lost: {lost:?}"
    );
}

#[test]
fn under_full_nothing_acknowledged_is_lost_and_every_outcome_is_durable() {
    turnsafe_tests::require!(PowerFs::available());
    for mode in [
        CutMode::DropPending,
        CutMode::TornPrefix { seed: 7 },
        CutMode::Reorder { seed: 11 },
    ] {
        let (acked, survived) = append_then_cut(Synchronous::Full, 20, mode);
        assert!(acked.iter().all(|(_, durable)| *durable), "FULL commits are durable");
        let lost: Vec<&String> = acked.iter().map(|(u, _)| u).filter(|u| !survived.contains(u)).collect();
        assert!(lost.is_empty(), "{mode:?}: durable messages lost: {lost:?}");
    }
}

/// PostgreSQL with `synchronous_commit=off` (set on the database, as an
/// operator would) is reported not durable; the default is durable.
#[test]
fn postgres_synchronous_commit_off_is_not_durable() {
    let server = pg_or_skip!();
    let db = server.create_db("durability");
    let home = Home::new();
    {
        let mut store = pg::store(&server.url(&db), home.path());
        let out = store.append_batch(&sid("s1"), &batch("on", 2));
        assert!(out.persisted && out.durable, "{}", out.to_value());
    }
    server
        .admin("postgres")
        .batch_execute(&format!("ALTER DATABASE {db} SET synchronous_commit = off"))
        .expect("set synchronous_commit off");
    let mut store = pg::store(&server.url(&db), home.path());
    let out = store.append_batch(&sid("s1"), &batch("off", 2));
    assert!(out.persisted, "{}", out.to_value());
    assert!(
        !out.durable,
        "synchronous_commit=off must not be durable: {}",
        out.to_value()
    );
    assert_eq!(out.to_value()["durable"], false);
}

/// A home another program made, its entry in the parent never synced: the
/// store's first open makes it durable before any commit is acknowledged,
/// so a power cut after the commits keeps them (without it the cut takes
/// the whole home, and every acknowledged message with it).
#[test]
fn a_home_made_without_a_sync_keeps_what_was_committed_in_it() {
    turnsafe_tests::require!(PowerFs::available());
    let dir = tempfile::tempdir().unwrap();
    let mut fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).expect("mount powerfs");
    let home = fs.path().join("agent-home");
    std::fs::create_dir(&home).expect("mkdir, and no fsync of its parent");
    let mut acked = Vec::new();
    {
        let mut store = SessionStore::new(&home, StoreOptions::default());
        for b in 0..3 {
            let out = store.append_batch(&sid("s1"), &batch(&format!("h{b}"), 2));
            assert!(out.persisted && out.durable, "{}", out.to_value());
            acked.extend(out.uids.clone());
        }
        fs.cut(CutMode::DropPending).expect("cut");
        drop(store);
    }
    fs.remount().expect("remount");
    assert!(home.join("state.db").is_file(), "the power cut took the home");
    let survived = stored(&home);
    let lost: Vec<&String> = acked.iter().filter(|u| !survived.contains(u)).collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
}
