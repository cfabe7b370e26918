//! LangGraph checkpoints and writes diverted on a real SQLITE_READONLY:
//! the version 3 lines on disk exactly as the receipt says (blobs as
//! base64, the thread's safe id as the file name), replay storing them by
//! key and idempotently (a second replay of the same lines finds only
//! duplicates), a bad graph line quarantined, `doctor` counting them, and
//! `show --thread --json` listing them with LangGraph's field names.
mod common;

use assert_cmd::Command;
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::graph::{CheckpointRecord, GraphBatch, GraphQuery, WriteRecord};
use turnsafe_host::ids::thread_session;
use turnsafe_host::replay::{ReplayOptions, replay};
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::{ActionKind, Cause};

const THREAD: &str = "thread with spaces/and slashes";

fn checkpoint(id: &str, parent: Option<&str>, ns: &str) -> CheckpointRecord {
    CheckpointRecord {
        thread_id: THREAD.into(),
        checkpoint_ns: ns.into(),
        checkpoint_id: id.into(),
        parent_checkpoint_id: parent.map(String::from),
        kind: Some("msgpack".into()),
        checkpoint: vec![0x83, 0x00, 0xff, b'\n', 0x7b],
        metadata: json!({"step": 1, "source": "loop", "run_id": "run-1"}),
    }
}

fn write(id: &str, task: &str, idx: i64, value: &[u8]) -> WriteRecord {
    WriteRecord {
        thread_id: THREAD.into(),
        checkpoint_ns: String::new(),
        checkpoint_id: id.into(),
        task_id: task.into(),
        task_path: "~__pregel_pull, b".into(),
        idx,
        channel: if idx < 0 { "__error__".into() } else { "log".into() },
        kind: Some("bytes".into()),
        value: value.to_vec(),
    }
}

fn read_only(home: &Home) -> turnsafe_host::store::SessionStore {
    home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    })
}

#[test]
fn diverted_checkpoints_and_writes_replay_by_key_once() {
    let home = Home::new();
    drop(home.store());
    let session = thread_session(THREAD);
    assert_ne!(session, THREAD, "the thread id is not a valid file name");

    let mut store = read_only(&home);
    let cp = checkpoint("1ef-0002", Some("1ef-0001"), "");
    let out = store.put_graph(&GraphBatch::Checkpoint(cp.clone()));
    assert!(!out.persisted);
    assert_eq!((out.cause, out.action), (Some(Cause::Disk), Some(ActionKind::Divert)));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 1, 0));
    let r = out.receipt.clone().expect("receipt");
    assert_eq!(r.path, home.divert_file(&session).to_string_lossy());
    let lines = receipt_lines(&r);
    assert_eq!(lines.len(), 1);
    let l = &lines[0];
    let keys: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["at", "batch", "cause", "checkpoint", "kind", "session", "uid", "v"]
    );
    assert_eq!((l["v"].clone(), l["kind"].clone()), (json!(3), json!("checkpoint")));
    assert_eq!(l["session"], json!(session));
    assert_eq!(l["uid"], json!("checkpoint::1ef-0002"));
    assert_eq!(l["checkpoint"]["checkpoint"], json!("gwD/Cns="), "the blob as base64");
    assert_eq!(l["checkpoint"]["thread_id"], json!(THREAD));
    assert_eq!(l["checkpoint"]["metadata"], cp.metadata);

    let writes = vec![
        write("1ef-0002", "task-1", 0, b"first"),
        write("1ef-0002", "task-1", 1, b"\0two"),
    ];
    let out = store.put_graph(&GraphBatch::Writes(writes.clone()));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 2, 0));
    let wl = receipt_lines(out.receipt.as_ref().expect("receipt"));
    assert_eq!(wl[0]["kind"], "write");
    assert_eq!(wl[1]["uid"], "write::1ef-0002:task-1:1");
    assert_eq!(wl[1]["write"]["value"], "AHR3bw==");
    drop(store);

    // A line of another thread in this file, and a line with a bad blob:
    // quarantined, never stored.
    let mut bad = wl[0].clone();
    bad["write"]["thread_id"] = json!("someone else");
    let mut torn = wl[1].clone();
    torn["write"]["value"] = json!("not base64 !!");
    torn["uid"] = json!("write::1ef-0002:task-1:9");
    let extra = format!("{}\n{}\n", bad, torn);
    std::fs::OpenOptions::new()
        .append(true)
        .open(home.divert_file(&session))
        .and_then(|mut f| std::io::Write::write_all(&mut f, extra.as_bytes()))
        .unwrap();

    let doctor: Value = turnsafe_host::doctor::report(home.path());
    assert_eq!(
        doctor["facts"]["pending_divert_lines"],
        json!({"message": 0, "checkpoint": 1, "write": 4})
    );

    let reports = replay(home.path(), &ReplayOptions::default()).unwrap();
    let (replayed, duplicate, quarantined): (u64, u64, u64) = reports.iter().fold((0, 0, 0), |a, r| {
        (a.0 + r.replayed, a.1 + r.duplicate, a.2 + r.quarantined)
    });
    assert_eq!((replayed, duplicate, quarantined), (3, 0, 2));

    let mut store = home.store();
    let got = store
        .graph_read(&GraphQuery {
            thread_id: Some(THREAD.into()),
            ..GraphQuery::default()
        })
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record, cp);
    assert_eq!(got[0].writes, writes, "both writes, in (task_path, task_id, idx) order");
    drop(store);

    // The same lines again (a replay cut before its file was settled):
    // every line a duplicate, nothing stored twice or changed.
    let settled = std::fs::read_dir(home.path().join("sessions/settled"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    std::fs::copy(&settled, home.divert_file(&session)).unwrap();
    let again = replay(home.path(), &ReplayOptions::default()).unwrap();
    assert_eq!((again[0].replayed, again[0].duplicate, again[0].quarantined), (0, 3, 2));
    let conn = home.other();
    let n: (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM checkpoints), (SELECT count(*) FROM checkpoint_writes)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(n, (1, 2));

    // The command line lists the thread with LangGraph's field names.
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["show", "--home"])
        .arg(home.path())
        .args(["--thread", THREAD, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["type"], "checkpoint");
    let d = &lines[0]["data"];
    assert_eq!(d["checkpoint_id"], "1ef-0002");
    assert_eq!(d["parent_checkpoint_id"], "1ef-0001");
    assert_eq!(d["checkpoint"], "gwD/Cns=");
    assert_eq!(d["pending_writes"][1]["value"], "AHR3bw==");
    assert_eq!(
        lines[1],
        json!({"type": "end", "data": {"thread_id": THREAD, "checkpoints": 1}})
    );
}

#[test]
fn special_writes_replace_and_ordinary_writes_keep_the_first_copy() {
    let home = Home::new();
    let mut store = home.store();
    assert!(
        store
            .put_graph(&GraphBatch::Checkpoint(checkpoint("c1", None, "")))
            .persisted
    );
    let first = vec![write("c1", "t", 0, b"one"), write("c1", "t", -1, b"err-1")];
    assert!(store.put_graph(&GraphBatch::Writes(first)).persisted);
    // A resend of an ordinary write with other content keeps the first.
    assert!(
        store
            .put_graph(&GraphBatch::Writes(vec![write("c1", "t", 0, b"changed")]))
            .persisted
    );
    // A batch of special writes only replaces.
    assert!(
        store
            .put_graph(&GraphBatch::Writes(vec![write("c1", "t", -1, b"err-2")]))
            .persisted
    );
    let got = store
        .graph_read(&GraphQuery {
            thread_id: Some(THREAD.into()),
            ..GraphQuery::default()
        })
        .unwrap();
    let values: Vec<(i64, Vec<u8>)> = got[0].writes.iter().map(|w| (w.idx, w.value.clone())).collect();
    assert_eq!(values, [(-1, b"err-2".to_vec()), (0, b"one".to_vec())]);
}

#[test]
fn clearing_a_session_keeps_the_pending_lines_of_a_thread_with_its_id() {
    let home = Home::new();
    drop(home.store());
    let mut store = read_only(&home);
    let shared = "shared-id";
    let out = store.append_batch(&sid(shared), &batch("m", 2));
    assert_eq!(out.diverted, 2);
    let mut cp = checkpoint("c1", None, "");
    cp.thread_id = shared.into();
    let out = store.put_graph(&GraphBatch::Checkpoint(cp.clone()));
    assert_eq!(out.diverted, 1);
    assert_eq!(
        out.receipt.clone().unwrap().path,
        home.divert_file(shared).to_string_lossy()
    );
    drop(store);

    let cleared = turnsafe_host::clear::clear(&mut home.store(), home.path(), &sid(shared)).unwrap();
    assert_eq!(
        cleared.settled.settled, 2,
        "the two message lines are settled as cleared"
    );
    assert_eq!(cleared.settled.kept, 1, "the thread's line is written back");
    let pending = std::fs::read_to_string(home.divert_file(shared)).unwrap();
    let kinds: Vec<Value> = pending
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["kind"].clone())
        .collect();
    assert_eq!(kinds, [json!("checkpoint")], "the thread's line is still pending");

    let reports = replay(home.path(), &ReplayOptions::default()).unwrap();
    assert_eq!(reports.iter().map(|r| r.replayed).sum::<u64>(), 1);
    let mut store = home.store();
    assert!(home.rows(shared).is_empty(), "the cleared messages were not imported");
    let got = store
        .graph_read(&GraphQuery {
            thread_id: Some(shared.into()),
            ..GraphQuery::default()
        })
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record, cp);
}
