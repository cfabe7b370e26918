//! Recovery never opens the source in place: it copies it, and aborts when
//! the source changed while being copied (here, a live writer appending to
//! a large WAL).
mod common;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use turnsafe_host::recover::{self, RecoverError};

#[test]
fn a_source_that_changes_during_the_copy_is_refused() {
    let home = Home::new();
    drop(home.store());
    let c = home.other();
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
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 100_000;
            while !stop.load(Ordering::Relaxed) {
                c.execute(
                    "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                     VALUES ('s1', ?1, ?1, 'user', 'z', '{\"content\":\"z\",\"role\":\"user\"}', 0)",
                    [i],
                )
                .unwrap();
                i += 1;
            }
        })
    };
    let mut refused = 0;
    for _ in 0..50 {
        let work = tempfile::tempdir().unwrap();
        match recover::copy_source(&home.db(), work.path()) {
            Err(RecoverError::Changed(path)) => {
                refused += 1;
                assert!(path.starts_with(home.path()));
            }
            Ok(_) => {}
            Err(e) => panic!("unexpected: {e}"),
        }
        if refused >= 3 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(refused >= 1, "a copy raced a live writer and was never refused");
    // With the writer gone, the copy goes through.
    let work = tempfile::tempdir().unwrap();
    recover::copy_source(&home.db(), work.path()).unwrap();
}
