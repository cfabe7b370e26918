//! A Hermes session's divert file (`sessions/<id>.jsonl`) and snapshot
//! (`sessions/session_<id>.json`): their entries, each message's uid, and
//! their import after the session's rows, each message settled against
//! the rows ([`super::align`]).

use std::collections::VecDeque;
use std::path::PathBuf;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::align::{self, Reading, Record, Verdict};
use super::{ImportError, PossibleDuplicate, Quarantine, Run, io_err};
use crate::import_rows::{ImportRow, ImportSession};
use crate::message::Message;
use crate::same::canonical;

/// Where a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LineKind {
    /// `sessions/<id>.jsonl`, by 1-based line number.
    Divert,
    /// `sessions/session_<id>.json`, by 0-based index in `messages`.
    Snapshot,
}

/// The uid of a line: its kind, position and a hash of its bytes.
pub fn line_uid(kind: LineKind, position: u64, bytes: &[u8]) -> String {
    let tag = match kind {
        LineKind::Divert => "jsonl",
        LineKind::Snapshot => "json",
    };
    let digest = hex::encode(Sha256::digest(bytes));
    format!("hermes:{tag}:{position}:{}", &digest[..24])
}

/// One entry of a divert or snapshot file.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Message {
        position: u64,
        uid: String,
        item: Map<String, Value>,
    },
    /// Not readable: quarantined.
    Bad {
        position: u64,
        bytes: Vec<u8>,
        reason: String,
    },
    /// The last line, cut short (no newline, not JSON).
    Torn { position: u64, bytes: Vec<u8> },
}

/// The entries of a divert file (upstream format: one JSON object per
/// line). Blank lines are skipped.
pub fn parse_divert(data: &[u8]) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut lines = data.split(|b| *b == b'\n').peekable();
    let mut position = 0u64;
    while let Some(line) = lines.next() {
        position += 1;
        let last = lines.peek().is_none();
        if last && line.is_empty() {
            break;
        }
        let text = line.strip_suffix(b"\r").unwrap_or(line);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match crate::json_in::value_bytes(text) {
            Ok(Value::Object(item)) => out.push(Entry::Message {
                position,
                uid: line_uid(LineKind::Divert, position, text),
                item,
            }),
            Ok(_) => out.push(Entry::Bad {
                position,
                bytes: line.to_vec(),
                reason: "not a JSON object".into(),
            }),
            // No newline after it: the writer stopped in the middle.
            Err(_) if last => out.push(Entry::Torn {
                position,
                bytes: line.to_vec(),
            }),
            Err(e) => out.push(Entry::Bad {
                position,
                bytes: line.to_vec(),
                reason: format!("not JSON: {e}"),
            }),
        }
    }
    out
}

/// The entries of a snapshot (`{"session_id", ..., "messages": [...]}`),
/// and the session id it names. A file that is not such an object is one
/// bad entry (position 0).
pub fn parse_snapshot(data: &[u8]) -> (Option<String>, Vec<Entry>) {
    let bad = |reason: String| Entry::Bad {
        position: 0,
        bytes: data.to_vec(),
        reason,
    };
    let v: Value = match crate::json_in::value_bytes(data) {
        Ok(v) => v,
        Err(e) => return (None, vec![bad(format!("not JSON: {e}"))]),
    };
    let id = v.get("session_id").and_then(Value::as_str).map(String::from);
    let Some(messages) = v.get("messages").and_then(Value::as_array) else {
        return (id, vec![bad("no `messages` list".into())]);
    };
    let entries = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let bytes = canonical(m).into_bytes();
            match m {
                Value::Object(item) => Entry::Message {
                    position: i as u64,
                    uid: line_uid(LineKind::Snapshot, i as u64, &bytes),
                    item: item.clone(),
                },
                _ => Entry::Bad {
                    position: i as u64,
                    bytes,
                    reason: "message is not a JSON object".into(),
                },
            }
        })
        .collect();
    (id, entries)
}

/// A session's divert or snapshot file, read.
pub(super) struct LineFile {
    path: PathBuf,
    kind: LineKind,
    entries: Vec<Entry>,
}

impl LineFile {
    pub(super) fn read(path: PathBuf, kind: LineKind) -> Result<LineFile, ImportError> {
        let data = std::fs::read(&path).map_err(io_err(format!("read {}", path.display())))?;
        let entries = match kind {
            LineKind::Divert => parse_divert(&data),
            LineKind::Snapshot => parse_snapshot(&data).1,
        };
        Ok(LineFile { path, kind, entries })
    }

    fn records(&self) -> Vec<Record> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Message { uid, item, .. } => Some(Record::new(uid.clone(), item)),
                _ => None,
            })
            .collect()
    }

    fn messages(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Message { .. }))
            .count()
    }
}

/// A session's divert and snapshot files, and what of its rows they are
/// settled against: the active rows' end (as long as the divert run), and
/// the first rows of either reading of the transcript (as many as the
/// snapshot has entries). Only these rows are kept, so memory is bounded
/// by the files, not by the session.
pub(super) struct SessionLines {
    divert: Option<LineFile>,
    snapshot: Option<LineFile>,
    divert_messages: usize,
    tail: VecDeque<Record>,
    active: Reading,
    every: Reading,
}

/// Where the lines go: the session's part under way, its next seq, and its
/// report.
pub(super) struct Target<'a> {
    pub run: &'a mut Run,
    pub quarantine: &'a mut Quarantine,
    pub part: &'a mut ImportSession,
    pub seq: &'a mut i64,
    pub report: usize,
    pub session_id: &'a str,
    pub started_ms: i64,
}

impl SessionLines {
    pub(super) fn new(divert: Option<LineFile>, snapshot: Option<LineFile>) -> SessionLines {
        let entries = snapshot.as_ref().map_or(0, LineFile::messages);
        SessionLines {
            divert_messages: divert.as_ref().map_or(0, LineFile::messages),
            divert,
            snapshot,
            tail: VecDeque::new(),
            active: Reading::new(entries),
            every: Reading::new(entries),
        }
    }

    /// The session's next row, in Hermes' order: `active` unless Hermes
    /// took it out of the transcript.
    pub(super) fn row(&mut self, uid: &str, item: &Map<String, Value>, active: bool) {
        // Its record is made once, and only when something compares it.
        let mut record: Option<Record> = None;
        let mut make = || record.get_or_insert_with(|| Record::new(uid.to_string(), item)).clone();
        if active {
            if self.divert_messages > 0 {
                self.tail.push_back(make());
                if self.tail.len() > self.divert_messages {
                    self.tail.pop_front();
                }
            }
            self.active.push(&mut make);
        }
        self.every.push(&mut make);
    }

    /// Settle and import the divert lines, then the snapshot's entries;
    /// quarantine what cannot be read.
    pub(super) fn import(mut self, to: &mut Target<'_>) -> Result<(), ImportError> {
        if let Some(file) = self.divert.take() {
            let tail: Vec<Record> = std::mem::take(&mut self.tail).into();
            let records = file.records();
            let verdicts = align::divert(&tail, &records);
            let imported = to.lines(file, records, verdicts)?;
            // The lines imported continue the transcript the snapshot is
            // compared with, in either reading.
            for record in imported {
                self.active.push(|| record.clone());
                self.every.push(|| record);
            }
        }
        if let Some(file) = self.snapshot.take() {
            let records = file.records();
            let verdicts = align::snapshot(&[&self.active, &self.every], &records);
            to.lines(file, records, verdicts)?;
        }
        Ok(())
    }
}

impl Target<'_> {
    /// Import the messages of `file` by their verdicts; the records of
    /// those imported.
    fn lines(
        &mut self,
        file: LineFile,
        records: Vec<Record>,
        verdicts: Vec<Verdict>,
    ) -> Result<Vec<Record>, ImportError> {
        let mut imported = Vec::new();
        let mut settled = records.into_iter().zip(verdicts);
        let path = file.path;
        for entry in file.entries {
            match entry {
                Entry::Message { uid, item, position } => {
                    self.run.reports[self.report].lines += 1;
                    // One record and one verdict per message, in order.
                    let Some((record, verdict)) = settled.next() else {
                        continue;
                    };
                    let of = match verdict {
                        Verdict::Same { .. } => {
                            self.run.reports[self.report].duplicate += 1;
                            continue;
                        }
                        Verdict::New => None,
                        Verdict::Possible { of } => Some(of),
                    };
                    let created_ms = item
                        .get("timestamp")
                        .and_then(Value::as_f64)
                        .map_or(self.started_ms, |t| (t * 1000.0) as i64);
                    let row = ImportRow {
                        uid: uid.clone(),
                        seq: *self.seq,
                        message: Message::from_item(item),
                        created_ms,
                        archive: None,
                    };
                    match of {
                        None => self.part.rows.push(row),
                        Some(of) => {
                            let possible = PossibleDuplicate {
                                file: path.to_string_lossy().into_owned(),
                                kind: file.kind,
                                line: position,
                                uid,
                                may_repeat: of,
                            };
                            self.run.push_possible(self.report, self.part, row, possible)?;
                        }
                    }
                    *self.seq += 1;
                    imported.push(record);
                }
                Entry::Bad {
                    position,
                    bytes,
                    reason,
                } => {
                    self.quarantine
                        .keep(&path, self.session_id, position, &reason, &bytes)?;
                    self.run.reports[self.report].quarantined += 1;
                }
                Entry::Torn { .. } => self.run.reports[self.report].torn += 1,
            }
        }
        Ok(imported)
    }
}

/// The file at `path`, if there is one.
pub(super) fn read(path: Option<PathBuf>, kind: LineKind) -> Result<Option<LineFile>, ImportError> {
    path.map(|p| LineFile::read(p, kind)).transpose()
}
