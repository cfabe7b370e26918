//! PostgreSQL: a COMMIT cut before it reached the server is looked up by
//! the batch's bytes, not by its uids. Between the cut and the lookup,
//! another writer stores one of the batch's uids with its own content
//! (its insert waited on the batch's uncommitted row, and went on when the
//! server aborted the batch). The uid is stored, but not with the batch's
//! bytes: the batch was not committed, and it is never reported stored.
//! It is written again, meets the other content, and is handed back as a
//! uid conflict with its messages in the outcome.
//!
//! The order is forced by the host's test hooks, not by timing: the other
//! writer starts inside the batch's transaction (`pg.before_commit`) and
//! is seen waiting on the row's lock from `pg_stat_activity`; the lookup
//! (`flush.before_resolve`) waits until that writer has committed.
mod common;
use common::pg_proxy::{Mode, PgProxy};
use common::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;
use turnsafe_policy::Cause;

#[test]
fn a_uid_stored_with_other_bytes_is_not_the_lost_commit() {
    let server = pg_or_skip!();
    let db = server.create_db("lost_commit_bytes");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);

    let other: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
    let url = server.url(&db);
    let started = Arc::clone(&other);
    // Only the batch's first transaction: the write after the lookup
    // meets the other writer's row, committed by then.
    let first = std::sync::atomic::AtomicBool::new(true);
    let _start = turnsafe_host::failpoint::on("pg.before_commit", move || {
        if !first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut slot = started.lock().unwrap();
        let watch_url = url.clone();
        let url = url.clone();
        *slot = Some(std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("the other writer connects");
            c.execute(
                "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                 VALUES ('s1', 'b-0', 50, 'user', 'theirs', '{\"role\":\"user\",\"content\":\"theirs\"}', 0)",
                &[],
            )
            .expect("the other writer's insert commits once the batch is aborted");
        }));
        drop(slot);
        // Inside the batch's transaction: wait until the other insert
        // waits on the batch's row.
        let mut watch = postgres::Client::connect(&watch_url, postgres::NoTls).expect("a watching connection");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = watch
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO messages%'",
                    &[],
                )
                .expect("pg_stat_activity")
                .get(0);
            if waiting == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "the other writer never waited on the row");
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let joined = Arc::clone(&other);
    let _resolve = turnsafe_host::failpoint::on("flush.before_resolve", move || {
        if let Some(t) = joined.lock().unwrap().take() {
            t.join().expect("the other writer");
        }
    });

    proxy.once(Mode::DropBeforeCommit);
    let mine = vec![Message::new("user", "mine").with_uid("b-0")];
    let out = store.append_batch(&sid("s1"), &mine);
    assert_eq!(proxy.cuts_before_commit(), 1, "the cut happened before COMMIT");
    assert!(
        other.lock().unwrap().is_none(),
        "the lookup waited for the other writer"
    );
    assert!(!out.persisted, "{}", out.to_value());
    assert_eq!(out.cause, Some(Cause::UidConflict), "{}", out.to_value());
    assert_eq!((out.committed, out.handed_back), (0, 1), "{}", out.to_value());
    let rows = pg::rows(&server, &db, "s1");
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().any(|r| r.0 == "b-0" && r.2 == "theirs"), "{rows:?}");
}
