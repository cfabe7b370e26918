//! The recount's own reader. What the test sent is kept as the test wrote
//! it; what a database, a divert file or a receipt's range holds is read
//! with the test's own rusqlite queries, JSON parsing and sha256, never
//! with turnsafe's readers, and compared by bytes: a message's stored
//! `item` with the object sent, a checkpoint's blob, type, parent and
//! metadata, a write's value, channel, type and task path, in the test's
//! own canonical text (sorted keys, no whitespace: the records are plain
//! ASCII objects). What was acknowledged live must not be marked deleted.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{Value, json};
use turnsafe_host::divert::Receipt;
use turnsafe_host::graph::{CheckpointRecord, WriteRecord};

/// A record's key: (session, uid) for a message, (thread id, uid) for a
/// LangGraph checkpoint or write (`checkpoint:<ns>:<id>`,
/// `write:<ns>:<id>:<task>:<idx>`, as `docs/DIVERT.md` names them).
pub type Key = (String, String);

/// A record as the test sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    /// A message: the JSON object handed to the store.
    Message(Value),
    Checkpoint(CheckpointRecord),
    Write(WriteRecord),
}

/// The key of a checkpoint the test sends.
pub fn checkpoint_key(c: &CheckpointRecord) -> Key {
    (
        c.thread_id.clone(),
        format!("checkpoint:{}:{}", c.checkpoint_ns, c.checkpoint_id),
    )
}

/// The key of a write the test sends.
pub fn write_key(w: &WriteRecord) -> Key {
    (
        w.thread_id.clone(),
        format!("write:{}:{}:{}:{}", w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx),
    )
}
#[path = "../common/canonical.rs"]
mod canonical_text;
pub use canonical_text::{canonical, sha256_hex};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A blob, shown by its length and digest.
fn blob(bytes: &[u8]) -> String {
    format!("{} bytes, sha256 {}", bytes.len(), &sha256_hex(bytes)[..16])
}

/// The object a divert line carries for a record, as `docs/DIVERT.md`
/// describes it: the message itself; a checkpoint's or a write's fields,
/// blobs in base64.
fn line_payload(sent: &Sent) -> (&'static str, Value) {
    match sent {
        Sent::Message(m) => ("message", m.clone()),
        Sent::Checkpoint(c) => (
            "checkpoint",
            json!({
                "thread_id": c.thread_id, "checkpoint_ns": c.checkpoint_ns, "checkpoint_id": c.checkpoint_id,
                "parent_checkpoint_id": c.parent_checkpoint_id, "type": c.kind,
                "checkpoint": b64(&c.checkpoint), "metadata": c.metadata,
            }),
        ),
        Sent::Write(w) => (
            "write",
            json!({
                "thread_id": w.thread_id, "checkpoint_ns": w.checkpoint_ns, "checkpoint_id": w.checkpoint_id,
                "task_id": w.task_id, "task_path": w.task_path, "idx": w.idx, "channel": w.channel,
                "type": w.kind, "value": b64(&w.value),
            }),
        ),
    }
}

/// A row read back from a database.
#[derive(Debug, Clone)]
pub enum Row {
    Message {
        item: String,
    },
    Checkpoint {
        parent: Option<String>,
        kind: Option<String>,
        blob: Vec<u8>,
        metadata: String,
        deleted_ms: Option<i64>,
    },
    Write {
        task_path: String,
        channel: String,
        kind: Option<String>,
        value: Vec<u8>,
        deleted_ms: Option<i64>,
    },
}

/// Whether `row` holds exactly what was sent; otherwise what differs.
pub fn row_holds(row: &Row, sent: &Sent) -> Result<(), String> {
    let mut diff = Vec::new();
    match (row, sent) {
        (Row::Message { item }, Sent::Message(m)) => {
            let stored = serde_json::from_str::<Value>(item)
                .map(|v| canonical(&v))
                .unwrap_or_else(|e| format!("<not JSON: {e}>"));
            if stored != canonical(m) {
                diff.push(format!("item {stored}, sent {}", canonical(m)));
            }
        }
        (
            Row::Checkpoint {
                parent,
                kind,
                blob: b,
                metadata,
                deleted_ms,
            },
            Sent::Checkpoint(c),
        ) => {
            if b != &c.checkpoint {
                diff.push(format!("blob {}, sent {}", blob(b), blob(&c.checkpoint)));
            }
            if kind != &c.kind {
                diff.push(format!("type {kind:?}, sent {:?}", c.kind));
            }
            if parent != &c.parent_checkpoint_id {
                diff.push(format!("parent {parent:?}, sent {:?}", c.parent_checkpoint_id));
            }
            let stored = serde_json::from_str::<Value>(metadata).map(|v| canonical(&v)).ok();
            if stored != Some(canonical(&c.metadata)) {
                diff.push(format!("metadata {metadata}, sent {}", canonical(&c.metadata)));
            }
            if let Some(ms) = deleted_ms {
                diff.push(format!("marked deleted at {ms}"));
            }
        }
        (
            Row::Write {
                task_path,
                channel,
                kind,
                value,
                deleted_ms,
            },
            Sent::Write(w),
        ) => {
            if value != &w.value {
                diff.push(format!("value {}, sent {}", blob(value), blob(&w.value)));
            }
            if channel != &w.channel {
                diff.push(format!("channel {channel:?}, sent {:?}", w.channel));
            }
            if kind != &w.kind {
                diff.push(format!("type {kind:?}, sent {:?}", w.kind));
            }
            if task_path != &w.task_path {
                diff.push(format!("task_path {task_path:?}, sent {:?}", w.task_path));
            }
            if let Some(ms) = deleted_ms {
                diff.push(format!("marked deleted at {ms}"));
            }
        }
        (row, _) => diff.push(format!("a row of another kind: {row:?}")),
    }
    if diff.is_empty() { Ok(()) } else { Err(diff.join("; ")) }
}

/// A divert line (parsed by the test) against the record sent under `key`:
/// its uid, its session (`session`: the file's), its kind and version, and
/// its payload's canonical text.
pub fn line_holds(line: &Value, key: &Key, session: &str, sent: &Sent) -> Result<(), String> {
    let mut diff = Vec::new();
    if line["uid"].as_str() != Some(key.1.as_str()) {
        diff.push(format!("uid {}, sent {:?}", line["uid"], key.1));
    }
    if line["session"].as_str() != Some(session) {
        diff.push(format!("session {}, the file's is {session:?}", line["session"]));
    }
    let (field, payload) = line_payload(sent);
    let (v, kind) = match sent {
        Sent::Message(_) => (2, None),
        Sent::Checkpoint(_) | Sent::Write(_) => (3, Some(field)),
    };
    if line["v"].as_i64() != Some(v) || line["kind"].as_str() != kind {
        diff.push(format!(
            "v {} kind {}, a {field} line is v {v}",
            line["v"], line["kind"]
        ));
    }
    let have = canonical(&line[field]);
    if have != canonical(&payload) {
        diff.push(format!("{field} {have}, sent {}", canonical(&payload)));
    }
    if diff.is_empty() { Ok(()) } else { Err(diff.join("; ")) }
}

/// What a database holds: its live rows by key, and its archived messages
/// by key with their reason.
#[derive(Debug, Default)]
pub struct Stored {
    pub rows: BTreeMap<Key, Vec<Row>>,
    pub archived: BTreeMap<Key, Vec<(Row, String)>>,
}

impl Stored {
    pub fn count(&self, k: &Key) -> u64 {
        self.rows.get(k).map_or(0, |r| r.len() as u64)
    }

    /// The archived copies of `k` with this reason.
    pub fn archived(&self, k: &Key, reason: &str) -> Vec<&Row> {
        self.archived
            .get(k)
            .into_iter()
            .flatten()
            .filter(|(_, r)| r == reason)
            .map(|(row, _)| row)
            .collect()
    }

    /// Every live row of `k` holds `sent`: the first that does not, or
    /// none when there is no row.
    pub fn holds(&self, k: &Key, sent: &Sent) -> Result<(), String> {
        for row in self.rows.get(k).into_iter().flatten() {
            row_holds(row, sent)?;
        }
        Ok(())
    }

    /// Another database's rows (a capture's) beside these.
    pub fn extend(&mut self, other: Stored) {
        for (k, rows) in other.rows {
            self.rows.entry(k).or_default().extend(rows);
        }
        for (k, rows) in other.archived {
            self.archived.entry(k).or_default().extend(rows);
        }
    }
}

fn has(c: &rusqlite::Connection, kind: &str, name: &str) -> Result<bool, rusqlite::Error> {
    c.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = ?1 AND name = ?2",
        [kind, name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

fn has_column(c: &rusqlite::Connection, table: &str, column: &str) -> Result<bool, rusqlite::Error> {
    c.query_row(
        "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// A message row's item: the `item` column, or, in a schema v2 table
/// that has none, the object its columns are (`docs/STORAGE.md`): the
/// fields of `extra`, `role`, and `content` (its JSON text parsed when
/// `content_json` says so).
fn item_of(
    item: Option<String>,
    role: Option<String>,
    content: Option<String>,
    json: i64,
    extra: Option<String>,
) -> String {
    if let Some(item) = item {
        return item;
    }
    let mut object = extra
        .and_then(|e| serde_json::from_str::<serde_json::Map<String, Value>>(&e).ok())
        .unwrap_or_default();
    let content = match content {
        Some(text) if json != 0 => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        other => json!(other),
    };
    object.insert("role".into(), json!(role));
    object.insert("content".into(), content);
    Value::Object(object).to_string()
}

/// Every message and LangGraph row of the database at `db`, read with the
/// test's own read-only connection. No file, or no schema yet: nothing.
pub fn read(db: &Path) -> Result<Stored, String> {
    let mut stored = Stored::default();
    if !db.is_file() {
        return Ok(stored);
    }
    let err = |e: rusqlite::Error| format!("read {}: {e}", db.display());
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("open {} read-only: {e}", db.display()))?;
    c.busy_timeout(std::time::Duration::from_secs(5)).map_err(err)?;
    for (table, live) in [("messages", true), ("archive", false)] {
        if !has(&c, "table", table).map_err(err)? {
            continue;
        }
        // Schema v2: no `item`, the object in `role`, `content`,
        // `content_json` and `extra`.
        let columns = if has_column(&c, table, "item").map_err(err)? {
            "item, NULL, NULL, 0, NULL"
        } else {
            "NULL, role, content, content_json, extra"
        };
        let reason = if live { "NULL" } else { "reason" };
        let sql = format!("SELECT session_id, uid, {reason}, {columns} FROM {table}");
        let mut q = c.prepare(&sql).map_err(err)?;
        let rows = q
            .query_map([], |r| {
                Ok((
                    (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                    item_of(r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?),
                    r.get::<_, Option<String>>(2)?,
                ))
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(err)?;
        for (key, item, reason) in rows {
            let row = Row::Message { item };
            match reason {
                None => stored.rows.entry(key).or_default().push(row),
                Some(reason) => stored.archived.entry(key).or_default().push((row, reason)),
            }
        }
    }
    if has(&c, "table", "checkpoints").map_err(err)? {
        let mut q = c
            .prepare(
                "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
                        metadata, deleted_ms FROM checkpoints",
            )
            .map_err(err)?;
        let rows = q
            .query_map([], |r| {
                let key = (
                    r.get::<_, String>(0)?,
                    format!("checkpoint:{}:{}", r.get::<_, String>(1)?, r.get::<_, String>(2)?),
                );
                Ok((
                    key,
                    Row::Checkpoint {
                        parent: r.get(3)?,
                        kind: r.get(4)?,
                        blob: r.get(5)?,
                        metadata: r.get(6)?,
                        deleted_ms: r.get(7)?,
                    },
                ))
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(err)?;
        for (key, row) in rows {
            stored.rows.entry(key).or_default().push(row);
        }
    }
    if has(&c, "table", "checkpoint_writes").map_err(err)? {
        let mut q = c
            .prepare(
                "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value,
                        deleted_ms FROM checkpoint_writes",
            )
            .map_err(err)?;
        let rows = q
            .query_map([], |r| {
                let key = (
                    r.get::<_, String>(0)?,
                    format!(
                        "write:{}:{}:{}:{}",
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?
                    ),
                );
                Ok((
                    key,
                    Row::Write {
                        task_path: r.get(5)?,
                        channel: r.get(6)?,
                        kind: r.get(7)?,
                        value: r.get(8)?,
                        deleted_ms: r.get(9)?,
                    },
                ))
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(err)?;
        for (key, row) in rows {
            stored.rows.entry(key).or_default().push(row);
        }
    }
    Ok(stored)
}

/// The key a divert line (parsed by the test) is for: a message's
/// (session, uid), a LangGraph record's (thread id, uid).
pub fn line_key(line: &Value) -> Option<Key> {
    let uid = line["uid"].as_str()?.to_string();
    match line["kind"].as_str() {
        Some(kind @ ("checkpoint" | "write")) => Some((line[kind]["thread_id"].as_str()?.to_string(), uid)),
        _ => Some((line["session"].as_str()?.to_string(), uid)),
    }
}

/// Every line still pending under `home`: in a divert file of `sessions/`
/// or a file of `sessions/settling/` (which replay settles whole, whatever
/// the ledger says), by key, with the file's session. A line that does not
/// parse (a torn tail) is nobody's.
pub fn pending(home: &Path) -> Result<BTreeMap<Key, Vec<(Value, String)>>, String> {
    let mut out: BTreeMap<Key, Vec<(Value, String)>> = BTreeMap::new();
    let sessions = home.join("sessions");
    for dir in [sessions.clone(), sessions.join("settling")] {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("list {}: {e}", dir.display())),
        };
        for entry in entries {
            let path = entry.map_err(|e| format!("list {}: {e}", dir.display()))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if !path.is_file() || !name.ends_with(".jsonl") || name == "ledger.jsonl" {
                continue;
            }
            // `<session>.jsonl`, or `<session>@<stamp>.jsonl` once taken.
            let session = name.trim_end_matches(".jsonl").split('@').next().unwrap_or_default();
            let data = std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
            for raw in data.split(|b| *b == b'\n') {
                if let Ok(line) = serde_json::from_slice::<Value>(raw)
                    && let Some(key) = line_key(&line)
                {
                    out.entry(key).or_default().push((line, session.to_string()));
                }
            }
        }
    }
    Ok(out)
}

/// Whether the file at `path` holds the receipt's range: its bytes hash
/// to the receipt's sha256 (computed here), start and end at line
/// boundaries, and are `count` lines, each the record sent under its key.
fn receipt_in(path: &Path, r: &Receipt, keys: &[Key], sent: &BTreeMap<Key, Sent>) -> Result<(), String> {
    let data = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let (start, end) = (r.offset as usize, (r.offset + r.length) as usize);
    let range = data.get(start..end).ok_or_else(|| {
        format!(
            "{} is {} bytes, short of the range [{start}, {end})",
            path.display(),
            data.len()
        )
    })?;
    let digest = sha256_hex(range);
    if digest != r.sha256 {
        return Err(format!(
            "the bytes [{start}, {end}) of {} hash to {digest}, the receipt says {}",
            path.display(),
            r.sha256
        ));
    }
    if (start > 0 && data[start - 1] != b'\n') || !range.ends_with(b"\n") {
        return Err(format!(
            "[{start}, {end}) of {} does not start and end at a line's end",
            path.display()
        ));
    }
    let lines: Vec<&[u8]> = range[..range.len() - 1].split(|b| *b == b'\n').collect();
    if lines.len() as u64 != r.count || lines.len() != keys.len() {
        return Err(format!(
            "[{start}, {end}) of {} holds {} lines; the receipt says {}, the batch had {}",
            path.display(),
            lines.len(),
            r.count,
            keys.len()
        ));
    }
    // The file's session: its name in `sessions/`, as the receipt gives it.
    let session = Path::new(&r.path)
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.trim_end_matches(".jsonl").to_string())
        .unwrap_or_default();
    for (i, (raw, key)) in lines.iter().zip(keys).enumerate() {
        let line: Value = serde_json::from_slice(raw)
            .map_err(|e| format!("line {i} of the receipt's range in {}: {e}", path.display()))?;
        let record = sent.get(key).ok_or_else(|| format!("{key:?} was never sent"))?;
        line_holds(&line, key, &session, record)
            .map_err(|d| format!("line {i} of the receipt's range in {}, {key:?}: {d}", path.display()))?;
    }
    Ok(())
}

/// Does the receipt's file, at its path or where replay or a clear moved
/// it (`settling/`, `settled/`), hold the receipt's range, each line the
/// record sent? `Err` says what the file at the receipt's path holds.
pub fn receipt_holds(home: &Path, r: &Receipt, keys: &[Key], sent: &BTreeMap<Key, Sent>) -> Result<(), String> {
    let at_path = receipt_in(Path::new(&r.path), r, keys, sent);
    if at_path.is_ok() {
        return Ok(());
    }
    let mut moved: Vec<PathBuf> = Vec::new();
    for dir in ["sessions/settling", "sessions/settled"] {
        if let Ok(entries) = std::fs::read_dir(home.join(dir)) {
            moved.extend(entries.flatten().map(|e| e.path()));
        }
    }
    if moved.iter().any(|p| receipt_in(p, r, keys, sent).is_ok()) {
        return Ok(());
    }
    at_path.map_err(|e| format!("{e} (and no file in settling/ or settled/ holds the range)"))
}
