//! Measures what one power cut costs: mount, a small flow (one SQLite
//! commit in WAL mode with `synchronous=FULL`), cut, remount and recount.
//!
//! `cargo run --release -p powerfs --example cut_cost [cycles]` (as root).

use std::time::{Duration, Instant};

use powerfs::{CutMode, PowerFs};
use rusqlite::Connection;

fn main() {
    if let Err(why) = PowerFs::available() {
        eprintln!("cut_cost: {why}");
        std::process::exit(2);
    }
    let cycles: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let mut fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).unwrap();
    let db = fs.path().join("state.db");
    let (mut flow, mut cut, mut remount) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let all = Instant::now();
    for i in 0..cycles {
        let t = Instant::now();
        let c = Connection::open(&db).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT);",
        )
        .unwrap();
        let n: u32 = c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, i, "a committed row was lost");
        c.execute("INSERT INTO t(v) VALUES ('x')", []).unwrap();
        flow += t.elapsed();
        let t = Instant::now();
        fs.cut(CutMode::DropPending).unwrap();
        drop(c);
        cut += t.elapsed();
        let t = Instant::now();
        fs.remount().unwrap();
        remount += t.elapsed();
    }
    let per = |d: Duration| d.as_secs_f64() / f64::from(cycles);
    println!(
        "cut_cost: {cycles} cycles in {:.2} s: {:.4} s per cycle (flow {:.4}, cut {:.4}, remount {:.4})",
        all.elapsed().as_secs_f64(),
        per(all.elapsed()),
        per(flow),
        per(cut),
        per(remount)
    );
}
