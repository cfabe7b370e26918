//! Garbage over the database header: SQLITE_NOTADB at open is `corrupt`,
//! diverted, and sticky for the handle. And BUSY_SNAPSHOT: what it looks
//! like from a real second connection, and why a flush never meets it.
mod common;
use std::sync::{Arc, Mutex};

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn garbage_over_the_header_is_corrupt_and_sticky() {
    let home = Home::new();
    let mut first = home.store();
    assert!(first.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    drop(first);
    let mut bytes = std::fs::read(home.db()).unwrap();
    bytes[..100].fill(0x5A);
    std::fs::write(home.db(), &bytes).unwrap();

    let mut store = home.store();
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Corrupt));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!(out.diverted, 2);
    assert_eq!(out.copy.as_ref().unwrap().code, "corrupt.diverted");
    let lines = receipt_lines(out.receipt.as_ref().unwrap());
    assert_eq!(lines[0]["cause"], "corrupt");

    // Sticky: the handle refuses the database from now on. The next batch
    // is diverted without another open or write attempt.
    assert_eq!(store.sticky(), Some(Cause::Corrupt));
    let before = store.counters();
    let watch = watch_opens(&home);
    let next = store.append_batch(&sid("s1"), &batch("c", 3));
    let seen = watch.counts();
    assert_eq!(
        (seen.main.opens, seen.main.closes, seen.main.write_locks, seen.wal.opens),
        (0, 0, 0, 0),
        "seen from below, the sticky handle touched state.db: {seen:?}"
    );
    assert!(!next.persisted);
    assert_eq!(
        (next.cause, next.action),
        (Some(Cause::Corrupt), Some(ActionKind::Divert))
    );
    assert_eq!((next.committed, next.diverted, next.handed_back), (0, 3, 0));
    assert_eq!(next.attempts, 0, "a sticky handle makes no attempt");
    let after = store.counters();
    assert_eq!(
        (after.open_attempts, after.append_attempts),
        (before.open_attempts, before.append_attempts),
        "a sticky handle must not touch the database"
    );
    assert_eq!(after.diverts, before.diverts + 1);
    let lines = receipt_lines(next.receipt.as_ref().unwrap());
    assert_eq!(
        lines.iter().map(|l| l["uid"].as_str().unwrap()).collect::<Vec<_>>(),
        ["c-0", "c-1", "c-2"]
    );
}

#[test]
fn busy_snapshot_is_recorded_from_a_real_second_connection() {
    // The vector `induced_busy_snapshot` comes from this sequence.
    let home = Home::new();
    drop(home.store());
    let a = home.other();
    let b = home.other();
    b.busy_timeout(std::time::Duration::ZERO).unwrap();
    b.execute_batch("BEGIN").unwrap();
    let _: i64 = b.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
    a.execute("INSERT INTO state_meta(key, value) VALUES ('probe', 'a')", [])
        .unwrap();
    let err = b
        .execute("UPDATE state_meta SET value = value WHERE key = 'generation'", [])
        .unwrap_err();
    let (code, ext, msg) = turnsafe_host::observe::sqlite_parts(&err);
    assert_eq!((code, ext, msg.as_str()), (Some(5), Some(517), "database is locked"));
    let obs = turnsafe_host::observe::observation(turnsafe_policy::Operation::AppendBatch, &err, None, vec![], 1, 0, 1);
    let d = turnsafe_policy::decide(&obs);
    assert_eq!((d.classification.cause, d.action), (Cause::Locked, ActionKind::Retry));
}

/// Another writer's try: Ok, or SQLite's (code, extended code, message).
type Attempt = Result<(), (Option<i64>, Option<i64>, String)>;

#[test]
fn no_other_writer_commits_between_the_flush_read_and_its_write() {
    // The flush reads (the next seq, the lease) and then writes, in one
    // transaction. Under BEGIN IMMEDIATE it holds the write lock from the
    // start, so another writer that tries to commit inside that window is
    // refused with BUSY, and the flush commits at its first attempt. Under
    // BEGIN DEFERRED the other commit would land, and the flush's write
    // would meet BUSY_SNAPSHOT.
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let other = home.other();
    other.busy_timeout(std::time::Duration::ZERO).unwrap();
    let other = Mutex::new(other);
    let tried: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let hook = {
        let tried = tried.clone();
        turnsafe_host::failpoint::on("flush.after_read", move || {
            let c = other.lock().unwrap();
            let r = c
                .execute(
                    "INSERT OR REPLACE INTO state_meta(key, value) VALUES ('probe', 'inside the window')",
                    [],
                )
                .map(|_| ())
                .map_err(|e| turnsafe_host::observe::sqlite_parts(&e));
            tried.lock().unwrap().push(r);
        })
    };
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    drop(hook);
    let tried = tried.lock().unwrap().clone();
    match tried.first() {
        Some(Err((Some(5), Some(5), msg))) => assert_eq!(msg, "database is locked"),
        other => panic!("another writer got through between the flush's read and its write: {other:?}"),
    }
    assert_eq!(tried.len(), 1, "the flush reached its window once: {tried:?}");
    assert!(
        out.persisted && out.attempts == 1 && out.cause.is_none(),
        "{:?}",
        out.to_value()
    );
    let probe: Option<String> = home
        .other()
        .query_row("SELECT value FROM state_meta WHERE key = 'probe'", [], |r| r.get(0))
        .ok();
    assert_eq!(probe, None);
    assert_eq!(home.rows("s1").len(), 4);
}
