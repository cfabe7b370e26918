//! LangGraph's `delete_thread` settles the thread's pending divert lines,
//! on SQLite and on a real PostgreSQL server: the thread's checkpoint and
//! write lines are settled `deleted` in the ledger (a message line of the
//! session sharing the thread's id stays pending), a later `turnsafe
//! replay` brings nothing of the thread back, and `turnsafe restore
//! --reason delete` brings the thread back, the lines' records included,
//! as `--reason clear` brings a clear's lines back.
mod common;

use assert_cmd::Command;
use common::graph::{checkpoint, write};
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::{Backend, Engine};
use turnsafe_host::clear::Settled;
use turnsafe_host::graph::{CheckpointRecord, GraphBatch, GraphQuery, WriteRecord};
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::Cause;

/// A thread id that is a valid session id: its lines share
/// `sessions/t1.jsonl` with the messages of session `t1`.
const THREAD: &str = "t1";

fn pending_checkpoint() -> CheckpointRecord {
    let mut c = checkpoint(THREAD, "1ef2");
    c.parent_checkpoint_id = Some("1ef1".into());
    c.checkpoint = vec![0x92, 0x00, 0xff, b'\n'];
    c
}

fn pending_writes() -> Vec<WriteRecord> {
    (0..2)
        .map(|idx| {
            let mut w = write(THREAD, "1ef2");
            w.idx = idx;
            w.value = format!("[\"pending {idx}\"]").into_bytes();
            w
        })
        .collect()
}

fn ledger(home: &Home) -> Vec<Value> {
    std::fs::read_to_string(home.path().join("sessions/ledger.jsonl"))
        .map(|t| t.lines().map(|l| serde_json::from_str(l).unwrap()).collect())
        .unwrap_or_default()
}

fn thread(store: &mut dyn Engine, id: &str) -> Vec<turnsafe_host::graph::StoredCheckpoint> {
    store
        .graph_read(&GraphQuery {
            thread_id: Some(id.into()),
            ..GraphQuery::default()
        })
        .unwrap()
}

fn turnsafe(home: &Home, args: &[&str], db: Option<&str>) -> Value {
    let mut cmd = Command::cargo_bin("turnsafe").unwrap();
    cmd.args(args).arg("--home").arg(home.path()).arg("--json");
    if let Some(url) = db {
        cmd.args(["--db", url]);
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .expect("a JSON record")
}

/// The delete, then replay, then restore, on whichever engine `store` is.
fn delete_replay_restore(home: &Home, store: &mut dyn Engine, db: Option<&str>) {
    let deleted = turnsafe_host::clear::delete_thread(store, home.path(), THREAD).unwrap();
    assert_eq!(
        deleted.settled,
        Settled {
            settled: 3,
            quarantined: 0,
            kept: 1
        }
    );
    assert_eq!(
        (deleted.edited.checkpoints, deleted.edited.writes),
        (2, 3),
        "the stored rows and the pending lines' records are marked"
    );
    let entries = ledger(home);
    let settled: Vec<(&str, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e["uid"].as_str().unwrap(),
                e["state"].as_str().unwrap(),
                e["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        settled,
        [
            ("checkpoint::1ef2", "deleted", "the thread was deleted"),
            ("write::1ef2:task-1:0", "deleted", "the thread was deleted"),
            ("write::1ef2:task-1:1", "deleted", "the thread was deleted"),
        ]
    );
    // The session's message line is not the delete's: still pending.
    let pending = std::fs::read_to_string(home.divert_file(THREAD)).unwrap();
    let kept: Vec<Value> = pending.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0]["uid"], "m-0");
    assert!(thread(store, THREAD).is_empty());

    // Replay brings the message in, and the other thread's line, and
    // nothing of the deleted thread.
    let summary = turnsafe(home, &["replay"], db);
    assert_eq!(summary["data"]["replayed"], 2, "{summary}");
    assert!(thread(store, THREAD).is_empty(), "the deleted thread stays deleted");
    assert_eq!(thread(store, "t2").len(), 1);
    assert_eq!(store.rows(THREAD, None).unwrap().len(), 1);

    // The delete is undone as a clear is: the thread's rows come back,
    // the pending lines' records with them.
    let end = turnsafe(home, &["restore", "--session", THREAD, "--reason", "delete"], db);
    assert_eq!(
        end["data"],
        json!({"restored": [], "skipped_active": [], "not_archived": [],
               "checkpoints_restored": 2, "writes_restored": 3})
    );
    let back = thread(store, THREAD);
    assert_eq!(back.len(), 2);
    assert_eq!(back[0].record, pending_checkpoint());
    assert_eq!(back[0].writes, pending_writes());
    assert_eq!(back[1].record, checkpoint(THREAD, "1ef1"));
    assert_eq!(back[1].writes, [write(THREAD, "1ef1")]);
}

#[test]
fn delete_thread_settles_its_pending_lines_on_sqlite() {
    let home = Home::new();
    let mut store = home.store();
    for batch in [
        GraphBatch::Checkpoint(checkpoint(THREAD, "1ef1")),
        GraphBatch::Writes(vec![write(THREAD, "1ef1")]),
    ] {
        assert!(store.put_graph(&batch).persisted);
    }
    drop(store);
    // The next step, diverted for real: the store is read-only
    // (SQLITE_READONLY), so its checkpoint and writes go to
    // sessions/t1.jsonl, with a message of session t1 and a checkpoint of
    // another thread.
    let mut read_only = home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    });
    for batch in [
        GraphBatch::Checkpoint(pending_checkpoint()),
        GraphBatch::Writes(pending_writes()),
        GraphBatch::Checkpoint(checkpoint("t2", "1ef9")),
    ] {
        let out = read_only.put_graph(&batch);
        assert!(!out.persisted && out.receipt.is_some(), "{}", out.to_value());
    }
    let out = read_only.append_batch(&sid(THREAD), &batch("m", 1));
    assert_eq!(out.diverted, 1, "{}", out.to_value());
    drop(read_only);

    let mut store = home.store();
    delete_replay_restore(&home, &mut store, None);
}

#[test]
fn delete_thread_settles_its_pending_lines_on_postgres() {
    let server = pg_or_skip!();
    let db = server.create_db("lg_delete");
    let url = server.url(&db);
    let home = Home::new();
    let mut store = pg::store(&url, home.path());
    for batch in [
        GraphBatch::Checkpoint(checkpoint(THREAD, "1ef1")),
        GraphBatch::Writes(vec![write(THREAD, "1ef1")]),
    ] {
        assert!(store.put_graph(&batch).persisted);
    }
    // The next step's lines, diverted by the divert itself (as a flush
    // that found the server gone would), with a message of session t1 and
    // a checkpoint of another thread.
    let sessions = home.path().join("sessions");
    for (session, batch) in [
        (THREAD, GraphBatch::Checkpoint(pending_checkpoint())),
        (THREAD, GraphBatch::Writes(pending_writes())),
        ("t2", GraphBatch::Checkpoint(checkpoint("t2", "1ef9"))),
    ] {
        turnsafe_host::divert::divert_graph(&sessions, session, "b", Cause::Unavailable, &batch).unwrap();
    }
    let m = &batch("m", 1)[0];
    let line = turnsafe_host::divert::DivertLine {
        uid: "m-0",
        seq: None,
        message: m,
    };
    turnsafe_host::divert::divert(&sessions, THREAD, "b", Cause::Unavailable, &[line]).unwrap();

    delete_replay_restore(&home, &mut store, Some(&url));
}

#[test]
fn a_pending_newer_version_is_what_the_delete_marks_and_restore_brings_back() {
    let home = Home::new();
    let mut store = home.store();
    assert!(
        store
            .put_graph(&GraphBatch::Checkpoint(checkpoint(THREAD, "1ef1")))
            .persisted
    );
    drop(store);
    // A newer put of the same checkpoint, diverted: had it gone through,
    // it would have replaced the stored one before the delete.
    std::thread::sleep(std::time::Duration::from_millis(5));
    let mut newer = checkpoint(THREAD, "1ef1");
    newer.checkpoint = b"newer state".to_vec();
    let mut read_only = home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    });
    let out = read_only.put_graph(&GraphBatch::Checkpoint(newer.clone()));
    assert!(!out.persisted && out.receipt.is_some(), "{}", out.to_value());
    drop(read_only);

    let mut store = home.store();
    let deleted = turnsafe_host::clear::delete_thread(&mut store, home.path(), THREAD).unwrap();
    assert_eq!(deleted.settled.settled, 1);
    assert_eq!(deleted.edited.checkpoints, 1);
    assert!(thread(&mut store, THREAD).is_empty());
    turnsafe(&home, &["restore", "--session", THREAD, "--reason", "delete"], None);
    let back = thread(&mut store, THREAD);
    assert_eq!(back.len(), 1);
    assert_eq!(
        back[0].record, newer,
        "the newer version, as the live put would have left it"
    );
}
