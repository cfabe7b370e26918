//! Flush cost against the floor: a bare rusqlite insert of the same rows,
//! same pragmas (WAL, synchronous=FULL) and the same FTS5 index and
//! trigger, in the same run. 10-message batches of about 200 B.
//!
//! Run: `cargo bench -p turnsafe-host --bench flush` (env `BATCHES`, default 300).

use std::time::{Duration, Instant};

use rusqlite::{Connection, params};
use turnsafe_host::message::Message;
use turnsafe_host::store::{SessionId, SessionStore, StoreOptions};

fn batch(b: usize) -> Vec<Message> {
    (0..10)
        .map(|i| {
            let content = format!("batch {b} message {i} {}", "x".repeat(180));
            Message::new(if i % 2 == 0 { "user" } else { "assistant" }, &content).with_uid(&format!("{b}-{i}"))
        })
        .collect()
}

fn bare(dir: &std::path::Path, batches: usize) -> Vec<Duration> {
    let c = Connection::open(dir.join("bare.db")).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;
         CREATE TABLE sessions(id TEXT PRIMARY KEY) WITHOUT ROWID;
         CREATE TABLE messages(id INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), uid TEXT NOT NULL,
             seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, UNIQUE(session_id, uid));
         CREATE INDEX messages_by_seq ON messages(session_id, seq);
         CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id');
         CREATE TRIGGER t AFTER INSERT ON messages BEGIN INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END;
         INSERT INTO sessions VALUES ('s1');",
    )
    .unwrap();
    let mut times = Vec::with_capacity(batches);
    let mut seq = 0i64;
    for b in 0..batches {
        let msgs = batch(b);
        let t = Instant::now();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        {
            let mut ins = c
                .prepare_cached(
                    "INSERT INTO messages(session_id, uid, seq, role, content) VALUES ('s1', ?1, ?2, ?3, ?4)",
                )
                .unwrap();
            for m in &msgs {
                seq += 1;
                ins.execute(params![m.uid, seq, m.role, m.content.as_str()]).unwrap();
            }
        }
        c.execute_batch("COMMIT").unwrap();
        times.push(t.elapsed());
    }
    times
}

fn turnsafe(dir: &std::path::Path, batches: usize, guard: bool) -> Vec<Duration> {
    let home = dir.join(if guard { "home" } else { "home-unguarded" });
    let mut store = SessionStore::create(
        &home,
        StoreOptions {
            guard,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let s = SessionId::new("s1").unwrap();
    let mut times = Vec::with_capacity(batches);
    for b in 0..batches {
        let msgs = batch(b);
        let t = Instant::now();
        let out = store.append_batch(&s, &msgs);
        times.push(t.elapsed());
        assert!(out.persisted);
    }
    times
}

fn stats(name: &str, mut t: Vec<Duration>) -> f64 {
    t.sort();
    let total: Duration = t.iter().sum();
    let mean = total.as_secs_f64() / t.len() as f64;
    let p50 = t[t.len() / 2].as_secs_f64();
    let p99 = t[(t.len() * 99) / 100].as_secs_f64();
    println!(
        "{name:<10} batches {:>5}  mean {:>8.3} ms  p50 {:>8.3} ms  p99 {:>8.3} ms  {:>9.0} msg/s",
        t.len(),
        mean * 1e3,
        p50 * 1e3,
        p99 * 1e3,
        10.0 / mean
    );
    p50
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`:
    // build them there, but only measure under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let batches: usize = std::env::var("BATCHES")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    // Interleave rounds so both see the same machine conditions.
    let (mut bare_t, mut ts_t, mut nog_t) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let d = dir.path().join(format!("r{round}"));
        std::fs::create_dir(&d).unwrap();
        bare_t.extend(bare(&d, batches / 3));
        ts_t.extend(turnsafe(&d, batches / 3, true));
        nog_t.extend(turnsafe(&d, batches / 3, false));
    }
    println!("flush of 10 x ~200 B messages, WAL, synchronous=FULL, FTS5 on");
    let floor = stats("bare", bare_t);
    let ours = stats("turnsafe", ts_t);
    let unguarded = stats("no guard", nog_t);
    println!("ratio turnsafe/bare (p50): {:.3} (target <= 1.25)", ours / floor);
    println!("guard cost: flush with guard / without (p50): {:.3}", ours / unguarded);
}
