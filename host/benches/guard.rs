//! What the probes before every commit cost, in µs per commit, on a real
//! WAL database, each timed alone in a loop of the very calls a commit
//! makes, beside an empty `BEGIN IMMEDIATE; COMMIT` on the same connection
//! for scale (`empty tx`):
//!
//! - `guard`: `Guard::check` when nothing moved (the header not read
//!   again), what almost every commit pays; `full`: every probe, as the
//!   first check after a checkpoint;
//! - `captures`: the look for unsettled captures through the watch
//!   (`captures::HoldsWatch`) when the home did not change; `listing`: the
//!   home listed and read (`captures::holds`), as on every commit before
//!   the watch;
//! - `per commit` is guard + captures, `all probes` is full + listing.
//!
//! Run: `cargo bench -p turnsafe-host --bench guard` (env `CHECKS`,
//! default 200000; `GUARD_DIRS`, a comma-separated list of folders to
//! measure in, default a temporary folder under `TMPDIR` and `/dev/shm`
//! when it exists).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use turnsafe_host::captures;
use turnsafe_host::guard::{Guard, Verdict};

fn wal_db(dir: &Path) -> (PathBuf, Connection) {
    let db = dir.join("state.db");
    let conn = Connection::open(&db).expect("open the bench database");
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA application_id = 1416983150;
         CREATE TABLE t(x); INSERT INTO t VALUES (1); PRAGMA wal_checkpoint(TRUNCATE);
         INSERT INTO t VALUES (2);",
    )
    .expect("make the bench database");
    (db, conn)
}

fn per_call(n: usize, mut f: impl FnMut()) -> Duration {
    // A warm-up, then the median of five runs of n / 5 calls.
    for _ in 0..n / 50 {
        f();
    }
    let mut runs: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..n / 5 {
                f();
            }
            started.elapsed() / (n / 5) as u32
        })
        .collect();
    runs.sort();
    runs[2]
}

fn us(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

fn measure(dir: &Path, n: usize) {
    let home = tempfile::tempdir_in(dir).expect("a home in the folder");
    let (db, conn) = wal_db(home.path());
    let mut guard = Guard::record(&db, &conn).expect("record the guard");
    let mut intact = || {
        assert_eq!(guard.check(&conn).expect("probe"), Verdict::Intact);
    };
    let steady = per_call(n, &mut intact);
    let mut guard = Guard::record(&db, &conn).expect("record the guard");
    let full = per_call(n, || {
        guard.forget_quiet();
        assert_eq!(guard.check(&conn).expect("probe"), Verdict::Intact);
    });
    let read = per_call(n, || {
        let h = captures::holds(home.path()).expect("list the home");
        assert!(h.is_empty());
    });
    // The watch trusts the home's stamp only once it is old enough.
    std::thread::sleep(turnsafe_host::stamps::racy_for(home.path()) + Duration::from_millis(100));
    let mut watch = captures::HoldsWatch::default();
    let watched = per_call(n, || {
        let h = watch.holds(home.path()).expect("look at the home");
        assert!(h.is_empty());
    });
    assert_eq!(watch.reads(), 1, "the home was read once");
    let commit = per_call(n / 10, || {
        conn.execute_batch("BEGIN IMMEDIATE; COMMIT")
            .expect("empty transaction");
    });
    println!(
        "{:<20} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>8}",
        dir.display(),
        us(steady),
        us(full),
        us(watched),
        us(read),
        us(steady + watched),
        us(full + read),
        us(commit)
    );
}

fn main() {
    let n: usize = std::env::var("CHECKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let dirs: Vec<PathBuf> = match std::env::var("GUARD_DIRS") {
        Ok(list) => list.split(',').map(PathBuf::from).collect(),
        Err(_) => {
            let mut d = vec![std::env::temp_dir()];
            if Path::new("/dev/shm").is_dir() {
                d.push(PathBuf::from("/dev/shm"));
            }
            d
        }
    };
    println!("µs per commit, median of 5 runs of {} calls each", n / 5);
    println!(
        "{:<20} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>8}",
        "folder", "guard", "full", "captures", "listing", "per commit", "all probes", "empty tx"
    );
    for dir in dirs {
        measure(&dir, n);
    }
}
