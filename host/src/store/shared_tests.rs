//! The shared store over SQLite: group commit, callbacks and calls in order.

use super::*;
use crate::backend::SharedStore;
use crate::message::Message;
use crate::outcome::FlushOutcome;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn many_threads_each_get_their_own_outcome() {
    let (_dir, home, store) = opened();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let session = SessionId::new(&format!("s{t}")).unwrap();
                (0..5)
                    .map(|b| {
                        let batch: Vec<Message> = (0..3)
                            .map(|i| {
                                Message::new("user", &format!("t{t} b{b} m{i}")).with_uid(&format!("t{t}-{b}-{i}"))
                            })
                            .collect();
                        store.append_batch(&session, &batch)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (t, handle) in threads.into_iter().enumerate() {
        let outcomes = handle.join().unwrap();
        for (b, out) in outcomes.iter().enumerate() {
            assert!(out.persisted, "t{t} b{b}: {}", out.to_value());
            assert_eq!(out.uids, (0..3).map(|i| format!("t{t}-{b}-{i}")).collect::<Vec<_>>());
        }
    }
    let rows: i64 = store.with_store(|_| count_rows(&home));
    assert_eq!(rows, 8 * 5 * 3);
}

fn msgs(tag: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| Message::new("user", &format!("{tag} m{i}")).with_uid(&format!("{tag}-{i}")))
        .collect()
}

/// A store on a new home: the directory (kept alive), the home, the store.
fn opened() -> (tempfile::TempDir, PathBuf, SharedStore) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = SharedStore::open(&home, StoreOptions::default()).unwrap();
    (dir, home, store)
}

fn count_rows(home: &Path) -> i64 {
    let conn = rusqlite::Connection::open(home.join("state.db")).unwrap();
    conn.query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn batches_handed_over_are_called_back_once_each_with_their_own_outcome() {
    let (_dir, home, store) = opened();
    let (tx, rx) = std::sync::mpsc::channel();
    for b in 0..40 {
        let tx = tx.clone();
        let session = SessionId::new(&format!("s{}", b % 4)).unwrap();
        store.append_batch_then(&session, msgs(&format!("b{b}"), 3), move |out| {
            tx.send((b, out)).unwrap();
        });
    }
    drop(tx);
    let mut got: Vec<(usize, FlushOutcome)> = rx.iter().collect();
    got.sort_by_key(|(b, _)| *b);
    assert_eq!(got.len(), 40, "every batch called back, once");
    for (b, out) in &got {
        assert!(out.persisted, "b{b}: {}", out.to_value());
        assert_eq!(out.uids, (0..3).map(|i| format!("b{b}-{i}")).collect::<Vec<_>>());
    }
    assert_eq!(count_rows(&home), 120);
}

#[test]
fn the_last_handle_dropped_commits_what_was_handed_over_and_closes() {
    let (_dir, home, store) = opened();
    let called = Arc::new(AtomicUsize::new(0));
    let session = SessionId::new("s").unwrap();
    let other = store.clone();
    for b in 0..25 {
        let called = Arc::clone(&called);
        store.append_batch_then(&session, msgs(&format!("b{b}"), 2), move |out| {
            assert!(out.persisted, "{}", out.to_value());
            called.fetch_add(1, Ordering::SeqCst);
        });
    }
    drop(store);
    // Another handle is alive: nothing has to be finished yet, and the
    // store still answers.
    assert!(other.append_batch(&session, &msgs("sync", 1)).persisted);
    drop(other);
    // The last drop returned: every callback ran, every row is stored,
    // and the lease was given back (another holder writes at once).
    assert_eq!(called.load(Ordering::SeqCst), 25);
    assert_eq!(count_rows(&home), 51);
    let opts = StoreOptions {
        holder: "someone-else".into(),
        ..StoreOptions::default()
    };
    let next = SharedStore::open(&home, opts).unwrap();
    assert!(next.append_batch(&session, &msgs("after", 1)).persisted);
}

#[test]
fn a_call_runs_after_the_batches_queued_before_it_and_before_those_after() {
    let (_dir, home, store) = opened();
    let at = home.clone();
    let session = SessionId::new("s").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let count = move |_: &mut dyn crate::backend::Engine| -> i64 { count_rows(&at) };
    // Held, so everything below is queued before anything runs.
    store.with_store(|_| {
        for b in 0..3 {
            store.append_batch_then(&session, msgs(&format!("a{b}"), 2), |_| {});
        }
        let tx1 = tx.clone();
        store.call_then(count.clone(), move |n| tx1.send(("first", n)).unwrap());
        for b in 0..2 {
            store.append_batch_then(&session, msgs(&format!("b{b}"), 2), |_| {});
        }
        let tx2 = tx.clone();
        store.call_then(count, move |n| tx2.send(("second", n)).unwrap());
    });
    drop(tx);
    let seen: Vec<(&str, Option<i64>)> = rx.iter().collect();
    assert_eq!(seen, [("first", Some(6)), ("second", Some(10))]);
}

#[test]
fn a_call_that_panics_is_answered_with_none_and_the_store_goes_on() {
    let (_dir, _home, store) = opened();
    let (tx, rx) = std::sync::mpsc::channel();
    store.call_then(|_| -> i64 { panic!("boom") }, move |r| tx.send(r).unwrap());
    assert_eq!(rx.recv().unwrap(), None);
    let session = SessionId::new("s").unwrap();
    assert!(store.append_batch(&session, &msgs("after", 1)).persisted);
    let (tx, rx) = std::sync::mpsc::channel();
    store.call_then(
        move |s| s.pop_last(&session).map(|m| m.is_some()).unwrap_or(false),
        move |r| tx.send(r).unwrap(),
    );
    assert_eq!(rx.recv().unwrap(), Some(true));
}

#[test]
fn the_last_handle_dropped_runs_the_calls_handed_over() {
    let (_dir, _home, store) = opened();
    let ran = Arc::new(AtomicUsize::new(0));
    store.with_store(|_| {
        for _ in 0..5 {
            let ran = Arc::clone(&ran);
            store.call_then(
                |_| (),
                move |r| {
                    assert!(r.is_some());
                    ran.fetch_add(1, Ordering::SeqCst);
                },
            );
        }
    });
    drop(store);
    assert_eq!(ran.load(Ordering::SeqCst), 5);
}

#[test]
fn settle_returns_once_everything_handed_over_is_stored() {
    let (_dir, home, store) = opened();
    let session = SessionId::new("s").unwrap();
    // Held, so nothing can be committed until `settle` waits.
    store.with_store(|_| {
        for b in 0..30 {
            store.append_batch_then(&session, msgs(&format!("b{b}"), 2), |_| {});
        }
    });
    store.settle();
    assert_eq!(store.waiting(), 0);
    assert_eq!(count_rows(&home), 60);
}

#[test]
fn waiting_callers_and_handed_over_batches_share_the_queue() {
    let (_dir, home, store) = opened();
    let (tx, rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let session = SessionId::new(&format!("t{t}")).unwrap();
                for b in 0..10 {
                    if b % 2 == 0 {
                        let out = store.append_batch(&session, &msgs(&format!("t{t}b{b}"), 2));
                        assert!(out.persisted, "{}", out.to_value());
                    } else {
                        let tx = tx.clone();
                        store.append_batch_then(&session, msgs(&format!("t{t}b{b}"), 2), move |out| {
                            tx.send(out.persisted).unwrap();
                        });
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for t in threads {
        t.join().unwrap();
    }
    let handed: Vec<bool> = rx.iter().collect();
    assert_eq!(handed, vec![true; 20]);
    drop(store);
    assert_eq!(count_rows(&home), 80);
}
