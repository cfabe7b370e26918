//! `durable: true` on PostgreSQL holds for every transaction it is
//! reported for, even when the server's `synchronous_commit` changes
//! under the live connection.
//!
//! The writer reads `synchronous_commit` at connect and reports its
//! batches durable when it is not `off`. A reload of the server's
//! settings (here `ALTER SYSTEM` and `pg_reload_conf()`, as an operator
//! tuning for speed would) turns the same connection to asynchronous
//! commit: COMMIT returns before the WAL is flushed, and a crash loses
//! what the WAL writer had not yet written (`wal_writer_delay` 10 s here).
//! Each write transaction sets the level it promised with `SET LOCAL`,
//! so every batch and edit acknowledged durable survives
//! `pg_ctl stop -m immediate`.
//!
//! Checked to fail, each path on its own: with the group's first statement
//! setting no level, batches are gone after the restart; with LangGraph's
//! setting none, the checkpoint; with `tx::begin` sending no `SET LOCAL`,
//! the pop is undone.
mod common;
use std::time::Duration;

use common::*;
use turnsafe_host::backend::{Backend, History};

fn show_sync(client: &mut postgres::Client) -> String {
    client
        .query_one("SHOW synchronous_commit", &[])
        .map(|r| r.get::<_, String>(0))
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// Set `synchronous_commit` (and a WAL writer that flushes at most every
/// 10 s) in the server's configuration, reload, and wait until a new
/// connection sees it.
fn reload_with(server: &pg::PgServer, db: &str, level: &str) {
    let mut admin = server.admin("postgres");
    for sql in [
        &format!("ALTER SYSTEM SET synchronous_commit = {level}") as &str,
        "ALTER SYSTEM SET wal_writer_delay = '10s'",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    pg_cluster::wait_for("the reload", Duration::from_secs(20), || {
        Ok((show_sync(&mut server.admin(db)) == level).then_some(()))
    })
    .expect("a new connection sees the new setting");
}

/// The writer connects under `on`; then the operator turns commits
/// asynchronous and reloads; the writer's own connection sees `off` (so
/// without a setting of its own its next COMMIT would not wait for the
/// WAL); `work` runs; the server crashes before the WAL writer's next
/// round and starts again. A synchronous commit flushes all the WAL
/// before it, so each path is tested by a cycle that ends with it.
fn cycle(
    server: &mut pg::PgServer,
    db: &str,
    store: &mut turnsafe_host::pg::PgStore,
    work: impl FnOnce(&mut turnsafe_host::pg::PgStore),
) {
    reload_with(server, db, "on");
    let warm = store.append_batch(&sid("warm"), &batch(&format!("warm{}", turnsafe_host::ids::mint()), 1));
    assert!(warm.persisted && warm.durable, "{}", warm.to_value());
    reload_with(server, db, "off");
    let writer = store.backend().client().expect("the writer's live connection");
    assert_eq!(show_sync(writer), "off");
    work(store);
    server.stop_immediate();
    server.start_again().expect("start after the crash");
}

#[test]
fn a_reload_to_asynchronous_commit_loses_nothing_acknowledged_durable() {
    let mut server = turnsafe_tests::require!(pg::PgServer::start());
    let db = server.create_db("sync_local");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());

    // Batches of messages (a group's first statement sets the level).
    let mut acked = Vec::new();
    cycle(&mut server, &db, &mut store, |store| {
        for i in 0..12 {
            let out = store.append_batch(&sid("s1"), &batch(&format!("after{i}"), 2));
            assert!(out.persisted && out.durable, "{}", out.to_value());
            acked.extend(out.uids.clone());
        }
    });
    let stored: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    let lost: Vec<&String> = acked.iter().filter(|u| !stored.contains(u)).collect();
    assert!(lost.is_empty(), "acknowledged durable, lost in the crash: {lost:?}");
    assert_eq!(stored.len(), acked.len());

    // LangGraph's checkpoints and writes (their own group and statement).
    cycle(&mut server, &db, &mut store, |store| {
        common::graph::put_and_read_back(store, "thread-after");
    });
    let graph: i64 = server
        .admin(&db)
        .query_one(
            "SELECT (SELECT count(*) FROM checkpoints) + (SELECT count(*) FROM checkpoint_writes)",
            &[],
        )
        .expect("count the thread's rows")
        .get(0);
    assert_eq!(
        graph, 2,
        "the checkpoint and its write, acknowledged durable, lost in the crash"
    );

    // An edit (its own transaction, `SET LOCAL`): the last message popped.
    cycle(&mut server, &db, &mut store, |store| {
        let popped = store.pop_last(&sid("s1")).expect("pop").expect("a message to pop");
        assert_eq!(popped.uid, "after11-1");
    });
    let stored: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert!(
        !stored.iter().any(|u| u == "after11-1"),
        "the pop was acknowledged and is undone"
    );
    assert_eq!(stored.len(), acked.len() - 1);
}

/// Replay moves a divert file to `settled/`, leaving the server the only
/// copy: it waits for the WAL flush whatever the server's setting.
#[test]
fn replay_into_a_server_with_asynchronous_commit_loses_nothing() {
    let mut server = turnsafe_tests::require!(pg::PgServer::start_with(&[
        "synchronous_commit=off",
        "wal_writer_delay=10s",
    ]));
    let db = server.create_db("sync_replay");
    let home = Home::new();
    // Diverted lines, as a writer that could not reach the server left them.
    let mut diverting = pg::store(
        &format!("postgres://nobody@127.0.0.1:1/{db}?connect_timeout=1"),
        home.path(),
    );
    let out = diverting.append_batch(&sid("s1"), &batch("d", 3));
    assert_eq!(out.diverted, 3, "{}", out.to_value());
    drop(diverting);

    let run = turnsafe_host::pg::replay::replay(
        home.path(),
        &server.url(&db).parse().expect("a valid URL"),
        &turnsafe_host::replay::ReplayOptions::default(),
    )
    .expect("replay");
    assert_eq!(run.files.iter().map(|r| r.replayed).sum::<u64>(), 3);

    server.stop_immediate();
    server.start_again().expect("start after the crash");
    let stored: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(stored, ["d-0", "d-1", "d-2"], "{}", server.log());
}
