//! Taking the write lock while other writers share the file.
//!
//! SQLite's write lock has no queue. A writer that finds it taken polls
//! (SQLite's busy handler sleeps between tries) and fails with
//! `SQLITE_BUSY` once its busy timeout runs out. With several processes
//! on one home the lock is taken most of the time, but it changes hands at
//! every commit: a writer that waits is not facing a stuck holder, only a
//! line that moves.
//!
//! So a flush's lock wait watches the line move. Each try of `BEGIN
//! IMMEDIATE` polls for one [`SLICE`]; when it comes back busy, the wait
//! reads `PRAGMA data_version`, which changes when any other connection
//! has committed. A change is progress: the lock passed between writers,
//! and the wait goes on without the policy hearing of it. Only when no
//! other writer has committed for the whole stall window
//! ([`super::StoreOptions::lock_stall`]) does the attempt fail as busy, and
//! the policy's retry plan takes over.
//!
//! The policy's patience is then spent on time without progress only: the
//! failure it sees carries, as `elapsed_ms`, the milliseconds since the
//! later of the flush's start and the last commit by another writer that
//! this flush saw ([`LockWatch::stalled_ms`]). A lock held with no commit
//! (a stuck or slow holder, a long checkpoint) is retried and then
//! diverted on the policy's plan as before; a lock that merely turns over
//! never costs a batch.

use std::time::{Duration, Instant};

use rusqlite::Connection;

/// How long one try polls with SQLite's busy handler before the wait
/// looks for progress. Long enough for the handler to back off from 1 ms
/// to 25 ms between polls: fifteen writers polling every few milliseconds
/// take the CPU from the one holding the lock, and on two busy cores a
/// 16-writer run then took seven times as long.
pub(super) const SLICE: Duration = Duration::from_millis(100);

/// What a handle saw of the write lock: the database's data version at
/// its last look while waiting, and when it last saw another writer
/// commit. Kept across the attempts of a flush (and the batches of a
/// group), so an attempt after the policy's wait knows whether the lock
/// changed hands meanwhile.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LockWatch {
    version: Option<i64>,
    progress_at: Option<Instant>,
}

impl LockWatch {
    pub(super) const fn new() -> LockWatch {
        LockWatch {
            version: None,
            progress_at: None,
        }
    }

    /// When the wait of something that started at `since` last saw
    /// progress: the later of its start and the last commit by another
    /// writer.
    fn clock(&self, since: Instant) -> Instant {
        self.progress_at.map_or(since, |p| p.max(since))
    }

    /// Milliseconds without progress for something that started waiting
    /// at `since`: what the policy's patience is spent on.
    pub(super) fn stalled_ms(&self, since: Instant) -> u64 {
        self.clock(since).elapsed().as_millis() as u64
    }

    /// Read the data version; a change since the last look is progress.
    /// A version that cannot be read (the read itself busy, an I/O error)
    /// proves nothing, and counts as no progress.
    fn look(&mut self, conn: &Connection) {
        let read = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)));
        if let Ok(v) = read {
            if self.version.is_some_and(|seen| seen != v) {
                self.progress_at = Some(Instant::now());
            }
            self.version = Some(v);
        }
    }
}

/// `BEGIN IMMEDIATE` for something waiting since `since`, going on as
/// long as other writers keep committing, and failing busy once none has
/// for `stall`. Any other error ends the wait at once. The first try polls
/// for the connection's own busy timeout (`restore`), as a flush always
/// did; the wait polls in slices, and sets the connection's busy timeout
/// back to `restore` after. Once the lock is taken the watch forgets the
/// data version it saw: the next wait starts from its own first look.
pub(super) fn begin_immediate(
    conn: &Connection,
    watch: &mut LockWatch,
    since: Instant,
    stall: Duration,
    restore: Duration,
) -> rusqlite::Result<()> {
    let begin = || conn.prepare_cached("BEGIN IMMEDIATE").and_then(|mut s| s.execute([]));
    let began = match begin() {
        Err(e) if is_busy(&e) => {
            conn.busy_timeout(SLICE.min(stall))?;
            let waited = wait_while_busy(conn, watch, since, stall, Pace::Sliced, begin);
            conn.busy_timeout(restore)?;
            waited
        }
        first => first,
    };
    if began.is_ok() {
        watch.version = None;
    }
    began.map(|_| ())
}

/// Run `step` (whose statements poll for the connection's busy timeout)
/// again while it fails busy and another writer committed within the last
/// `stall` (or `since` is that recent).
pub(super) fn wait_while_busy<T>(
    conn: &Connection,
    watch: &mut LockWatch,
    since: Instant,
    stall: Duration,
    pace: Pace,
    mut step: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let mut tries = 0u32;
    loop {
        match step() {
            Err(e) if is_busy(&e) => {
                watch.look(conn);
                if watch.clock(since).elapsed() >= stall {
                    return Err(e);
                }
                tries = tries.saturating_add(1);
                std::thread::sleep(pace.pause(tries));
            }
            done => return done,
        }
    }
}

/// How a wait spaces its tries.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pace {
    /// Each try already polls for a whole [`SLICE`]: go again at once.
    Sliced,
    /// Tries that may be refused at once (taking the file's locks in
    /// rollback mode, where a lock upgrade that would deadlock is refused
    /// without a wait): a jittered pause that doubles from 1 ms to 32 ms,
    /// so that writers opening together spread out instead of refusing
    /// each other in step.
    Backoff,
}

impl Pace {
    fn pause(self, tries: u32) -> Duration {
        match self {
            Pace::Sliced => Duration::ZERO,
            Pace::Backoff => {
                let ceiling_us = 1000u64 << tries.clamp(1, 6).saturating_sub(1);
                let half_us = ceiling_us / 2;
                Duration::from_micros(half_us + crate::ids::seed() % (ceiling_us - half_us + 1))
            }
        }
    }
}

/// `SQLITE_BUSY`, with any extended code.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DatabaseBusy)
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Duration = Duration::from_millis(10);

    fn wal(path: &std::path::Path) -> Connection {
        let c = Connection::open(path).unwrap();
        c.busy_timeout(Duration::from_secs(5)).unwrap();
        c.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(())).unwrap();
        c.execute_batch("CREATE TABLE IF NOT EXISTS t(x)").unwrap();
        c.busy_timeout(QUICK).unwrap();
        c
    }

    /// One run: another connection holds the lock for 1.5 s, committing
    /// every 20 ms and taking it again at once. Returns how long
    /// `begin_immediate` took to get the lock and how long the watch had
    /// seen no progress at that moment (both read before anything else
    /// runs: a later reading would count the holder's remaining time).
    fn wait_out_a_busy_line(stall: Duration) -> (Duration, u64) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let me = wal(&db);
        let (tx, rx) = std::sync::mpsc::channel();
        let others = std::thread::spawn({
            let db = db.clone();
            move || {
                let c = wal(&db);
                // The holder may lose the lock to `me` in the instant
                // between its COMMIT and its BEGIN: it waits, not fails.
                c.busy_timeout(Duration::from_secs(5)).unwrap();
                c.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (0)").unwrap();
                tx.send(()).unwrap();
                for i in 1..=75 {
                    std::thread::sleep(Duration::from_millis(20));
                    c.execute_batch(&format!("INSERT INTO t VALUES ({i}); COMMIT; BEGIN IMMEDIATE"))
                        .unwrap();
                }
                c.execute_batch("COMMIT").unwrap();
            }
        });
        rx.recv().unwrap();
        let started = Instant::now();
        let mut watch = LockWatch::new();
        begin_immediate(&me, &mut watch, started, stall, QUICK).unwrap();
        let (got, stalled) = (started.elapsed(), watch.stalled_ms(started));
        me.execute_batch("COMMIT").unwrap();
        others.join().unwrap();
        (got, stalled)
    }

    #[test]
    fn a_lock_that_keeps_changing_hands_is_waited_out() {
        let stall = Duration::from_millis(300);
        // A run proves the point only if the lock stayed taken for longer
        // than the stall window; `me` may win the gap between the holder's
        // COMMIT and BEGIN earlier on a busy machine, so a short run is
        // tried again, and three short runs fail the test.
        let mut runs = Vec::new();
        for _ in 0..3 {
            let (got, stalled) = wait_out_a_busy_line(stall);
            runs.push((got, stalled));
            if got >= 2 * stall {
                assert!(
                    stalled < got.as_millis() as u64 / 2 && stalled < 1000,
                    "progress restarted the clock: got the lock after {got:?}, {stalled} ms without progress"
                );
                return;
            }
        }
        panic!("never waited past the stall window: {runs:?}");
    }

    #[test]
    fn an_open_backs_off_from_one_to_thirty_two_milliseconds_with_jitter() {
        for tries in 1..10u32 {
            let ceiling = 1u64 << (tries.min(6) - 1);
            let pauses: std::collections::BTreeSet<u64> = (0..200)
                .map(|_| Pace::Backoff.pause(tries).as_micros() as u64)
                .collect();
            let (lo, hi) = (*pauses.first().unwrap(), *pauses.last().unwrap());
            assert!(
                lo >= 1000 * ceiling / 2 && hi <= 1000 * ceiling,
                "try {tries}: {lo}..{hi} µs"
            );
            assert!(pauses.len() > 1, "try {tries}: no jitter");
        }
        assert_eq!(Pace::Sliced.pause(3), Duration::ZERO);
    }

    #[test]
    fn a_lock_held_without_commits_fails_busy_after_the_stall_window() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let me = wal(&db);
        let holder = wal(&db);
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let started = Instant::now();
        let mut watch = LockWatch::new();
        let stall = Duration::from_millis(300);
        let e = begin_immediate(&me, &mut watch, started, stall, QUICK).unwrap_err();
        assert!(is_busy(&e), "{e}");
        assert!(started.elapsed() >= stall, "{:?}", started.elapsed());
        assert!(watch.stalled_ms(started) >= 300);
        // The next try, with no progress in between, fails after one slice.
        let again = Instant::now();
        assert!(begin_immediate(&me, &mut watch, started, stall, QUICK).is_err());
        assert!(again.elapsed() < stall, "{:?}", again.elapsed());
        holder.execute_batch("COMMIT").unwrap();
        begin_immediate(&me, &mut watch, started, stall, QUICK).unwrap();
        me.execute_batch("ROLLBACK").unwrap();
    }
}
