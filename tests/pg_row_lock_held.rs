//! PostgreSQL: another connection holds the session's row lock for 2 s.
//! The writer's `lock_timeout` turns the wait into SQLSTATE 55P03, which
//! is `locked`: retried on the policy's plan, and the batch ends
//! persisted, on the same connection.
mod common;
use std::time::{Duration, Instant};

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn a_held_row_lock_is_locked_and_retried() {
    let server = pg_or_skip!();
    let db = server.create_db("rowlock");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);

    let url = server.url(&db);
    let (tx, rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut t = c.transaction().unwrap();
        t.execute("SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE", &[])
            .unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        t.commit().unwrap();
    });
    rx.recv().unwrap();
    let started = Instant::now();
    let out = store.append_batch(&sid("s1"), &batch("b", 10));
    holder.join().unwrap();
    assert!(out.persisted, "{}", out.to_value());
    assert!(started.elapsed() >= Duration::from_millis(1900));
    assert_eq!(out.cause, Some(Cause::Locked));
    assert_eq!(out.action, Some(ActionKind::Retry));
    assert!(out.attempts > 2, "retried: {}", out.attempts);
    assert_eq!(out.committed, 10);
    assert_eq!(out.copy.as_ref().map(|c| c.code.as_str()), Some("locked.persisted"));
    assert!(!home.divert_file("s1").exists(), "nothing was diverted");
    let rows = pg::rows(&server, &db, "s1");
    assert_eq!(rows.len(), 12);
    assert_eq!(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        (1..=12).collect::<Vec<_>>()
    );
    let c = store.counters();
    assert_eq!((c.connections_opened, c.open_attempts, c.diverts), (1, 1, 0));
    assert_eq!(c.append_attempts, 1 + u64::from(out.attempts));
}
