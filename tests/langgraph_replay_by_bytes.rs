//! LangGraph lines settle by their bytes, never by their key alone, on
//! both engines: a diverted checkpoint or special write whose key holds
//! older bytes replaces them, one older than what is stored is
//! superseded (its bytes kept, both digests in the ledger), a line meeting
//! a row a delete marked before it brings the row back, an ordinary write
//! keeps the first copy, and a line that cannot be ordered in time is a
//! conflict that `doctor` counts. A lost COMMIT on PostgreSQL is resolved
//! by the batch's whole bytes: a stored key with other metadata or another
//! value is not the batch's write.
//!
//! The rows are made by the store's own flush; the test then sets their
//! times with its own SQL, writes divert lines by hand in the documented
//! format (`docs/DIVERT.md`), and reads back with its own queries and its
//! own digest of canonical bytes.
mod common;

use base64::Engine as _;
use common::pg_proxy::{Mode, PgProxy};
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::Backend;
use turnsafe_host::graph::{CheckpointRecord, GraphBatch, WriteRecord};
use turnsafe_host::ids::thread_session;
use turnsafe_host::replay::ReplayOptions;

const THREAD: &str = "bytes-thread";
/// The stored rows' put, in ms since the epoch (2026-11-30T00:00:00Z).
const T0: i64 = 1_795_996_800_000;

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64)).to_string()
}

fn cp(id: &str, blob: &[u8], step: i64) -> CheckpointRecord {
    CheckpointRecord {
        thread_id: THREAD.into(),
        checkpoint_ns: String::new(),
        checkpoint_id: id.into(),
        parent_checkpoint_id: None,
        kind: Some("msgpack".into()),
        checkpoint: blob.to_vec(),
        metadata: json!({"source": "loop", "step": step}),
    }
}

fn wr(task: &str, idx: i64, value: &[u8]) -> WriteRecord {
    WriteRecord {
        thread_id: THREAD.into(),
        checkpoint_ns: String::new(),
        checkpoint_id: "w-cp".into(),
        task_id: task.into(),
        task_path: String::new(),
        idx,
        channel: if idx < 0 { "__error__".into() } else { "messages".into() },
        kind: Some("bytes".into()),
        value: value.to_vec(),
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn cp_json(c: &CheckpointRecord) -> Value {
    json!({
        "thread_id": c.thread_id, "checkpoint_ns": c.checkpoint_ns, "checkpoint_id": c.checkpoint_id,
        "parent_checkpoint_id": c.parent_checkpoint_id, "type": c.kind, "checkpoint": b64(&c.checkpoint),
        "metadata": c.metadata,
    })
}

fn wr_json(w: &WriteRecord) -> Value {
    json!({
        "thread_id": w.thread_id, "checkpoint_ns": w.checkpoint_ns, "checkpoint_id": w.checkpoint_id,
        "task_id": w.task_id, "task_path": w.task_path, "idx": w.idx, "channel": w.channel, "type": w.kind,
        "value": b64(&w.value),
    })
}

/// A version 3 divert line, by hand; `at` `None` leaves the time out.
fn line(kind: &str, record: Value, uid: &str, at: Option<i64>) -> String {
    let mut l = json!({"v": 3, "kind": kind, "session": thread_session(THREAD), "uid": uid, "batch": "b",
                       "cause": "disk"});
    l[kind] = record;
    if let Some(at) = at {
        l["at"] = json!(rfc3339(at));
    }
    l.to_string()
}

/// One engine under test: its rows set and read with the test's own SQL.
trait Engine {
    fn store(&self) -> Box<dyn FnMut(&GraphBatch) -> bool + '_>;
    fn exec(&self, sql: &str);
    /// `(blob or value, metadata or channel, deleted_ms)` of a key, by the test's own query.
    fn checkpoint(&self, id: &str) -> Option<(Vec<u8>, String, Option<i64>)>;
    fn write(&self, task: &str, idx: i64) -> Option<(Vec<u8>, Option<i64>)>;
    fn replay(&self, home: &Home) -> turnsafe_host::replay::ReplayRun;
    fn home(&self) -> &Home;
}

struct Sqlite(Home);

impl Engine for Sqlite {
    fn store(&self) -> Box<dyn FnMut(&GraphBatch) -> bool + '_> {
        let mut s = self.0.store();
        Box::new(move |b| s.put_graph(b).persisted)
    }
    fn exec(&self, sql: &str) {
        self.0.other().execute_batch(sql).expect(sql);
    }
    fn checkpoint(&self, id: &str) -> Option<(Vec<u8>, String, Option<i64>)> {
        self.0
            .other()
            .query_row(
                "SELECT checkpoint, metadata, deleted_ms FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2",
                [THREAD, id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .ok()
    }
    fn write(&self, task: &str, idx: i64) -> Option<(Vec<u8>, Option<i64>)> {
        self.0
            .other()
            .query_row(
                "SELECT value, deleted_ms FROM checkpoint_writes WHERE thread_id = ?1 AND task_id = ?2 AND idx = ?3",
                rusqlite::params![THREAD, task, idx],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ok()
    }
    fn replay(&self, home: &Home) -> turnsafe_host::replay::ReplayRun {
        turnsafe_host::replay::replay_run(home.path(), &ReplayOptions::default()).expect("replay")
    }
    fn home(&self) -> &Home {
        &self.0
    }
}

struct Postgres {
    server: pg::PgServer,
    db: String,
    home: Home,
}

impl Engine for Postgres {
    fn store(&self) -> Box<dyn FnMut(&GraphBatch) -> bool + '_> {
        let mut s = pg::store(&self.server.url(&self.db), self.home.path());
        Box::new(move |b| s.put_graph(b).persisted)
    }
    fn exec(&self, sql: &str) {
        self.server.admin(&self.db).batch_execute(sql).expect(sql);
    }
    fn checkpoint(&self, id: &str) -> Option<(Vec<u8>, String, Option<i64>)> {
        self.server
            .admin(&self.db)
            .query_opt(
                "SELECT checkpoint, metadata, deleted_ms FROM checkpoints WHERE thread_id = $1 AND checkpoint_id = $2",
                &[&THREAD, &id],
            )
            .expect("read")
            .map(|r| (r.get(0), r.get(1), r.get(2)))
    }
    fn write(&self, task: &str, idx: i64) -> Option<(Vec<u8>, Option<i64>)> {
        self.server
            .admin(&self.db)
            .query_opt(
                "SELECT value, deleted_ms FROM checkpoint_writes WHERE thread_id = $1 AND task_id = $2 AND idx = $3",
                &[&THREAD, &task, &idx],
            )
            .expect("read")
            .map(|r| (r.get(0), r.get(1)))
    }
    fn replay(&self, home: &Home) -> turnsafe_host::replay::ReplayRun {
        let url: turnsafe_host::pg::DbUrl = self.server.url(&self.db).parse().expect("url");
        turnsafe_host::pg::replay::replay(home.path(), &url, &ReplayOptions::default()).expect("replay")
    }
    fn home(&self) -> &Home {
        &self.home
    }
}

fn ledger(home: &Home) -> Vec<Value> {
    std::fs::read_to_string(home.path().join("sessions/ledger.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a ledger line is JSON"))
        .collect()
}

fn every_settlement(e: &dyn Engine) {
    // Stored through the flush: each key's first version.
    {
        let mut put = e.store();
        for c in [
            cp("c-newer", b"A", 1),
            cp("c-older", b"A", 1),
            cp("c-back", b"A", 1),
            cp("c-marked-later", b"A", 1),
            cp("c-same", b"A", 1),
            cp("c-meta", b"A", 1),
            cp("c-no-time", b"A", 1),
        ] {
            assert!(put(&GraphBatch::Checkpoint(c)));
        }
        assert!(put(&GraphBatch::Writes(vec![wr("special", -1, b"X")])));
        assert!(put(&GraphBatch::Writes(vec![wr("ordinary", 0, b"X")])));
    }
    e.exec(&format!(
        "UPDATE checkpoints SET created_ms = {T0}; UPDATE checkpoint_writes SET created_ms = {T0};"
    ));
    e.exec(&format!(
        "UPDATE checkpoints SET deleted_ms = {} WHERE checkpoint_id = 'c-back';
         UPDATE checkpoints SET deleted_ms = {} WHERE checkpoint_id = 'c-marked-later';",
        T0 + 10_000,
        T0 + 100_000
    ));

    let later = T0 + 60_000;
    let lines = [
        line("checkpoint", cp_json(&cp("c-newer", b"B", 2)), "u1", Some(later)),
        line("checkpoint", cp_json(&cp("c-older", b"B", 0)), "u2", Some(T0 - 60_000)),
        line("checkpoint", cp_json(&cp("c-back", b"A", 1)), "u3", Some(later)),
        line("checkpoint", cp_json(&cp("c-marked-later", b"A", 1)), "u4", Some(later)),
        line("checkpoint", cp_json(&cp("c-same", b"A", 1)), "u5", Some(later)),
        // The same blob, other metadata: not the same record.
        line("checkpoint", cp_json(&cp("c-meta", b"A", 7)), "u6", Some(later)),
        line("checkpoint", cp_json(&cp("c-no-time", b"B", 2)), "u7", None),
        line("write", wr_json(&wr("special", -1, b"Y")), "u8", Some(later)),
        line("write", wr_json(&wr("ordinary", 0, b"Y")), "u9", Some(later)),
    ];
    let home = e.home();
    std::fs::create_dir_all(home.path().join("sessions")).unwrap();
    std::fs::write(home.divert_file(&thread_session(THREAD)), lines.join("\n") + "\n").unwrap();

    let run = e.replay(home);
    let s = run.summary(false);
    assert_eq!(
        (
            &s["lines"],
            &s["replayed"],
            &s["duplicate"],
            &s["applied"],
            &s["superseded"],
            &s["quarantined"],
            &s["conflict"]
        ),
        (
            &json!(9),
            &json!(0),
            &json!(2),
            &json!(4),
            &json!(2),
            &json!(1),
            &json!(1)
        ),
        "{s}"
    );
    let entries = ledger(home);
    let by_uid = |u: &str| entries.iter().find(|l| l["uid"] == u).cloned().expect(u);
    let states: Vec<(String, String)> = (1..=9)
        .map(|i| {
            let l = by_uid(&format!("u{i}"));
            (format!("u{i}"), l["state"].as_str().unwrap_or("").to_string())
        })
        .collect();
    let want = [
        "applied",
        "superseded",
        "applied",
        "duplicate",
        "duplicate",
        "applied",
        "conflict",
        "applied",
        "superseded",
    ];
    for ((uid, got), want) in states.iter().zip(want) {
        assert_eq!(got, want, "{uid}");
    }

    // What each key holds now, read with the test's own queries.
    assert_eq!(e.checkpoint("c-newer").map(|r| (r.0, r.2)), Some((b"B".to_vec(), None)));
    assert_eq!(e.checkpoint("c-older").map(|r| (r.0, r.2)), Some((b"A".to_vec(), None)));
    assert_eq!(
        e.checkpoint("c-back").map(|r| r.2),
        Some(None),
        "the put after the delete brings it back"
    );
    assert_eq!(
        e.checkpoint("c-marked-later").map(|r| r.2),
        Some(Some(T0 + 100_000)),
        "the later delete stands"
    );
    let meta: Value = serde_json::from_str(&e.checkpoint("c-meta").expect("c-meta").1).unwrap();
    assert_eq!(meta["step"], 7, "new metadata on the same blob is stored");
    assert_eq!(
        e.checkpoint("c-no-time").map(|r| r.0),
        Some(b"A".to_vec()),
        "a conflict changes nothing"
    );
    assert_eq!(
        e.write("special", -1).map(|r| r.0),
        Some(b"Y".to_vec()),
        "a special write replaces"
    );
    assert_eq!(
        e.write("ordinary", 0).map(|r| r.0),
        Some(b"X".to_vec()),
        "the first copy stays"
    );

    // Both digests where a stored version was met, by the test's own digest.
    let u2 = by_uid("u2");
    assert_eq!(
        u2["digest"],
        json!(common::canonical::digest(&cp_json(&cp("c-older", b"B", 0))))
    );
    assert_eq!(
        u2["stored_digest"],
        json!(common::canonical::digest(&cp_json(&cp("c-older", b"A", 1))))
    );
    let u7 = by_uid("u7");
    assert_eq!(
        u7["digest"],
        json!(common::canonical::digest(&cp_json(&cp("c-no-time", b"B", 2))))
    );
    assert_eq!(
        u7["stored_digest"],
        json!(common::canonical::digest(&cp_json(&cp("c-no-time", b"A", 1))))
    );
    let u4 = by_uid("u4");
    assert_eq!(u4["digest"], u4["stored_digest"]);

    // Every line kept in settled/, and a second replay of the same lines
    // changes nothing: each settles against what the first one stored.
    let settled = run.files[0].settled_to.clone().expect("settled");
    assert_eq!(std::fs::read_to_string(&settled).unwrap().lines().count(), 9);
    std::fs::copy(&settled, home.divert_file(&thread_session(THREAD))).unwrap();
    let again = e.replay(home).summary(false);
    assert_eq!(
        (&again["replayed"], &again["applied"], &again["conflict"]),
        (&json!(0), &json!(0), &json!(1)),
        "{again}"
    );
    assert_eq!(e.checkpoint("c-newer").map(|r| r.0), Some(b"B".to_vec()));

    // doctor counts the conflict and the superseded lines.
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["doctor", "--json", "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let facts = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "facts")
        .map(|v| v["data"].clone())
        .unwrap_or_else(|| panic!("doctor's facts in {text}"));
    assert_eq!(facts["conflict_lines"], json!(2), "{facts}");
    assert_eq!(facts["superseded_lines"], json!(4), "{facts}");
}

#[test]
fn sqlite_settles_each_graph_line_by_its_bytes() {
    every_settlement(&Sqlite(Home::new()));
}

#[test]
fn postgres_settles_each_graph_line_by_its_bytes() {
    let server = pg_or_skip!();
    let db = server.create_db("graph_bytes");
    every_settlement(&Postgres {
        server,
        db,
        home: Home::new(),
    });
}

/// A COMMIT cut before it reached the server, with the batch's key
/// already stored with other bytes: the lookup must not take the key for
/// the batch.
#[test]
fn a_lost_commit_is_resolved_by_the_whole_record() {
    let server = pg_or_skip!();
    let db = server.create_db("graph_lost_commit");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.put_graph(&GraphBatch::Checkpoint(cp("c1", b"A", 1))).persisted);
    assert!(store.put_graph(&GraphBatch::Writes(vec![wr("t", -1, b"X")])).persisted);

    // The same blob with new metadata: the lost COMMIT held the metadata.
    proxy.once(Mode::DropBeforeCommit);
    let out = store.put_graph(&GraphBatch::Checkpoint(cp("c1", b"A", 2)));
    assert_eq!(proxy.cuts_before_commit(), 1);
    assert!(out.persisted, "{}", out.to_value());
    let meta: String = server
        .admin(&db)
        .query_one("SELECT metadata FROM checkpoints WHERE checkpoint_id = 'c1'", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        serde_json::from_str::<Value>(&meta).unwrap()["step"],
        2,
        "the batch's metadata is stored"
    );

    // A special write's new value, cut before COMMIT: written again.
    proxy.once(Mode::DropBeforeCommit);
    let out = store.put_graph(&GraphBatch::Writes(vec![wr("t", -1, b"Y")]));
    assert_eq!(proxy.cuts_before_commit(), 2);
    assert!(out.persisted, "{}", out.to_value());
    let value: Vec<u8> = server
        .admin(&db)
        .query_one("SELECT value FROM checkpoint_writes WHERE task_id = 't'", &[])
        .unwrap()
        .get(0);
    assert_eq!(value, b"Y");
}
