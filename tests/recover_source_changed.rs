//! Recovery never opens the source as a database: it copies its files, and
//! aborts when the source changed while being copied (here, a live writer
//! appending to a large WAL).
//!
//! Watched, not assumed:
//! - the counting VFS is made SQLite's default in this test binary, so any
//!   SQLite open of the source's main file, WAL or journal, by any path or
//!   VFS name, is counted; each copy must leave those counts unchanged;
//! - every copy that is not refused is opened and checked: `PRAGMA
//!   integrity_check` says `ok`, it holds every row committed before the
//!   copy began, and its rows are exactly the source's rows up to its last
//!   one (the writer only appends), compared at a quiescent point, through
//!   the writer's own connection (no new open of the source);
//! - a copy taken while the writer is paused mid-run, its WAL in place,
//!   holds exactly what the source holds.
mod common;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use common::*;
use rusqlite::Connection;
use sha2::Digest;
use turnsafe_host::faultvfs::{Counter, Counts};
use turnsafe_host::recover::{self, RecoverError};

/// Rows of `messages` with `id <= upto`, and every row of `sessions`: how
/// many messages, the last message id (0 with none), and a sha256 over
/// every column of every row, in id order.
fn digest(c: &Connection, upto: i64) -> (i64, i64, String) {
    let mut h = sha2::Sha256::new();
    let (mut count, mut last) = (0, 0);
    let mut s = c
        .prepare(
            "SELECT id, session_id, uid, seq, role, content, item, created_ms FROM messages \
             WHERE id <= ?1 ORDER BY id",
        )
        .unwrap();
    let mut rows = s.query([upto]).unwrap();
    while let Some(r) = rows.next().unwrap() {
        let id: i64 = r.get(0).unwrap();
        for i in 0..8 {
            let v: rusqlite::types::Value = r.get(i).unwrap();
            h.update(format!("{v:?}\u{1f}").as_bytes());
        }
        h.update(b"\n");
        (count, last) = (count + 1, id);
    }
    let mut s = c
        .prepare("SELECT id, created_ms, lease_token, lease_holder, lease_expires_ms FROM sessions ORDER BY id")
        .unwrap();
    let mut rows = s.query([]).unwrap();
    while let Some(r) = rows.next().unwrap() {
        for i in 0..5 {
            let v: rusqlite::types::Value = r.get(i).unwrap();
            h.update(format!("session {v:?}\u{1f}").as_bytes());
        }
    }
    (count, last, hex::encode(h.finalize()))
}

fn max_id(c: &Connection) -> i64 {
    c.query_row("SELECT COALESCE(MAX(id), 0) FROM messages", [], |r| r.get(0))
        .unwrap()
}

/// Copy the source, watching SQLite's opens of it. `Ok` holds the copy's
/// folder; the copy was made without SQLite opening any source file.
fn copy(home: &Home, watch: &Counter) -> Result<tempfile::TempDir, RecoverError> {
    let work = tempfile::tempdir().unwrap();
    let before = watch.counts();
    let copied = recover::copy_source(&home.db(), work.path());
    let after = watch.counts();
    assert_eq!(
        after, before,
        "the copy opened the source through SQLite: {before:?} -> {after:?}"
    );
    copied.map(|_| work)
}

/// Open the copy and check it: integrity, and (count, last id, digest).
fn check_copy(work: &tempfile::TempDir) -> (i64, i64, String) {
    let c = Connection::open(work.path().join("state.db")).unwrap();
    let check: Vec<String> = c
        .prepare("PRAGMA integrity_check")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(check, ["ok"], "integrity_check of an accepted copy");
    digest(&c, i64::MAX)
}

fn pause(writer: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    writer.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_source_that_changes_during_the_copy_is_refused() {
    let home = Home::new();
    drop(home.store());
    let c = home.other();
    // From here on, every SQLite open in this process goes through the
    // counting VFS (the writer's connection above was opened before, and
    // opens nothing more).
    let watch = watch_opens(&home);
    c.execute_batch("PRAGMA wal_autocheckpoint = 0; INSERT INTO sessions(id, created_ms) VALUES ('s1', 0);")
        .unwrap();
    // A WAL of some megabytes, so copying it takes a while.
    c.execute_batch("BEGIN").unwrap();
    for i in 0..4000 {
        c.execute(
            "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
             VALUES ('s1', ?1, ?1, 'user', ?2, json_object('role', 'user', 'content', ?2), 0)",
            rusqlite::params![i, "y".repeat(2000)],
        )
        .unwrap();
    }
    c.execute_batch("COMMIT").unwrap();
    let conn = Arc::new(Mutex::new(c));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, conn) = (stop.clone(), conn.clone());
        std::thread::spawn(move || {
            let mut i = 100_000;
            let start = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                // Commits for 20 ms, then a quiet 80 ms: some copies race
                // a commit (refused), others fall in a quiet spell (checked).
                if start.elapsed().as_millis() % 100 >= 20 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                // One autocommit insert at a time: holding the lock pauses
                // the writer between commits.
                pause(&conn)
                    .execute(
                        "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                         VALUES ('s1', ?1, ?1, 'user', 'z', '{\"content\":\"z\",\"role\":\"user\"}', 0)",
                        [i],
                    )
                    .unwrap();
                i += 1;
            }
        })
    };
    // Some commits of the writer first.
    while max_id(&pause(&conn)) < 4050 {
        std::thread::yield_now();
    }

    // Paused mid-run (the writer's connection open, its WAL in place): the
    // copy goes through and holds exactly what the source holds.
    {
        let source = pause(&conn);
        let work = copy(&home, &watch).expect("a copy of a source that does not change");
        let expected = digest(&source, i64::MAX);
        assert_eq!(check_copy(&work), expected, "a copy at a quiescent point");
        assert!(expected.0 >= 4050, "{expected:?}");
    }

    // Racing the writer: each copy is refused, or checked later.
    let mut refused = 0;
    let mut accepted = Vec::new();
    for _ in 0..200 {
        let committed = max_id(&pause(&conn));
        match copy(&home, &watch) {
            Err(RecoverError::Changed(path)) => {
                refused += 1;
                assert!(path.starts_with(home.path()));
            }
            Ok(work) => {
                let (count, last, sha) = check_copy(&work);
                assert!(
                    last >= committed,
                    "a copy lacks rows committed before it began: it ends at id {last}, {committed} was committed"
                );
                accepted.push((count, last, sha));
            }
            Err(e) => panic!("unexpected: {e}"),
        }
        if refused >= 3 && accepted.len() >= 3 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(refused >= 1, "a copy raced a live writer and was never refused");

    // Quiescent: every accepted copy is the source's rows up to its last one.
    let source = pause(&conn);
    for (count, last, sha) in &accepted {
        assert_eq!(
            &digest(&source, *last),
            &(*count, *last, sha.clone()),
            "an accepted copy differs from the source's rows up to id {last}"
        );
    }
    // With the writer gone, the copy goes through, whole.
    let work = copy(&home, &watch).expect("a copy once the writer is gone");
    assert_eq!(check_copy(&work), digest(&source, i64::MAX));
    drop(source);
    let seen: Counts = watch.counts();
    assert_eq!(
        (seen.main.opens, seen.wal.opens, seen.journal.opens),
        (0, 0, 0),
        "SQLite opened the source: {seen:?}"
    );
    eprintln!("refused {refused}, accepted {} while racing", accepted.len());
}
