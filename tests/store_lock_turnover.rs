//! The policy's patience is spent on time without progress only. Another
//! writer that keeps the write lock for longer than the whole patience,
//! but commits every 20 ms, only passes the lock around: the flush waits
//! its turn and persists at its first attempt, with no cause. A holder
//! that stalls, commits once, and stalls again restarts the clock at its
//! commit: the flush retries on the policy's plan past the patience and
//! persists, where a lock held as long with no commit at all diverts
//! (`store_busy_past_patience.rs`).
mod common;
use std::time::{Duration, Instant};

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause, RetryPlan};

/// Hold the write lock from another connection, committing a change at
/// each of `commits_at` (measured from when the lock is first held) and
/// taking the lock again at once, until `release_at`. Returns once the
/// lock is held; the thread returns how many commits it made.
fn hold_with_commits(home: &Home, commits_at: Vec<Duration>, release_at: Duration) -> std::thread::JoinHandle<u64> {
    let c = home.other();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        tx.send(()).unwrap();
        let started = Instant::now();
        let mut commits = 0u64;
        for at in commits_at {
            std::thread::sleep(at.saturating_sub(started.elapsed()));
            commits += 1;
            // A commit that changes nothing writes nothing, and is no progress.
            c.execute_batch(&format!(
                "INSERT OR REPLACE INTO state_meta(key, value) VALUES ('probe', '{commits}'); \
                 COMMIT; BEGIN IMMEDIATE"
            ))
            .unwrap();
        }
        std::thread::sleep(release_at.saturating_sub(started.elapsed()));
        c.execute_batch("COMMIT").unwrap();
        commits
    });
    rx.recv().expect("lock taken");
    t
}

#[test]
fn a_lock_that_keeps_changing_hands_never_spends_the_patience() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);
    let busy_for = Duration::from_millis(RetryPlan::PATIENCE_MS + 1000);
    let every = Duration::from_millis(20);
    let commits_at = (1..).map(|i| every * i).take_while(|at| *at < busy_for).collect();
    let other = hold_with_commits(&home, commits_at, busy_for);
    let out = store.append_batch(&sid("s1"), &batch("b", 3));
    assert!(other.join().unwrap() > 200);
    // The flush may slip in between two of the other writer's commits (the
    // lock is free for microseconds there); either way it never diverts.
    assert!(out.persisted, "{}", out.to_value());
    assert_eq!(
        (out.cause, out.attempts, out.diverted),
        (None, 1, 0),
        "{}",
        out.to_value()
    );
    assert!(!home.divert_file("s1").exists());
    assert_eq!(home.rows("s1").len(), 4);
    assert_eq!(store.counters().append_attempts, 2);
}

#[test]
fn a_commit_between_two_stalls_restarts_the_patience() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);
    // Stalled for 4 s, one commit, stalled 3 s more: 7 s in all, past the
    // patience, but never 5 s without progress.
    let (first, release) = (Duration::from_secs(4), Duration::from_secs(7));
    assert!(first < Duration::from_millis(RetryPlan::PATIENCE_MS));
    assert!(release - first < Duration::from_millis(RetryPlan::PATIENCE_MS));
    assert!(release > Duration::from_millis(RetryPlan::PATIENCE_MS + 1500));
    let other = hold_with_commits(&home, vec![first], release);
    let started = Instant::now();
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    let waited = started.elapsed();
    assert_eq!(other.join().unwrap(), 1);
    assert!(out.persisted, "{waited:?} {}", out.to_value());
    assert_eq!(
        out.cause,
        Some(Cause::Locked),
        "the stalls were retried on the policy's plan"
    );
    assert_eq!(out.action, Some(ActionKind::Retry));
    assert!(out.attempts > 2, "{}", out.attempts);
    assert!(!home.divert_file("s1").exists());
    assert_eq!(home.rows("s1").len(), 3);
}
