//! LangGraph checkpoints and pending writes, kept beside the transcripts.
//!
//! A LangGraph checkpointer stores two things per thread: checkpoints
//! (the graph's state after a step, an opaque blob from the graph's
//! serializer, with JSON metadata) and the pending writes of the tasks
//! of the next step. turnsafe stores both through the same flush machine
//! as a turn's messages: a [`GraphBatch`] (one checkpoint, or one task's
//! writes) ends committed, diverted with a receipt, or handed back.
//!
//! Keys, as LangGraph uses them:
//! - a checkpoint is `(thread_id, checkpoint_ns, checkpoint_id)`; its id
//!   is a UUIDv6, so ids sort in time order and "newest" is the greatest;
//! - a write is `(thread_id, checkpoint_ns, checkpoint_id, task_id, idx)`;
//!   special writes (errors, interrupts) have negative `idx` and replace
//!   what they meet, ordinary ones keep the first copy.
//!
//! The flush machine's "session" for a graph batch is the thread's safe
//! id ([`thread_session`]): the divert file is named by it, and the
//! machine's uids are the keys above ([`GraphBatch::uids`]). Deletes only
//! mark rows (`deleted_ms`): every read leaves them out, and `turnsafe
//! prune` removes them for good (`docs/LANGGRAPH.md`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::ids::{SessionId, thread_session};

/// The divert line format of a graph line (`docs/DIVERT.md`).
pub const FORMAT_VERSION: u64 = 3;

/// Blobs travel as base64 in JSON (divert lines, `show --thread --json`).
mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }

    pub fn encode(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }
}

pub use b64::encode as base64_encode;

/// One checkpoint, as a saver hands it over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub thread_id: String,
    #[serde(default)]
    pub checkpoint_ns: String,
    pub checkpoint_id: String,
    #[serde(default)]
    pub parent_checkpoint_id: Option<String>,
    /// The serializer's type tag (`msgpack`, `json`, `encrypted...`).
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// The serialized checkpoint, as the serializer made it.
    #[serde(with = "b64")]
    pub checkpoint: Vec<u8>,
    /// The checkpoint's metadata: a JSON object (filters read it).
    #[serde(default = "empty_object")]
    pub metadata: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

impl CheckpointRecord {
    /// `metadata.run_id`, which `delete_for_runs` selects by.
    pub fn run_id(&self) -> Option<&str> {
        self.metadata.get("run_id").and_then(Value::as_str)
    }

    /// The machine's uid of this checkpoint.
    pub fn uid(&self) -> String {
        format!("checkpoint:{}:{}", self.checkpoint_ns, self.checkpoint_id)
    }

    /// The digest of its canonical bytes ([`crate::same`]): every field,
    /// the blob as base64, as its divert line carries it.
    pub fn digest(&self) -> String {
        crate::same::digest(&json!(self))
    }
}

/// One pending write of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteRecord {
    pub thread_id: String,
    #[serde(default)]
    pub checkpoint_ns: String,
    pub checkpoint_id: String,
    pub task_id: String,
    #[serde(default)]
    pub task_path: String,
    /// The write's index in its task, or LangGraph's negative index of a
    /// special write (`WRITES_IDX_MAP`).
    pub idx: i64,
    pub channel: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(with = "b64")]
    pub value: Vec<u8>,
}

impl WriteRecord {
    /// Special writes (errors, interrupts, ...) replace what they meet.
    pub fn is_special(&self) -> bool {
        self.idx < 0
    }

    /// The digest of its canonical bytes ([`crate::same`]).
    pub fn digest(&self) -> String {
        crate::same::digest(&json!(self))
    }

    /// The machine's uid of this write.
    pub fn uid(&self) -> String {
        format!(
            "write:{}:{}:{}:{}",
            self.checkpoint_ns, self.checkpoint_id, self.task_id, self.idx
        )
    }
}

/// What one flush of a graph stores: a checkpoint, or one task's writes.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphBatch {
    Checkpoint(CheckpointRecord),
    Writes(Vec<WriteRecord>),
}

impl GraphBatch {
    /// The thread the batch belongs to (every write of a batch shares it).
    pub fn thread_id(&self) -> &str {
        match self {
            GraphBatch::Checkpoint(c) => &c.thread_id,
            GraphBatch::Writes(w) => w.first().map_or("", |w| w.thread_id.as_str()),
        }
    }

    /// The uids the flush machine tracks, one per record.
    pub fn uids(&self) -> Vec<String> {
        match self {
            GraphBatch::Checkpoint(c) => vec![c.uid()],
            GraphBatch::Writes(w) => w.iter().map(WriteRecord::uid).collect(),
        }
    }

    /// How many records the batch holds.
    pub fn len(&self) -> usize {
        match self {
            GraphBatch::Checkpoint(_) => 1,
            GraphBatch::Writes(w) => w.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes it adds to a group (blobs and keys).
    pub fn encoded_len(&self) -> usize {
        match self {
            GraphBatch::Checkpoint(c) => c.checkpoint.len() + 256,
            GraphBatch::Writes(w) => w.iter().map(|w| w.value.len() + 128).sum(),
        }
    }

    /// The divert lines' payloads: `(kind, uid, record)`.
    pub fn lines(&self) -> Vec<(&'static str, String, Value)> {
        match self {
            GraphBatch::Checkpoint(c) => vec![("checkpoint", c.uid(), json!(c))],
            GraphBatch::Writes(w) => w.iter().map(|w| ("write", w.uid(), json!(w))).collect(),
        }
    }
}

/// A graph line read back from a divert file.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphLine {
    Checkpoint(CheckpointRecord),
    Write(WriteRecord),
}

impl GraphLine {
    /// Read a line of version 3 whose `kind` is `checkpoint` or `write`;
    /// `None` when the line is not one (a message line, say), `Err` with
    /// the reason when it is one that cannot be read.
    pub fn parse(obj: &Map<String, Value>, session: &str) -> Option<Result<GraphLine, &'static str>> {
        let kind = obj.get("kind").and_then(Value::as_str)?;
        if !matches!(kind, "checkpoint" | "write") {
            return None;
        }
        Some((|| {
            if obj.get("v").and_then(Value::as_u64) != Some(FORMAT_VERSION) {
                return Err("unsupported or missing format version `v`");
            }
            if obj.get("session").and_then(Value::as_str) != Some(session) {
                return Err("line belongs to another session");
            }
            // A field this turnsafe does not know would be dropped by the
            // import: the line is set aside whole, never stored without it.
            let known: &[&str] = match kind {
                "checkpoint" => &[
                    "thread_id",
                    "checkpoint_ns",
                    "checkpoint_id",
                    "parent_checkpoint_id",
                    "type",
                    "checkpoint",
                    "metadata",
                ],
                _ => &[
                    "thread_id",
                    "checkpoint_ns",
                    "checkpoint_id",
                    "task_id",
                    "task_path",
                    "idx",
                    "channel",
                    "type",
                    "value",
                ],
            };
            if let Some(Value::Object(record)) = obj.get(kind)
                && record.keys().any(|k| !known.contains(&k.as_str()))
            {
                return Err("the record holds a field this turnsafe does not know");
            }
            let line = match kind {
                "checkpoint" => obj
                    .get("checkpoint")
                    .cloned()
                    .and_then(|v| serde_json::from_value::<CheckpointRecord>(v).ok())
                    .map(GraphLine::Checkpoint)
                    .ok_or("`checkpoint` is missing or cannot be read")?,
                _ => obj
                    .get("write")
                    .cloned()
                    .and_then(|v| serde_json::from_value::<WriteRecord>(v).ok())
                    .map(GraphLine::Write)
                    .ok_or("`write` is missing or cannot be read")?,
            };
            if thread_session(line.thread_id()) != session {
                return Err("the record's thread is not the file's");
            }
            if !line.metadata_ok() {
                return Err("checkpoint metadata is not a JSON object");
            }
            // The record as read must hold the line's bytes (absent fields
            // read as their defaults): a number the typed reading rewrites
            // (`-0` as an index) would be stored as other bytes.
            if let Some(Value::Object(written)) = obj.get(kind)
                && !line.reads_back_as(written)
            {
                return Err("the record does not read back as its bytes");
            }
            Ok(line)
        })())
    }

    /// Whether this record, read from `written`, has its canonical bytes.
    fn reads_back_as(&self, written: &Map<String, Value>) -> bool {
        let (mut written, defaults, read) = match self {
            GraphLine::Checkpoint(c) => (
                written.clone(),
                &[
                    ("checkpoint_ns", json!("")),
                    ("parent_checkpoint_id", Value::Null),
                    ("type", Value::Null),
                    ("metadata", json!({})),
                ][..],
                json!(c),
            ),
            GraphLine::Write(w) => (
                written.clone(),
                &[
                    ("checkpoint_ns", json!("")),
                    ("task_path", json!("")),
                    ("type", Value::Null),
                ][..],
                json!(w),
            ),
        };
        for (k, v) in defaults {
            written.entry(*k).or_insert_with(|| v.clone());
        }
        crate::same::canonical_object(&written) == crate::same::canonical(&read)
    }

    pub fn thread_id(&self) -> &str {
        match self {
            GraphLine::Checkpoint(c) => &c.thread_id,
            GraphLine::Write(w) => &w.thread_id,
        }
    }

    fn metadata_ok(&self) -> bool {
        match self {
            GraphLine::Checkpoint(c) => c.metadata.is_object(),
            GraphLine::Write(_) => true,
        }
    }

    pub fn uid(&self) -> String {
        match self {
            GraphLine::Checkpoint(c) => c.uid(),
            GraphLine::Write(w) => w.uid(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            GraphLine::Checkpoint(_) => "checkpoint",
            GraphLine::Write(_) => "write",
        }
    }

    /// The digest of the record's canonical bytes ([`crate::same`]): every
    /// field, the blob as base64, as its divert line carries it.
    pub fn digest(&self) -> String {
        match self {
            GraphLine::Checkpoint(c) => c.digest(),
            GraphLine::Write(w) => w.digest(),
        }
    }

    /// Whether a put of it replaces what its key holds: a checkpoint, or
    /// a special write (an ordinary write keeps the first copy).
    pub fn replaces(&self) -> bool {
        match self {
            GraphLine::Checkpoint(_) => true,
            GraphLine::Write(w) => w.is_special(),
        }
    }
}

/// The row stored under a record's key, marked or not: the record, when
/// the put that stored it was made, and when a delete marked it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredGraph {
    pub record: GraphLine,
    pub created_ms: i64,
    pub deleted_ms: Option<i64>,
}

/// Whether a divert line (already parsed as an object) is a graph line of
/// this format for `session`: `v` 3, `kind` `checkpoint` with a
/// `checkpoint` object or `write` with a `write` object, a `uid`.
pub fn is_graph_line(obj: &Map<String, Value>, session: &str) -> bool {
    let payload = match obj.get("kind").and_then(Value::as_str) {
        Some("checkpoint") => "checkpoint",
        Some("write") => "write",
        _ => return false,
    };
    obj.get("v").and_then(Value::as_u64) == Some(FORMAT_VERSION)
        && obj.get("session").and_then(Value::as_str) == Some(session)
        && obj.get("uid").is_some_and(Value::is_string)
        && obj.get(payload).is_some_and(Value::is_object)
}

/// Which checkpoints a read wants, as LangGraph's `list` and `get_tuple`
/// ask: every field given narrows it; newest first.
#[derive(Debug, Clone, Default)]
pub struct GraphQuery {
    pub thread_id: Option<String>,
    /// `None`: every namespace.
    pub checkpoint_ns: Option<String>,
    pub checkpoint_id: Option<String>,
    /// Only checkpoints whose id sorts before this one.
    pub before: Option<String>,
    /// Metadata keys and the values they must hold (`null` also matches a
    /// missing key, as LangGraph's SQLite saver does).
    pub filter: Map<String, Value>,
    pub limit: Option<u64>,
}

impl GraphQuery {
    /// Whether a checkpoint's metadata passes the filter.
    pub fn matches(&self, metadata: &Value) -> bool {
        self.filter.iter().all(|(k, want)| match metadata.get(k) {
            None => want.is_null(),
            Some(have) => same_value(have, want),
        })
    }
}

/// JSON equality where numbers compare by value (`1` and `1.0` agree).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64().is_some_and(|x| Some(x) == y.as_f64()),
        _ => a == b,
    }
}

/// A stored checkpoint with its pending writes (in LangGraph's order:
/// task path, task id, idx).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCheckpoint {
    pub record: CheckpointRecord,
    pub writes: Vec<WriteRecord>,
    pub created_ms: i64,
}

impl StoredCheckpoint {
    /// `show --thread --json`'s row: LangGraph's field names, blobs as
    /// base64.
    pub fn to_value(&self) -> Value {
        let c = &self.record;
        json!({
            "thread_id": c.thread_id,
            "checkpoint_ns": c.checkpoint_ns,
            "checkpoint_id": c.checkpoint_id,
            "parent_checkpoint_id": c.parent_checkpoint_id,
            "type": c.kind,
            "checkpoint": base64_encode(&c.checkpoint),
            "metadata": c.metadata,
            "created_ms": self.created_ms,
            "pending_writes": self.writes.iter().map(|w| json!({
                "task_id": w.task_id,
                "task_path": w.task_path,
                "idx": w.idx,
                "channel": w.channel,
                "type": w.kind,
                "value": base64_encode(&w.value),
            })).collect::<Vec<_>>(),
        })
    }
}

/// A delete or copy of graph state, as LangGraph's savers name them.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphEdit {
    /// `delete_thread`: every checkpoint and write of the thread.
    DeleteThread(String),
    /// `delete_for_runs`: the checkpoints whose `metadata.run_id` is one of
    /// these, and their writes.
    DeleteRuns(Vec<String>),
    /// `prune`: per thread, keep only the newest checkpoint of each
    /// namespace (`keep_latest`) or nothing.
    Prune { threads: Vec<String>, keep_latest: bool },
    /// `copy_thread`: every checkpoint and write of `from` under `to`.
    Copy { from: String, to: String },
}

impl GraphEdit {
    /// The edit's name in the policy's copy.
    pub fn name(&self) -> &'static str {
        match self {
            GraphEdit::DeleteThread(_) | GraphEdit::DeleteRuns(_) => "delete",
            GraphEdit::Prune { .. } => "prune",
            GraphEdit::Copy { .. } => "fork",
        }
    }

    /// The session the edit is reported under: the thread's safe id, or
    /// `langgraph` for an edit of several threads.
    pub fn session(&self) -> SessionId {
        match self {
            GraphEdit::DeleteThread(t) => SessionId::graph(t),
            GraphEdit::Copy { to, .. } => SessionId::graph(to),
            GraphEdit::Prune { threads, .. } if threads.len() == 1 => SessionId::graph(&threads[0]),
            _ => SessionId::graph("langgraph"),
        }
    }
}

/// What a graph edit changed: checkpoints and writes marked deleted, or
/// copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GraphEdited {
    pub checkpoints: u64,
    pub writes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp() -> CheckpointRecord {
        CheckpointRecord {
            thread_id: "t 1".into(),
            checkpoint_ns: "child:1".into(),
            checkpoint_id: "1ef".into(),
            parent_checkpoint_id: None,
            kind: Some("msgpack".into()),
            checkpoint: vec![0, 159, 255, 10],
            metadata: json!({"step": 1, "run_id": "r"}),
        }
    }

    #[test]
    fn a_checkpoint_line_round_trips_with_its_blob_as_base64() {
        let c = cp();
        let session = thread_session(&c.thread_id);
        let lines = GraphBatch::Checkpoint(c.clone()).lines();
        let (kind, uid, payload) = &lines[0];
        assert_eq!(payload["checkpoint"], json!("AJ//Cg=="));
        let line = json!({"v": 3, "kind": kind, "session": session, "uid": uid, "checkpoint": payload});
        let obj = line.as_object().unwrap();
        assert!(is_graph_line(obj, &session));
        assert_eq!(GraphLine::parse(obj, &session), Some(Ok(GraphLine::Checkpoint(c))));
        assert!(matches!(GraphLine::parse(obj, "other"), Some(Err(_))));
    }

    #[test]
    fn a_message_line_is_not_a_graph_line() {
        let line = json!({"v": 2, "session": "s", "uid": "u", "message": {}});
        assert_eq!(GraphLine::parse(line.as_object().unwrap(), "s"), None);
        assert!(!is_graph_line(line.as_object().unwrap(), "s"));
    }

    #[test]
    fn filters_match_as_the_sqlite_saver_does() {
        let q = GraphQuery {
            filter: [("step".to_string(), json!(1)), ("gone".to_string(), Value::Null)]
                .into_iter()
                .collect(),
            ..GraphQuery::default()
        };
        assert!(q.matches(&json!({"step": 1.0})));
        assert!(!q.matches(&json!({"step": 2})));
        assert!(!q.matches(&json!({"step": 1, "gone": 3})));
    }
}
