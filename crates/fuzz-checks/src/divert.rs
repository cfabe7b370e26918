//! Divert files read back: any bytes as `sessions/<session>.jsonl`, taken
//! through the whole of replay (listing, taking the file, settling every
//! line, the ledger, the move to `settled/`) into a target held in memory,
//! so that a run costs microseconds and the store's own code decides.
//!
//! Properties, for any bytes:
//! - the file's bytes are never changed: a file replay takes ends in
//!   `settled/` byte for byte (quarantined lines intact), and a file it
//!   does not take stays where it was, byte for byte;
//! - a taken file has one ledger entry per line that holds more than
//!   ASCII whitespace, at that line's number and offset, and none for
//!   any other;
//! - a line settled as stored (`replayed`, `duplicate`, `applied`) is
//!   UTF-8 JSON, and what the target holds under its key has the
//!   canonical bytes of the line's own record (`host/src/same.rs`): the
//!   message object (without the uid a version 1 line kept inside it), or
//!   the LangGraph record with the defaults of absent fields; the ledger's
//!   digest is the digest of those bytes;
//! - nothing is stored that no line settled as stored;
//! - a quarantined line has a reason.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use serde_json::{Map, Value, json};
use turnsafe_host::graph::{GraphLine, StoredGraph};
use turnsafe_host::replay::{Lease, ReplayError, ReplayOptions, Row, Target, replay_into};
use turnsafe_host::same::{canonical, canonical_object, canonical_text, digest_bytes};

/// The session every fuzzed file is named for.
pub const SESSION: &str = "s1";

/// What the in-memory target holds.
#[derive(Default)]
struct Held {
    /// Stored message texts by (session, uid).
    messages: BTreeMap<(String, String), String>,
    /// Stored LangGraph records by (kind, uid).
    graph: BTreeMap<(String, String), StoredGraph>,
}

/// Replay's target, in memory: the same effects as the SQLite store's,
/// without a database (message text as the store writes it).
struct Memory(Rc<RefCell<Held>>);

impl Target for Memory {
    fn lease(&mut self, _: &str) -> Result<Option<Lease>, ReplayError> {
        Ok(None)
    }
    fn start(&mut self) -> Result<(), ReplayError> {
        Ok(())
    }
    fn begin(&mut self, _: &str, _: bool) -> Result<(), ReplayError> {
        Ok(())
    }
    fn commit(&mut self) -> Result<(), ReplayError> {
        Ok(())
    }
    fn rollback(&mut self) {}
    fn stored_item(&mut self, session: &str, uid: &str) -> Result<Option<String>, ReplayError> {
        Ok(self.0.borrow().messages.get(&(session.into(), uid.into())).cloned())
    }
    fn cleared_items(&mut self, _: &str, _: &str) -> Result<Vec<String>, ReplayError> {
        Ok(Vec::new())
    }
    fn insert(&mut self, session: &str, uid: &str, _: Option<i64>, row: &Row<'_>) -> Result<bool, ReplayError> {
        let mut held = self.0.borrow_mut();
        let key = (session.to_string(), uid.to_string());
        if held.messages.contains_key(&key) {
            return Ok(false);
        }
        held.messages.insert(key, row.message.item_text());
        Ok(true)
    }
    fn finish(&mut self) -> Result<(), ReplayError> {
        Ok(())
    }
    fn graph_stored(&mut self, line: &GraphLine) -> Result<Option<StoredGraph>, ReplayError> {
        Ok(self.0.borrow().graph.get(&(line.kind().into(), line.uid())).cloned())
    }
    fn graph_put(
        &mut self,
        line: &GraphLine,
        created_ms: i64,
        deleted_ms: Option<i64>,
        over: bool,
    ) -> Result<bool, ReplayError> {
        let mut held = self.0.borrow_mut();
        let key = (line.kind().to_string(), line.uid());
        if held.graph.contains_key(&key) && !over {
            return Ok(false);
        }
        held.graph.insert(
            key,
            StoredGraph {
                record: line.clone(),
                created_ms,
                deleted_ms,
            },
        );
        Ok(true)
    }
}

/// The record a stored line must hold, read from the line's own bytes:
/// (kind, key, canonical text), or `None` when the bytes are not UTF-8
/// JSON holding one.
fn record_of_line(raw: &[u8]) -> Option<(&'static str, String, String)> {
    let Ok(Value::Object(obj)) = turnsafe_host::json_in::value_bytes(raw) else {
        return None;
    };
    let uid = obj.get("uid").and_then(Value::as_str).unwrap_or_default().to_string();
    match obj.get("kind").and_then(Value::as_str) {
        Some(kind @ ("checkpoint" | "write")) => {
            let Some(Value::Object(payload)) = obj.get(kind) else {
                return None;
            };
            // The fields an earlier writer could leave out, as the reader fills them.
            let defaults: &[(&str, Value)] = if kind == "checkpoint" {
                &[
                    ("checkpoint_ns", json!("")),
                    ("parent_checkpoint_id", Value::Null),
                    ("type", Value::Null),
                    ("metadata", json!({})),
                ]
            } else {
                &[
                    ("checkpoint_ns", json!("")),
                    ("task_path", json!("")),
                    ("type", Value::Null),
                ]
            };
            let mut record = payload.clone();
            for (k, v) in defaults {
                if !record.contains_key(*k) {
                    record.insert((*k).to_string(), v.clone());
                }
            }
            let kind = if kind == "checkpoint" { "checkpoint" } else { "write" };
            Some((kind, uid, canonical_object(&record)))
        }
        _ => {
            let Some(Value::Object(message)) = obj.get("message") else {
                return None;
            };
            let mut message: Map<String, Value> = message.clone();
            if obj.get("v").and_then(Value::as_u64) == Some(1) {
                message.remove("uid");
            }
            Some(("message", uid, canonical_object(&message)))
        }
    }
}

/// Replay `bytes` as the divert file of [`SESSION`] in a fresh home under
/// `scratch`, and check every property.
pub fn check_in(scratch: &Path, bytes: &[u8]) -> Result<(), String> {
    let home = tempfile::tempdir_in(scratch).map_err(|e| format!("scratch home: {e}"))?;
    let sessions = home.path().join("sessions");
    std::fs::create_dir(&sessions).map_err(|e| e.to_string())?;
    let name = format!("{SESSION}.jsonl");
    std::fs::write(sessions.join(&name), bytes).map_err(|e| e.to_string())?;
    let held = Rc::new(RefCell::new(Held::default()));
    let target = Memory(held.clone());
    let opts = ReplayOptions {
        force: true,
        ..ReplayOptions::default()
    };
    let run = replay_into(home.path(), &opts, || Ok(Box::new(target) as Box<dyn Target>))
        .map_err(|e| format!("replay failed on a readable file: {e}"))?;

    let settled = sessions.join("settled");
    let taken = !run.files.is_empty();
    if !taken {
        // Not turnsafe's: left where it was, byte for byte, nothing stored.
        let left = std::fs::read(sessions.join(&name)).map_err(|e| format!("the file left alone is gone: {e}"))?;
        if left != bytes {
            return Err("a file replay did not take was changed".into());
        }
        let held = held.borrow();
        if !held.messages.is_empty() || !held.graph.is_empty() {
            return Err("something was stored from a file replay did not take".into());
        }
        return Ok(());
    }
    let report = &run.files[0];
    let moved = report.settled_to.as_deref().ok_or("a taken file was not settled")?;
    if !Path::new(moved).starts_with(&settled) {
        return Err(format!("settled outside settled/: {moved}"));
    }
    let kept = std::fs::read(moved).map_err(|e| format!("the settled file: {e}"))?;
    if kept != bytes {
        return Err("the settled file's bytes are not the divert file's".into());
    }

    // The lines as the bytes hold them: (number, offset, bytes without the newline).
    let mut lines = Vec::new();
    let mut offset = 0usize;
    for (i, piece) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        let body = piece.strip_suffix(b"\n").unwrap_or(piece);
        if !body.trim_ascii().is_empty() {
            lines.push((i as u64 + 1, offset as u64, body));
        }
        offset += piece.len();
    }
    let ledger = std::fs::read(sessions.join("ledger.jsonl")).map_err(|e| format!("ledger.jsonl: {e}"))?;
    let entries: Vec<Value> = ledger
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(turnsafe_host::json_in::value_bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("a ledger line is not JSON: {e}"))?;
    if entries.len() != lines.len() || report.lines != lines.len() as u64 {
        return Err(format!(
            "{} lines hold more than whitespace, the ledger has {} entries, the report {} lines",
            lines.len(),
            entries.len(),
            report.lines
        ));
    }
    let held = held.borrow();
    let mut stored_keys = 0usize;
    for (i, ((number, offset, raw), entry)) in lines.iter().zip(&entries).enumerate() {
        let state = entry["state"].as_str().unwrap_or_default();
        if entry["line"].as_u64() != Some(*number) || entry["offset"].as_u64() != Some(*offset) {
            return Err(format!("ledger entry {entry} is not line {number} at {offset}"));
        }
        match state {
            "replayed" | "duplicate" | "applied" => {
                let Some((kind, key, want)) = record_of_line(raw) else {
                    return Err(format!(
                        "line {number} settled {state} but is not UTF-8 JSON holding a record: {:?}",
                        String::from_utf8_lossy(raw)
                    ));
                };
                let got = if kind == "message" {
                    let text = held
                        .messages
                        .get(&(SESSION.to_string(), key.clone()))
                        .ok_or_else(|| format!("line {number} settled {state}, nothing stored under {key}"))?;
                    canonical_text(text).map_err(|e| format!("stored text is not JSON: {e}"))?
                } else {
                    // A later line of the file may have been applied over it.
                    let replaced_later = entries[i + 1..].iter().any(|e| e["state"] == "applied");
                    let stored = held
                        .graph
                        .iter()
                        .find(|((k, _), g)| *k == kind && canonical(&graph_value(&g.record)) == want)
                        .map(|(_, g)| canonical(&graph_value(&g.record)));
                    match stored {
                        Some(text) => text,
                        None if replaced_later => want.clone(),
                        None => {
                            return Err(format!(
                                "line {number} settled {state}, no stored {kind} has its bytes {want}"
                            ));
                        }
                    }
                };
                if got != want {
                    return Err(format!(
                        "line {number} settled {state}, stored bytes differ:\n stored {got}\n line   {want}"
                    ));
                }
                if entry["digest"].as_str() != Some(digest_bytes(want.as_bytes()).as_str()) {
                    return Err(format!(
                        "line {number}: the ledger's digest is not its bytes' ({entry})"
                    ));
                }
                if state != "duplicate" {
                    stored_keys += 1;
                }
            }
            "quarantined" | "conflict" | "superseded" => {
                if entry["reason"].as_str().is_none_or(str::is_empty) && state != "superseded" {
                    return Err(format!("line {number} {state} without a reason"));
                }
            }
            other => return Err(format!("line {number}: unexpected state {other:?}")),
        }
    }
    // Stored keys: at most one per line settled as stored (a later
    // `applied` may replace an earlier one's key).
    let held_n = held.messages.len() + held.graph.len();
    if held_n > stored_keys {
        return Err(format!(
            "{held_n} records stored, only {stored_keys} lines settled as stored"
        ));
    }
    Ok(())
}

fn graph_value(line: &GraphLine) -> Value {
    match line {
        GraphLine::Checkpoint(c) => json!(c),
        GraphLine::Write(w) => json!(w),
    }
}

/// [`check_in`] under the system's temporary folder (`TMPDIR`).
pub fn check(bytes: &[u8]) -> Result<(), String> {
    check_in(&std::env::temp_dir(), bytes)
}

/// Lines alone, through the readers that sort files by owner: whether a
/// line is a divert line for the session never panics, a file has one
/// exactly when one of its lines (trimmed of ASCII whitespace) is one,
/// and a divert line is UTF-8 JSON (a file holding it is taken whole by
/// replay).
pub fn check_line(bytes: &[u8]) -> Result<(), String> {
    let has = turnsafe_host::divert_files::has_divert_line(bytes, SESSION).map_err(|e| e.to_string())?;
    let mut any = false;
    for line in bytes.split(|b| *b == b'\n') {
        let line = line.trim_ascii();
        if turnsafe_host::divert_files::is_divert_line(line, SESSION) {
            any = true;
            if turnsafe_host::json_in::value_bytes(line).is_err() {
                return Err("a divert line that is not JSON".into());
            }
        }
    }
    if has != any {
        return Err(format!("has_divert_line says {has}, the lines say {any}"));
    }
    Ok(())
}
