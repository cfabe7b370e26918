//! Flush cost against the floor, in process: a bare rusqlite insert of the
//! same rows into the same tables, same pragmas (WAL, synchronous=FULL),
//! in the same run. 10-message batches of about 230 B. Besides msg/s and
//! latency it prints WAL frames per batch (pages written per commit),
//! counted with `sqlite3_wal_hook`.
//!
//! Run: `cargo bench -p turnsafe-host --bench flush` (env `BATCHES`, default 600).

use std::time::{Duration, Instant};

use rusqlite::{Connection, params};
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;
use turnsafe_host::store::{SessionId, SessionStore, StoreOptions, schema};
use turnsafe_host::walstat::WalFrames;

/// Ten messages of about 230 B, without uids: both sides mint them.
fn batch(b: usize) -> Vec<Message> {
    (0..10)
        .map(|i| {
            let content = format!("batch {b:>4} message {i} {}", "x".repeat(210));
            Message::new(if i % 2 == 0 { "user" } else { "assistant" }, &content)
        })
        .collect()
}

struct Run {
    times: Vec<Duration>,
    frames: f64,
}

fn bare(dir: &std::path::Path, batches: usize) -> Run {
    let c = Connection::open(dir.join("bare.db")).unwrap();
    c.pragma_update(None, "foreign_keys", "ON").unwrap();
    schema::migrate(&c, 1).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
         INSERT INTO sessions(id, created_ms) VALUES ('s1', 0);
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
    let wal = WalFrames::attach(&c).unwrap();
    let mut times = Vec::with_capacity(batches);
    let mut seq = 0i64;
    for b in 0..batches {
        let msgs = batch(b);
        let t = Instant::now();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        {
            let mut ins = c
                .prepare_cached(
                    "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                     VALUES ('s1', ?1, ?2, ?3, ?4, ?5, 0)",
                )
                .unwrap();
            for m in &msgs {
                seq += 1;
                ins.execute(params![
                    turnsafe_host::ids::mint(),
                    seq,
                    m.role(),
                    m.content_text(),
                    m.item_text()
                ])
                .unwrap();
            }
        }
        c.execute_batch("COMMIT").unwrap();
        times.push(t.elapsed());
    }
    let f = wal.get();
    Run {
        times,
        frames: f.frames as f64 / f.commits.max(1) as f64,
    }
}

fn turnsafe(dir: &std::path::Path, batches: usize, guard: bool) -> Run {
    let home = dir.join(if guard { "home" } else { "home-unguarded" });
    let mut store = SessionStore::create(
        &home,
        StoreOptions {
            guard,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let wal = WalFrames::attach(store.connection().unwrap()).unwrap();
    let s = SessionId::new("s1").unwrap();
    let mut times = Vec::with_capacity(batches);
    for b in 0..batches {
        let msgs = batch(b);
        let t = Instant::now();
        let out = store.append_batch(&s, &msgs);
        times.push(t.elapsed());
        assert!(out.persisted);
    }
    let f = wal.get();
    Run {
        times,
        frames: f.frames as f64 / f.commits.max(1) as f64,
    }
}

/// Prints one line; returns (msg/s, p50).
fn stats(name: &str, runs: &[Run]) -> (f64, f64) {
    let mut t: Vec<Duration> = runs.iter().flat_map(|r| r.times.iter().copied()).collect();
    let frames = runs.iter().map(|r| r.frames).sum::<f64>() / runs.len() as f64;
    t.sort();
    let total: Duration = t.iter().sum();
    let mean = total.as_secs_f64() / t.len() as f64;
    let p50 = t[t.len() / 2].as_secs_f64();
    let p99 = t[(t.len() * 99) / 100].as_secs_f64();
    println!(
        "{name:<10} batches {:>5}  {:>9.0} msg/s  p50 {:>7.3} ms  p99 {:>7.3} ms  WAL frames/batch {frames:>5.2}",
        t.len(),
        10.0 / mean,
        p50 * 1e3,
        p99 * 1e3,
    );
    (10.0 / mean, p50)
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
        .unwrap_or(600);
    let dir = tempfile::tempdir().unwrap();
    // Interleave rounds so all three see the same machine conditions.
    let (mut bare_r, mut ts_r, mut nog_r) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let d = dir.path().join(format!("r{round}"));
        std::fs::create_dir(&d).unwrap();
        bare_r.push(bare(&d, batches / 3));
        ts_r.push(turnsafe(&d, batches / 3, true));
        nog_r.push(turnsafe(&d, batches / 3, false));
    }
    println!("flush of 10 x ~230 B messages, WAL, synchronous=FULL, in process");
    let (floor, floor_p50) = stats("bare", &bare_r);
    let (ours, ours_p50) = stats("turnsafe", &ts_r);
    let (_, unguarded_p50) = stats("no guard", &nog_r);
    println!(
        "ratio turnsafe/bare: {:.3} in msg/s, {:.3} in p50 latency (target: latency <= 1.25)",
        ours / floor,
        ours_p50 / floor_p50
    );
    println!(
        "guard cost: flush with guard / without (p50): {:.3}",
        ours_p50 / unguarded_p50
    );
}
