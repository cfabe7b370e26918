//! PostgreSQL group commit: batches that wait together are written in one
//! transaction (one COMMIT, one WAL flush), and what one batch alone fails
//! on fails only that batch, on a real server:
//! - a uid stored with different content;
//! - a turn lease another writer holds;
//! - a session row another transaction holds locked past `lock_timeout`;
//! - a session row deleted under the handle (the insert's foreign key);
//!
//! while a failure that ends the transaction (the backend terminated)
//! fails every batch, each settling as the policy says, nothing stored
//! twice. Which transaction stored a row is its `xmin`.
mod common;
use common::*;
use std::collections::BTreeSet;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::message::Message;
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::store::{SessionId, SharedStore};
use turnsafe_policy::Cause;

/// The transactions that stored the messages of `sessions`.
fn xmins(server: &pg::PgServer, db: &str, sessions: &[&str]) -> BTreeSet<String> {
    let ids: Vec<String> = sessions.iter().map(|s| s.to_string()).collect();
    server
        .admin(db)
        .query("SELECT xmin::text FROM messages WHERE session_id = ANY($1)", &[&ids])
        .expect("read xmin")
        .into_iter()
        .map(|r| r.get(0))
        .collect()
}

fn group(store: &mut turnsafe_host::pg::PgStore, batches: &[(SessionId, Vec<Message>)]) -> Vec<FlushOutcome> {
    let refs: Vec<(&SessionId, &[Message])> = batches.iter().map(|(s, m)| (s, m.as_slice())).collect();
    store.append_group(&refs)
}

fn batches(names: &[&str], tag: &str, n: usize) -> Vec<(SessionId, Vec<Message>)> {
    names
        .iter()
        .map(|s| (sid(s), batch(&format!("{tag}-{s}"), n)))
        .collect()
}

#[test]
fn batches_that_wait_together_share_one_transaction() {
    let server = pg_or_skip!();
    let db = server.create_db("group");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let outs = group(&mut store, &batches(&names, "t1", 3));
    assert!(outs.iter().all(|o| o.persisted), "{:?}", outs[0].failure);
    assert_eq!(xmins(&server, &db, &names).len(), 1, "eight batches, one transaction");
    assert_eq!(store.counters().append_attempts, 1);
    // Their leases were taken in that transaction, one per session.
    let leased: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM sessions WHERE lease_token IS NOT NULL", &[])
        .unwrap()
        .get(0);
    assert_eq!(leased, 8);

    // A second group of the same sessions goes on their seqs, again as one.
    let outs = group(&mut store, &batches(&names, "t2", 2));
    assert!(outs.iter().all(|o| o.persisted));
    assert_eq!(xmins(&server, &db, &names).len(), 2);
    for s in names {
        let seqs: Vec<i64> = pg::rows(&server, &db, s).iter().map(|r| r.1).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5], "session {s}");
    }
    // Two batches of one session in one group keep their order.
    let two = vec![(sid("a"), batch("t3-first", 2)), (sid("a"), batch("t3-second", 2))];
    assert!(group(&mut store, &two).iter().all(|o| o.persisted));
    let contents: Vec<String> = pg::rows(&server, &db, "a").into_iter().map(|r| r.2).collect();
    assert!(
        contents[5].starts_with("t3-first") && contents[7].starts_with("t3-second"),
        "{contents:?}"
    );

    // Released in one statement at the end.
    store.release_all_leases();
    let leased: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM sessions WHERE lease_token IS NOT NULL", &[])
        .unwrap()
        .get(0);
    assert_eq!(leased, 0);
}

#[test]
fn a_uid_conflict_fails_only_its_batch() {
    let server = pg_or_skip!();
    let db = server.create_db("conflict");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("b"), &batch("old", 2)).persisted);
    let before = xmins(&server, &db, &["b"]);

    let conflicting = vec![
        Message::new("user", "new one").with_uid("fresh-b"),
        Message::new("user", "other content").with_uid("old-1"),
    ];
    let mut bs = batches(&["a", "c"], "t", 2);
    bs.insert(1, (sid("b"), conflicting));
    let outs = group(&mut store, &bs);
    assert!(outs[0].persisted && outs[2].persisted);
    assert!(!outs[1].persisted);
    assert_eq!(outs[1].cause, Some(Cause::UidConflict));
    assert_eq!(outs[1].handed_back, 2);
    assert_eq!(
        xmins(&server, &db, &["a", "c"]).len(),
        1,
        "the others in one transaction"
    );
    assert_eq!(
        xmins(&server, &db, &["b"]),
        before,
        "nothing of the refused batch was stored"
    );
    assert!(pg::rows(&server, &db, "b").iter().all(|r| r.0 != "fresh-b"));
}

#[test]
fn a_lease_held_elsewhere_fails_only_its_batch() {
    let server = pg_or_skip!();
    let db = server.create_db("fenced");
    let url = server.url(&db);
    let (home, other_home) = (Home::new(), Home::new());
    // Another writer holds session b's live lease.
    let mut other = pg::store(&url, other_home.path());
    assert!(other.append_batch(&sid("b"), &batch("theirs", 1)).persisted);

    let mut store = pg::store(&url, home.path());
    let outs = group(&mut store, &batches(&["a", "b", "c"], "mine", 2));
    assert!(outs[0].persisted && outs[2].persisted, "{}", outs[0].to_value());
    assert!(!outs[1].persisted);
    assert_eq!(outs[1].cause, Some(Cause::TurnLease), "{}", outs[1].to_value());
    assert!(outs[1].receipt.is_some() || outs[1].handed_back == 2);
    assert_eq!(xmins(&server, &db, &["a", "c"]).len(), 1);
    assert_eq!(pg::rows(&server, &db, "b").len(), 1, "only the lease holder's message");
}

#[test]
fn a_row_locked_past_the_timeout_fails_only_its_batch() {
    let server = pg_or_skip!();
    let db = server.create_db("rowlock");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(
        store
            .append_group(&[(&sid("a"), &batch("x", 1)), (&sid("b"), &batch("x", 1))])
            .iter()
            .all(|o| o.persisted)
    );
    // Another transaction holds session b's row for the whole group.
    let mut holder = server.admin(&db);
    let mut tx = holder.transaction().unwrap();
    tx.execute("SELECT 1 FROM sessions WHERE id = 'b' FOR UPDATE", &[])
        .unwrap();

    let outs = group(&mut store, &batches(&["a", "b"], "y", 2));
    assert!(outs[0].persisted, "{}", outs[0].to_value());
    assert!(!outs[1].persisted, "{}", outs[1].to_value());
    assert_eq!(outs[1].cause, Some(Cause::Locked), "{}", outs[1].to_value());
    assert!(outs[1].receipt.is_some(), "diverted once the patience ran out");
    tx.rollback().unwrap();
    // a's batch went in as soon as it asked: the lock on b never held it back.
    assert_eq!(pg::rows(&server, &db, "a").len(), 3);
    assert_eq!(pg::rows(&server, &db, "b").len(), 1);
}

#[test]
fn a_session_row_deleted_under_the_handle_fails_alone_and_is_recreated() {
    let server = pg_or_skip!();
    let db = server.create_db("rowgone");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(
        group(&mut store, &batches(&["a", "b", "c"], "t1", 1))
            .iter()
            .all(|o| o.persisted)
    );
    // Someone removes session b behind the handle's back (it still holds its lease token).
    let mut admin = server.admin(&db);
    admin
        .execute("DELETE FROM messages WHERE session_id = 'b'", &[])
        .unwrap();
    admin.execute("DELETE FROM sessions WHERE id = 'b'", &[]).unwrap();

    let outs = group(&mut store, &batches(&["a", "b", "c"], "t2", 2));
    assert!(
        outs.iter().all(|o| o.persisted),
        "{:?}",
        outs.iter().map(|o| o.to_value()).collect::<Vec<_>>()
    );
    assert_eq!(outs[1].cause, Some(Cause::SessionRowMissing), "{}", outs[1].to_value());
    assert_eq!(
        outs[0].cause,
        None,
        "a committed at its first try: {}",
        outs[0].to_value()
    );
    assert_eq!(outs[2].cause, None);
    assert_eq!(pg::rows(&server, &db, "b").len(), 2);
    assert_eq!(pg::rows(&server, &db, "a").len(), 3);
}

#[test]
fn a_terminated_backend_fails_the_whole_group_and_nothing_is_stored_twice() {
    let server = pg_or_skip!();
    let db = server.create_db("terminated");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    let names = ["a", "b", "c", "d"];
    assert!(group(&mut store, &batches(&names, "t1", 1)).iter().all(|o| o.persisted));
    // The writer's backend is terminated between groups (57P01 at its next statement).
    let pid: i32 = store
        .backend()
        .client()
        .expect("connected")
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    server
        .admin(&db)
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();

    let outs = group(&mut store, &batches(&names, "t2", 3));
    for (s, o) in names.iter().zip(&outs) {
        assert!(o.persisted, "{s}: {}", o.to_value());
        assert_eq!(o.cause, Some(Cause::Unavailable), "{s}: {}", o.to_value());
        assert_eq!(o.attempts, 2, "{s}: one failed write, then one after the reconnect");
        assert_eq!(pg::rows(&server, &db, s).len(), 4, "{s}: stored once");
    }
    assert_eq!(
        store.counters().connections_opened,
        2,
        "one reconnect for the whole group"
    );
    assert_eq!(
        xmins(&server, &db, &names).len(),
        2,
        "the group was written again as one transaction"
    );
}

#[test]
fn threads_on_one_shared_store_share_commits() {
    let server = pg_or_skip!();
    let db = server.create_db("shared");
    let home = Home::new();
    let shared = SharedStore::over(pg::store(&server.url(&db), home.path()), home.path());
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let s = shared.clone();
            std::thread::spawn(move || {
                (0..10)
                    .map(|k| s.append_batch(&sid(&format!("s{i}")), &batch(&format!("t{i}-{k}"), 2)))
                    .all(|o| o.persisted)
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap());
    }
    let names: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let commits = xmins(&server, &db, &refs).len();
    let total: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM messages", &[])
        .unwrap()
        .get(0);
    assert_eq!(total, 16 * 10 * 2);
    assert!(commits < 160, "160 batches from 16 threads took {commits} transactions");
    for s in &names {
        let seqs: Vec<i64> = pg::rows(&server, &db, s).iter().map(|r| r.1).collect();
        assert_eq!(seqs, (1..=20).collect::<Vec<i64>>(), "{s}");
    }
    shared.with_store(|st| {
        assert_eq!(st.transcript("s3").unwrap().len(), 20);
    });
}

/// The statements prepared on the handle's connection.
fn prepared_statements(store: &mut turnsafe_host::pg::PgStore) -> i64 {
    let client = store.backend().client().expect("connected");
    client
        .query_one("SELECT count(*) FROM pg_prepared_statements", &[])
        .expect("read pg_prepared_statements")
        .get(0)
}

/// The write path prepares its statements once per connection: more
/// groups add none. When the server ends the connection, the next
/// connection prepares its own (a statement belongs to the connection that
/// prepared it), the leases name the new backend, and every batch is
/// stored once.
#[test]
fn the_write_path_prepares_its_statements_once_per_connection() {
    let server = pg_or_skip!();
    let db = server.create_db("prepared");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    let names = ["a", "b"];
    for round in 0..3 {
        let outs = group(&mut store, &batches(&names, &format!("r{round}"), 2));
        assert!(outs.iter().all(|o| o.persisted), "{:?}", outs[0].failure);
    }
    let settled = prepared_statements(&mut store);
    assert!(settled >= 4, "the write path's statements are prepared: {settled}");
    for round in 3..10 {
        let outs = group(&mut store, &batches(&names, &format!("r{round}"), 2));
        assert!(outs.iter().all(|o| o.persisted), "{:?}", outs[0].failure);
    }
    assert_eq!(prepared_statements(&mut store), settled, "no statement prepared twice");

    let pid: i32 = store
        .backend()
        .client()
        .expect("connected")
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    server
        .admin(&db)
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    let mut stored_after = false;
    for attempt in 0..3 {
        let outs = group(&mut store, &batches(&names, &format!("after{attempt}"), 2));
        if outs.iter().all(|o| o.persisted) {
            stored_after = true;
            break;
        }
    }
    assert!(stored_after, "writes go on over a new connection");
    // The new connection prepared its own, and the renewal that writes
    // its backend into the leases it holds (the first connection never
    // renewed: its leases had more than half their time left).
    assert_eq!(
        prepared_statements(&mut store),
        settled + 1,
        "the new connection prepared its own"
    );
    let now: i32 = store
        .backend()
        .client()
        .expect("connected")
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    for session in names {
        let holder: String = server
            .admin(&db)
            .query_one("SELECT lease_holder FROM sessions WHERE id = $1", &[&session])
            .unwrap()
            .get(0);
        let holder: serde_json::Value = serde_json::from_str(&holder).unwrap();
        assert_eq!(
            holder["backend_pid"], now,
            "{session}'s lease names the old backend: {holder}"
        );
    }
    let uids: Vec<String> = server
        .admin(&db)
        .query("SELECT uid FROM messages", &[])
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    let distinct: BTreeSet<&String> = uids.iter().collect();
    assert_eq!(distinct.len(), uids.len(), "nothing stored twice");
}

/// Rows of `messages` the server read (index fetches and sequential
/// reads), once every other connection to `db` has ended and flushed its
/// statistics.
fn rows_read(server: &pg::PgServer, db: &str) -> i64 {
    let mut admin = server.admin(db);
    for _ in 0..500 {
        let others: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0);
        if others == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    admin.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    admin
        .query_one(
            "SELECT COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0) FROM pg_stat_user_tables \
             WHERE relname = 'messages'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// A batch into a long session reads a few rows, not the session: the
/// next seq comes from the index's last entry, the uids from the unique
/// index. Ten batches into a session of 3,000 rows read far fewer rows
/// than the session holds.
#[test]
fn a_batch_reads_a_few_rows_however_long_the_session() {
    let server = pg_or_skip!();
    let db = server.create_db("long");
    let home = Home::new();
    {
        let mut store = pg::store(&server.url(&db), home.path());
        for k in 0..3 {
            let outs = group(&mut store, &[(sid("long"), batch(&format!("pre{k}"), 1000))]);
            assert!(outs[0].persisted, "{:?}", outs[0].failure);
        }
    }
    let before = rows_read(&server, &db);
    {
        let mut store = pg::store(&server.url(&db), home.path());
        for k in 0..10 {
            let outs = group(
                &mut store,
                &[
                    (sid("long"), batch(&format!("next{k}"), 2)),
                    (sid("short"), batch(&format!("s{k}"), 2)),
                ],
            );
            assert!(outs.iter().all(|o| o.persisted), "{:?}", outs[0].failure);
        }
    }
    let read = rows_read(&server, &db) - before;
    assert!(
        read < 1_000,
        "ten groups read {read} rows of messages: a scan of the session each time"
    );
}

/// A LangGraph checkpoint waiting with message batches: the checkpoint is
/// written in a transaction of its own (no lease, no seq), the messages in
/// theirs, one for all of them (each row's `xmin`); a message batch
/// failing alone (a uid conflict) fails only itself, and the checkpoint
/// and the other batches are stored.
#[test]
fn a_langgraph_checkpoint_in_a_group_with_messages_is_stored_on_its_own() {
    use turnsafe_host::graph::{CheckpointRecord, GraphBatch, GraphQuery};
    let server = pg_or_skip!();
    let db = server.create_db("mixed");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("b"), &batch("old", 2)).persisted);
    let checkpoint = GraphBatch::Checkpoint(CheckpointRecord {
        thread_id: "thread 1".into(),
        checkpoint_ns: String::new(),
        checkpoint_id: "1ef-0001".into(),
        parent_checkpoint_id: None,
        kind: Some("msgpack".into()),
        checkpoint: vec![1, 2, 3],
        metadata: serde_json::json!({"step": 0}),
    });
    let b_before = xmins(&server, &db, &["b"]);
    let (graph_session, a, b, c) = (SessionId::graph("thread 1"), sid("a"), sid("b"), sid("c"));
    let (good_a, good_c) = (batch("t-a", 2), batch("t-c", 2));
    let conflicting = vec![Message::new("user", "other content").with_uid("old-1")];
    let items: Vec<turnsafe_host::backend::group::Item<'_>> = vec![
        (&graph_session, &[], Some(&checkpoint)),
        (&a, &good_a, None),
        (&b, &conflicting, None),
        (&c, &good_c, None),
    ];
    let outs = turnsafe_host::backend::group::flush_group(&mut store, &items);
    assert!(
        outs[0].persisted && outs[1].persisted && outs[3].persisted,
        "{:?} {:?} {:?}",
        outs[0].failure,
        outs[1].failure,
        outs[3].failure
    );
    assert_eq!(outs[0].uids, ["checkpoint::1ef-0001"]);
    assert_eq!(outs[2].cause, Some(Cause::UidConflict));
    // Which transaction stored what: the messages of a and c in one, the
    // checkpoint in another, nothing of b's refused batch.
    let messages = xmins(&server, &db, &["a", "c"]);
    assert_eq!(messages.len(), 1, "the message batches in one transaction");
    let checkpoint_xmins: BTreeSet<String> = server
        .admin(&db)
        .query("SELECT xmin::text FROM checkpoints WHERE thread_id = 'thread 1'", &[])
        .expect("read xmin")
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(checkpoint_xmins.len(), 1);
    assert!(
        checkpoint_xmins.is_disjoint(&messages),
        "the checkpoint in a transaction of its own: {checkpoint_xmins:?} {messages:?}"
    );
    assert_eq!(xmins(&server, &db, &["b"]), b_before, "nothing of the refused batch");
    let stored = store
        .graph_read(&GraphQuery {
            thread_id: Some("thread 1".into()),
            ..GraphQuery::default()
        })
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].record.checkpoint, [1, 2, 3]);
    assert_eq!(pg::rows(&server, &db, "a").len(), 2);
    assert_eq!(pg::rows(&server, &db, "c").len(), 2);
}
