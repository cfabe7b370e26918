//! SQLite in WAL mode on powerfs: with `synchronous=FULL` every committed
//! transaction survives a power cut right after its commit (1,000 commits,
//! one cut after each, cutting in every mode in turn); with
//! `synchronous=NORMAL` the model shows the last commits can be lost.

mod common;

use std::path::Path;
use std::time::Instant;

use powerfs::{CutMode, PowerFs};
use rusqlite::Connection;
use turnsafe_tests::require;

fn open(path: &Path, synchronous: &str) -> Connection {
    let c = Connection::open(path).unwrap();
    let mode: String = c.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    c.execute_batch(&format!(
        "PRAGMA synchronous={synchronous};
         CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);"
    ))
    .unwrap();
    c
}

fn count(c: &Connection) -> i64 {
    c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap()
}

fn mode(i: u64) -> CutMode {
    match i % 4 {
        0 => CutMode::DropPending,
        1 => CutMode::TornPrefix { seed: i },
        2 => CutMode::Reorder { seed: i },
        _ => CutMode::KeepPending,
    }
}

/// Runs `cycles` cycles of: mount, open, check every earlier commit is
/// there, commit one row, cut with the connection still open. Returns how
/// many cycles found a commit missing.
fn cycles(m: &mut common::Mounted, synchronous: &str, cycles: u64, modes: impl Fn(u64) -> CutMode) -> u64 {
    let db = m.at("state.db");
    let mut expected = 0;
    let mut lost = 0;
    for i in 0..cycles {
        let c = open(&db, synchronous);
        let n = count(&c);
        if n != expected {
            assert!(n < expected, "cycle {i}: {n} rows, more than the {expected} committed");
            lost += 1;
            expected = n;
        }
        c.execute("INSERT INTO t(v) VALUES (?1)", [format!("row {i}")]).unwrap();
        expected += 1;
        // The power fails with the connection open: no close, no checkpoint.
        m.cut(modes(i)).unwrap();
        drop(c);
        m.remount().unwrap();
    }
    let c = open(&db, synchronous);
    if count(&c) != expected {
        lost += 1;
    }
    lost
}

fn how_many() -> u64 {
    std::env::var("POWERFS_SQLITE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

#[test]
fn full_keeps_every_commit_across_a_thousand_cuts() {
    require!(PowerFs::available());
    let mut m = common::mount();
    let n = how_many();
    let start = Instant::now();
    let lost = cycles(&mut m, "FULL", n, mode);
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "powerfs: {n} SQLite mount/commit/cut/remount cycles in {secs:.2} s, {:.4} s per cut",
        secs / n as f64
    );
    assert_eq!(lost, 0, "synchronous=FULL lost a committed transaction");
}

#[test]
fn normal_loses_the_last_commits_and_the_model_shows_it() {
    require!(PowerFs::available());
    let mut m = common::mount();
    let lost = cycles(&mut m, "NORMAL", 20, |_| CutMode::DropPending);
    assert!(lost > 0, "synchronous=NORMAL never lost a commit under DropPending");
}
