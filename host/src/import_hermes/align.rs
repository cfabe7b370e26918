//! Which lines of a Hermes divert file, and which entries of its snapshot,
//! a session already holds.
//!
//! Hermes leaves little evidence for it: no uid, no sequence number, and a
//! text that says "continue" or an assistant's tool call without content
//! is said many times in a transcript. Two messages with the same words
//! are not the same message; so the place in the sequence decides, and
//! the bytes:
//!
//! - **A divert file** (`sessions/<id>.jsonl`) is a run of messages the
//!   database did not take, written after the rows it had. Where the run
//!   joins the rows, its first lines may be the last rows again (a batch
//!   the database had taken, sent again). A line is the same as a row only
//!   when, at that join, its canonical bytes equal the row's
//!   ([`crate::same`]). The join is the longest overlap of the run's start
//!   with the rows' end in which every line is either the same as its row
//!   or says what it says ([`Record::gist`]: role, content, tool calls and
//!   the tool call answered); a line of the overlap that only says the same
//!   cannot be told apart from its row (a resend with other bytes, or the
//!   user saying it again): it is imported and marked. A line whose bytes
//!   an earlier line of the same file already had is marked too (the
//!   same batch diverted twice, or the same words twice). Every other line
//!   extends the rows.
//! - **A snapshot** (`sessions/session_<id>.json`) is the whole transcript,
//!   rewritten every turn, its content cleaned and redacted
//!   ([`super::clean`]): its bytes never equal a row's. Its entries are
//!   aligned with the transcript by position: entry `i` is the message at
//!   position `i`. It is the same message when it has that message's role
//!   and content as Hermes cleans it ([`Record::said`]); otherwise the
//!   evidence cannot tell (a redacted secret, or a transcript that changed
//!   since) and it is imported and marked. An entry past the transcript's
//!   end extends it. The transcript is the session's active rows followed
//!   by the divert lines imported; or, for a snapshot Hermes did not
//!   rewrite after a compaction or a rewind shortened the transcript
//!   (Hermes never overwrites a snapshot with fewer messages), all its rows
//!   in Hermes' order followed by those lines: whichever agrees with the
//!   snapshot at more positions.
//!
//! Nothing the evidence cannot settle is dropped.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::same::{canonical, canonical_object};

/// A message as the settling compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its uid (a row's `hermes:<id>`, a line's `hermes:jsonl:...`).
    pub uid: String,
    /// The canonical bytes of the whole message, as stored.
    bytes: String,
    /// The canonical bytes of what it says: `[role, content, tool_calls,
    /// tool_call_id]`, a missing field as null.
    gist: String,
    /// The canonical bytes of `[role, content]`, the content as Hermes'
    /// snapshot writer cleans it.
    said: String,
}

impl Record {
    pub fn new(uid: String, item: &Map<String, Value>) -> Record {
        let null = Value::Null;
        let field = |k: &str| item.get(k).unwrap_or(&null);
        let gist = canonical(&Value::Array(vec![
            field("role").clone(),
            field("content").clone(),
            field("tool_calls").clone(),
            field("tool_call_id").clone(),
        ]));
        let said = canonical(&Value::Array(vec![
            field("role").clone(),
            super::clean::snapshot_content(item.get("role"), item.get("content")),
        ]));
        Record {
            uid,
            bytes: canonical_object(item),
            gist,
            said,
        }
    }
}

/// What a line is, against the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The message `of` already there: not imported.
    Same { of: String },
    /// Extends the session: imported.
    New,
    /// Imported; it may repeat the message `of` (the evidence cannot tell).
    Possible { of: String },
}

/// The verdict on each line of a divert file, in order. `tail` is the end
/// of the session's active rows, in order: at least as many rows as there
/// are lines, when the session has that many.
pub fn divert(tail: &[Record], lines: &[Record]) -> Vec<Verdict> {
    let fits = |line: &Record, row: &Record| line.bytes == row.bytes || line.gist == row.gist;
    let join = (1..=tail.len().min(lines.len()))
        .rev()
        .find(|&k| {
            let rows = &tail[tail.len() - k..];
            lines[..k].iter().zip(rows).all(|(l, r)| fits(l, r))
        })
        .unwrap_or(0);
    let rows = &tail[tail.len() - join..];
    // The bytes of each line seen so far, and the message they are (the
    // row a line was found to be, or the line itself).
    let mut seen: HashMap<&str, &str> = HashMap::new();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let (verdict, is) = match rows.get(i) {
            Some(row) if row.bytes == line.bytes => (Verdict::Same { of: row.uid.clone() }, row.uid.as_str()),
            Some(row) => (Verdict::Possible { of: row.uid.clone() }, line.uid.as_str()),
            None => match seen.get(line.bytes.as_str()) {
                Some(of) => (Verdict::Possible { of: (*of).to_string() }, line.uid.as_str()),
                None => (Verdict::New, line.uid.as_str()),
            },
        };
        seen.entry(line.bytes.as_str()).or_insert(is);
        out.push(verdict);
    }
    out
}

/// One reading of the transcript a snapshot may have been written from:
/// its first messages, as many as the snapshot has entries, and its
/// length.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    head: Vec<Record>,
    keep: usize,
    len: usize,
}

impl Reading {
    /// A reading for a snapshot of `entries` entries.
    pub fn new(entries: usize) -> Reading {
        Reading {
            head: Vec::new(),
            keep: entries,
            len: 0,
        }
    }

    /// Add the next message of the transcript; `record` is called only
    /// when it is compared.
    pub fn push(&mut self, record: impl FnOnce() -> Record) {
        if self.head.len() < self.keep {
            self.head.push(record());
        }
        self.len += 1;
    }

    fn agreements(&self, entries: &[Record]) -> usize {
        self.head.iter().zip(entries).filter(|(r, e)| r.said == e.said).count()
    }
}

/// The verdict on each entry of a snapshot, in order, against the reading
/// of the transcript that agrees with it at more positions (the first of
/// equals).
pub fn snapshot(readings: &[&Reading], entries: &[Record]) -> Vec<Verdict> {
    let mut best: Option<(&Reading, usize)> = None;
    for reading in readings {
        let n = reading.agreements(entries);
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((reading, n));
        }
    }
    let Some((reading, _)) = best else {
        return vec![Verdict::New; entries.len()];
    };
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| match reading.head.get(i) {
            Some(row) if row.said == entry.said => Verdict::Same { of: row.uid.clone() },
            Some(row) => Verdict::Possible { of: row.uid.clone() },
            None if i >= reading.len => Verdict::New,
            // A message of the transcript the reading did not keep (its
            // caller kept too few): nothing to compare with, so nothing
            // can be told.
            None => Verdict::Possible { of: String::new() },
        })
        .collect()
}
