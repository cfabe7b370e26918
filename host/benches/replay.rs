//! Replay throughput without FTS, the FTS rebuild timed separately, and
//! peak memory at two file sizes (it should not grow with the file).
//!
//! Run: `cargo bench -p turnsafe-host --bench replay` (env `REPLAY_LINES`, default 200000).

use std::io::Write;
use std::time::Instant;

use turnsafe_host::replay::{ReplayOptions, replay};
use turnsafe_host::store::{SessionStore, StoreOptions};

fn max_rss_kb() -> i64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u.ru_maxrss
}

fn run(lines: usize) -> (f64, f64, i64) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    drop(SessionStore::create(home, StoreOptions::default()).unwrap());
    let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
    c.execute("UPDATE state_meta SET value = '0' WHERE key = 'fts_enabled'", [])
        .unwrap();
    drop(c);
    std::fs::create_dir(home.join("sessions")).unwrap();
    let mut f = std::io::BufWriter::new(std::fs::File::create(home.join("sessions/s1.jsonl")).unwrap());
    for i in 0..lines {
        let line = serde_json::json!({
            "v": 1, "session": "s1", "uid": format!("u{i}"), "seq": i + 1, "batch": "b", "cause": "disk",
            "at": "2026-11-30T00:00:00.000Z",
            "message": {"role": "user", "content": format!("message {i} {}", "x".repeat(160)), "uid": format!("u{i}")},
        });
        writeln!(f, "{line}").unwrap();
    }
    drop(f);
    let t = Instant::now();
    let r = replay(home, &ReplayOptions::default()).unwrap();
    let replay_s = t.elapsed().as_secs_f64();
    assert_eq!(r[0].replayed as usize, lines);
    let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
    let t = Instant::now();
    c.execute_batch("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
        .unwrap();
    let rebuild_s = t.elapsed().as_secs_f64();
    (replay_s, rebuild_s, max_rss_kb())
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`:
    // build them there, but only measure under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n: usize = std::env::var("REPLAY_LINES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    for lines in [n / 4, n] {
        let (replay_s, rebuild_s, rss) = run(lines);
        println!(
            "replay {lines:>8} lines: {:>8.3} s, {:>9.0} msg/s without FTS; FTS rebuild {:.3} s; peak RSS so far {} MiB",
            replay_s,
            lines as f64 / replay_s,
            rebuild_s,
            rss / 1024
        );
    }
}
