//! `turnsafe import hermes`: a Hermes home's history (`hermes-agent`,
//! `HERMES_HOME`) into a turnsafe home.
//!
//! **The Hermes home is never touched.** Its `state.db` is never opened in
//! place (opening a WAL database creates or rewrites `-shm`, even read
//! only): `state.db` and its `-wal` (or a hot `-journal`) are copied into a
//! temporary folder, the copy is kept only if no file changed while it was
//! being copied (inode, size and modification time before and after), and
//! the copy is read. A Hermes writer that keeps writing makes every attempt
//! fail: after a bounded number of attempts the import refuses
//! ([`ImportError::SourceBusy`]). Files under `sessions/` are only read.
//!
//! **What goes where.**
//! - Every Hermes session becomes a turnsafe session. A Hermes id that is
//!   not a valid turnsafe session id maps to [`safe_session_id`] (as
//!   `TurnsafeSession` maps free-form ids); the report gives the mapping.
//!   The session's Hermes record (title, source, parent, model, token
//!   counts...) goes to `session_meta` (schema version 5) as
//!   `{"hermes": {...}, "parent": <turnsafe id of the parent or null>}`.
//! - Every message row, in Hermes' order (`messages.id`), becomes an item
//!   holding its columns verbatim (a NULL column is left out), without
//!   Hermes' bookkeeping (`id`, `session_id`, `active`, `compacted`), with
//!   `content` and `tool_calls` decoded as `SessionDB.get_messages` decodes
//!   them. Its uid is `hermes:<messages.id>` and its seq its position among
//!   the session's rows. Active rows are history; inactive rows go to the
//!   archive, reason `compaction` (`compacted = 1`) or `rewind`.
//! - Messages in `sessions/<id>.jsonl` (Hermes' divert of batches that never
//!   reached `state.db`: one `json.dumps(message)` line each) and in the
//!   snapshot `sessions/session_<id>.json` (its `messages` list) are
//!   imported after the session's rows, divert lines first, unless the
//!   session already holds them: a divert line whose bytes equal the row
//!   it meets where the run joins the rows, a snapshot entry with the role
//!   and content (as Hermes cleans it) of the message at its position
//!   ([`align`]: never the same words elsewhere). A line the evidence
//!   cannot settle is imported and reported as a possible duplicate, with
//!   the message it may repeat. A line's uid is
//!   `hermes:jsonl:<line>:<hash>` (a snapshot's entry
//!   `hermes:json:<index>:<hash>`), from its position and its bytes.
//! - A line that cannot be read goes to `<home>/import-quarantine/hermes.jsonl`
//!   with its source, line number, reason and bytes, and is counted
//!   `quarantined`; a torn last line (no newline, not JSON) is counted
//!   `torn`: a writer stopped in the middle of it.
//!
//! **Idempotent.** Every row and line has a stable uid; a uid the session
//! already holds, active or archived, is a duplicate when the stored row
//! has its bytes, and a `conflict` (not written) when it has others. A
//! second import of
//! an unchanged home adds nothing. An import never takes back what an
//! earlier one wrote: a row Hermes rewound after it was imported stays
//! active here.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use turnsafe_policy::Cause;

use crate::backend::{EditError, Engine, LeaseOptions};
use crate::history::Reason;
use crate::ids::SessionId;
use crate::ids::safe_session_id;
use crate::import_rows::{ImportCounts, ImportRow, ImportSession};
use crate::message::Message;
use crate::store::import::import_session;
use crate::store::schema::NewerSchema;
use crate::store::{SessionStore, StoreOptions};

pub mod align;
pub mod clean;
mod lines;

pub use lines::{Entry, LineKind, line_uid, parse_divert, parse_snapshot};
use lines::{SessionLines, Target};

/// Hermes' prefix for JSON-encoded structured content (`_CONTENT_JSON_PREFIX`).
const CONTENT_JSON_PREFIX: &str = "\u{0}json:";
/// Hermes' bookkeeping columns, not part of a message.
const BOOKKEEPING: [&str; 4] = ["id", "session_id", "active", "compacted"];
/// Rows buffered before a transaction is written: bounds memory.
const GROUP_ROWS: usize = 20_000;
/// The quarantine file, under the turnsafe home.
pub const QUARANTINE: &str = "import-quarantine/hermes.jsonl";

/// What to import, and how.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Only this Hermes session (its Hermes id).
    pub session: Option<String>,
    /// Report what would happen; write nothing.
    pub dry_run: bool,
    /// Copies of the Hermes database tried before refusing.
    pub copy_attempts: u32,
    /// Import into this PostgreSQL database instead of `<home>/state.db`
    /// (the home then keeps only the import's quarantine).
    pub db: Option<crate::pg::url::DbUrl>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            session: None,
            dry_run: false,
            copy_attempts: 10,
            db: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("no Hermes home at {0} (a folder holding state.db)")]
    NoSource(PathBuf),
    #[error("{path} is not a Hermes state.db: {why} (nothing was written)")]
    NotHermes { path: PathBuf, why: String },
    #[error(
        "refusing to import: --home {0} is the Hermes home itself, or inside it; give turnsafe a home of its own \
         (nothing was written)"
    )]
    SameHome(PathBuf),
    #[error(
        "refusing to import: {path} changed during each of {attempts} copies (a Hermes process is writing to it); \
         try again when Hermes is idle (nothing was written)"
    )]
    SourceBusy { path: PathBuf, attempts: u32 },
    #[error("no session {0:?} in the Hermes home (nothing was written)")]
    NoSuchSession(String),
    #[error(transparent)]
    Newer(#[from] NewerSchema),
    #[error(transparent)]
    Edit(#[from] EditError),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("SQLite, reading the copy of the Hermes database: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

impl ImportError {
    /// A refusal (acting could lose data or touch the Hermes home): exit 5.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ImportError::SameHome(_) | ImportError::SourceBusy { .. })
            || matches!(self, ImportError::Edit(e) if e.cause == Cause::TurnLease)
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImportError {
    let context = context.into();
    move |source| ImportError::Io { context, source }
}

/// One session's part of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionReport {
    /// The id in Hermes.
    pub hermes_id: String,
    /// The turnsafe session id.
    pub session: String,
    /// `session` differs from `hermes_id` ([`safe_session_id`]).
    pub renamed: bool,
    /// The turnsafe id of the Hermes parent session, if any.
    pub parent: Option<String>,
    /// Rows read from Hermes' `messages`.
    pub rows: u64,
    /// Messages read from divert and snapshot files.
    pub lines: u64,
    /// Written as history (rows and lines).
    pub imported: u64,
    /// Inactive rows written to the archive.
    pub archived: u64,
    /// Already in the session: a row or line an earlier import wrote, or a
    /// line that is a message already there ([`align`]).
    pub duplicate: u64,
    /// Rows and lines whose uid the session holds with other bytes: not
    /// written, the stored row kept.
    pub conflict: u64,
    /// Lines imported although they may repeat a message already there
    /// (the evidence cannot tell); counted in `imported` too.
    pub possible_duplicate: u64,
    /// Each of those lines.
    pub possible_duplicates: Vec<PossibleDuplicate>,
    /// Lines that could not be read, copied to the quarantine file.
    pub quarantined: u64,
    /// Torn last lines (left where they are).
    pub torn: u64,
    /// Another writer held the session's live turn lease: nothing written.
    pub refused: bool,
    /// The divert and snapshot files read for it.
    pub files: Vec<String>,
}

/// A line imported although it may repeat a message already there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PossibleDuplicate {
    /// The divert or snapshot file.
    pub file: String,
    /// Which of the two it is (`divert` or `snapshot`).
    pub kind: LineKind,
    /// Its line in a divert file (from 1), its index among a snapshot's
    /// messages (from 0), as in the quarantine file.
    pub line: u64,
    /// The uid it was imported under.
    pub uid: String,
    /// The uid of the message it may repeat.
    pub may_repeat: String,
}

/// What an import did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub source: String,
    pub home: String,
    pub dry_run: bool,
    /// Copies of the Hermes database made until one was unchanged.
    pub copy_attempts: u32,
    pub sessions: Vec<SessionReport>,
    /// The quarantine file, when a line went there.
    pub quarantine: Option<String>,
}

impl Report {
    /// The totals: the `end` line of `--json`.
    pub fn summary(&self) -> Value {
        let sum = |f: fn(&SessionReport) -> u64| self.sessions.iter().map(f).sum::<u64>();
        let renamed: BTreeMap<&str, &str> = self
            .sessions
            .iter()
            .filter(|s| s.renamed)
            .map(|s| (s.hermes_id.as_str(), s.session.as_str()))
            .collect();
        let refused: Vec<&str> = self
            .sessions
            .iter()
            .filter(|s| s.refused)
            .map(|s| s.session.as_str())
            .collect();
        json!({
            "source": self.source, "home": self.home, "dry_run": self.dry_run,
            "copy_attempts": self.copy_attempts, "sessions": self.sessions.len(),
            "rows": sum(|s| s.rows), "lines": sum(|s| s.lines), "imported": sum(|s| s.imported),
            "archived": sum(|s| s.archived), "duplicate": sum(|s| s.duplicate),
            "conflict": sum(|s| s.conflict),
            "possible_duplicate": sum(|s| s.possible_duplicate),
            "quarantined": sum(|s| s.quarantined), "torn": sum(|s| s.torn),
            "renamed": renamed, "refused": refused, "quarantine": self.quarantine,
        })
    }

    /// The summary with every session's report under `session_reports`.
    pub fn to_value(&self) -> Value {
        let mut v = self.summary();
        v["session_reports"] = serde_json::to_value(&self.sessions).unwrap_or_default();
        v
    }

    /// Some session was refused for a live lease.
    pub fn any_refused(&self) -> bool {
        self.sessions.iter().any(|s| s.refused)
    }
}

// ---------------------------------------------------------------------------
// Pure parts: ids, decoding, lines.

/// Hermes' file name for a session id (`run_agent._safe_session_filename_component`):
/// every character but word characters and `-` as `_`, `.` and `_` trimmed,
/// at most 96, and a 12-digit hash when that changed the id.
pub fn hermes_file_component(id: &str) -> String {
    let raw = id.trim();
    let replaced: String = raw
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut sanitized: String = replaced.trim_matches(['.', '_']).chars().take(96).collect();
    if sanitized.is_empty() {
        sanitized = "session".into();
    }
    if !raw.is_empty() && sanitized == raw {
        return sanitized;
    }
    let digest = hex::encode(Sha256::digest(raw.as_bytes()));
    format!("{sanitized}_{}", &digest[..12])
}

/// `content` as `SessionDB._decode_content` returns it: text with Hermes'
/// JSON prefix is that JSON (the text itself when it does not parse).
pub fn decode_content(v: Value) -> Value {
    match v {
        Value::String(s) if s.starts_with(CONTENT_JSON_PREFIX) => {
            crate::json_in::value(&s[CONTENT_JSON_PREFIX.len()..]).unwrap_or(Value::String(s))
        }
        other => other,
    }
}

/// `tool_calls` as `get_messages` returns it: the JSON it holds. Where
/// Hermes would answer `[]` for text that does not parse, the text is kept.
pub fn decode_tool_calls(v: Value) -> Value {
    match v {
        Value::String(s) if !s.is_empty() => crate::json_in::value(&s).unwrap_or(Value::String(s)),
        other => other,
    }
}

/// A Hermes message row (column name, value) as its item.
pub fn row_item<'a>(columns: impl IntoIterator<Item = (&'a str, Value)>) -> Map<String, Value> {
    let mut item = Map::new();
    for (name, value) in columns {
        if value.is_null() || BOOKKEEPING.contains(&name) {
            continue;
        }
        let value = match name {
            "content" => decode_content(value),
            "tool_calls" => decode_tool_calls(value),
            _ => value,
        };
        item.insert(name.to_string(), value);
    }
    item
}

fn sql_value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => i.into(),
        ValueRef::Real(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        ValueRef::Text(t) | ValueRef::Blob(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
    }
}

/// The uid of a row.
pub fn row_uid(id: i64) -> String {
    format!("hermes:{id}")
}

// ---------------------------------------------------------------------------
// The source: a verified copy.

type Fingerprint = (u64, u64, i64, i64);

fn fingerprint(p: &Path) -> Result<Option<Fingerprint>, ImportError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(p) {
        Ok(m) => Ok(Some((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("stat {}", p.display()))(e)),
    }
}

/// The database files a copy takes: the main file, its WAL and a hot
/// rollback journal (never `-shm`, which SQLite rebuilds from the WAL).
const COPIED: [&str; 3] = ["state.db", "state.db-wal", "state.db-journal"];

/// Copy the Hermes database into `work` until one copy was made while no
/// file changed; the number of attempts it took.
fn copy_source(source: &Path, work: &Path, attempts: u32) -> Result<u32, ImportError> {
    let main = source.join("state.db");
    for attempt in 1..=attempts.max(1) {
        let paths: Vec<PathBuf> = COPIED.iter().map(|n| source.join(n)).collect();
        let before = paths.iter().map(|p| fingerprint(p)).collect::<Result<Vec<_>, _>>()?;
        if before[0].is_none() {
            return Err(ImportError::NoSource(source.to_path_buf()));
        }
        let mut sizes = Vec::new();
        for (p, name) in paths.iter().zip(COPIED) {
            let to = work.join(name);
            let _ = std::fs::remove_file(&to);
            match std::fs::copy(p, &to) {
                Ok(n) => sizes.push(Some(n)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => sizes.push(None),
                Err(e) => return Err(io_err(format!("copy {}", p.display()))(e)),
            }
        }
        let after = paths.iter().map(|p| fingerprint(p)).collect::<Result<Vec<_>, _>>()?;
        let sizes_match = after.iter().zip(&sizes).all(|(f, n)| f.map(|f| f.1) == *n);
        if before == after && sizes_match {
            return Ok(attempt);
        }
        tracing::info!(
            attempt,
            "the Hermes database changed while it was copied; copying again"
        );
        std::thread::sleep(Duration::from_millis(u64::from(attempt.min(10)) * 40));
    }
    Err(ImportError::SourceBusy {
        path: main,
        attempts: attempts.max(1),
    })
}

/// The copy's columns of `table`.
fn columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
    stmt.query_map([table], |r| r.get(0))?.collect()
}

/// The divert and snapshot files under `sessions/`, by the name part that
/// names their session.
#[derive(Debug, Default)]
struct Files {
    divert: BTreeMap<String, PathBuf>,
    snapshot: BTreeMap<String, PathBuf>,
}

impl Files {
    fn scan(dir: &Path) -> Result<Files, ImportError> {
        let mut files = Files::default();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
            Err(e) => return Err(io_err(format!("list {}", dir.display()))(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_err(format!("list {}", dir.display())))?;
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".jsonl") {
                files.divert.insert(stem.to_string(), entry.path());
            } else if let Some(stem) = name.strip_prefix("session_").and_then(|n| n.strip_suffix(".json")) {
                files.snapshot.insert(stem.to_string(), entry.path());
            }
        }
        Ok(files)
    }

    /// Take the files of the Hermes session `id`.
    fn take(&mut self, id: &str) -> (Option<PathBuf>, Option<PathBuf>) {
        let component = hermes_file_component(id);
        let one = |m: &mut BTreeMap<String, PathBuf>| m.remove(id).or_else(|| m.remove(&component));
        (one(&mut self.divert), one(&mut self.snapshot))
    }
}

// ---------------------------------------------------------------------------
// The quarantine file.

struct Quarantine {
    path: PathBuf,
    dry_run: bool,
    seen: Option<HashSet<(String, u64, String)>>,
    used: bool,
}

impl Quarantine {
    fn new(home: &Path, dry_run: bool) -> Quarantine {
        Quarantine {
            path: home.join(QUARANTINE),
            dry_run,
            seen: None,
            used: false,
        }
    }

    /// Keep one unreadable entry (once, however many imports see it).
    fn keep(
        &mut self,
        source: &Path,
        session: &str,
        position: u64,
        reason: &str,
        bytes: &[u8],
    ) -> Result<(), ImportError> {
        self.used = true;
        if self.dry_run {
            return Ok(());
        }
        let sha = hex::encode(Sha256::digest(bytes));
        let source = source.to_string_lossy().into_owned();
        let seen = match &mut self.seen {
            Some(s) => s,
            None => {
                let mut s = HashSet::new();
                if let Ok(text) = std::fs::read_to_string(&self.path) {
                    for line in text.lines() {
                        if let Ok(v) = crate::json_in::value(line) {
                            s.insert((
                                v["source"].as_str().unwrap_or_default().to_string(),
                                v["line"].as_u64().unwrap_or_default(),
                                v["sha256"].as_str().unwrap_or_default().to_string(),
                            ));
                        }
                    }
                }
                self.seen.insert(s)
            }
        };
        if !seen.insert((source.clone(), position, sha.clone())) {
            return Ok(());
        }
        let record = json!({
            "v": 1, "origin": "hermes", "source": source, "session": session, "line": position,
            "reason": reason, "sha256": sha, "text": String::from_utf8_lossy(bytes),
            "utf8": std::str::from_utf8(bytes).is_ok(),
        });
        let dir = self.path.parent().unwrap_or(Path::new("."));
        crate::durable::create_dir_all(dir, 0o700).map_err(io_err(format!("create {}", dir.display())))?;
        let new = !self.path.exists();
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&self.path)
                .map_err(io_err(format!("open {}", self.path.display())))?
        };
        // One write of the whole line: a Value written through `Display`
        // reaches the file token by token, and a crash between two of
        // those writes would leave half a line.
        let line = format!("{record}\n");
        f.write_all(line.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io_err(format!("write {}", self.path.display())))?;
        if new {
            crate::divert::sync_dir(dir).map_err(io_err(format!("fsync {}", dir.display())))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The import.

/// Where the rows go: the store (either engine; with `false`, a dry run
/// on a server, in transactions rolled back), or (dry, SQLite) a read of a
/// copy of the home's database.
enum Sink {
    Store(Box<dyn Engine>, bool),
    /// A dry run; the home's database, if it has one.
    Dry(Option<Connection>),
}

/// The import under way.
struct Run {
    sink: Sink,
    reports: Vec<SessionReport>,
    /// Parts of sessions waiting for their transaction, and each one's
    /// owner.
    parts: Vec<ImportSession>,
    owners: Vec<Owner>,
    rows: usize,
}

/// Whose part it is: its session's report (by index) and, for a part
/// holding just a line that may repeat a message, that line. The store
/// counts a part's rows only, so such a line has a part of its own: its
/// count says whether this import wrote it.
struct Owner {
    report: usize,
    possible: Option<PossibleDuplicate>,
}

impl Run {
    fn push(&mut self, report: usize, part: ImportSession) -> Result<(), ImportError> {
        self.push_owned(Owner { report, possible: None }, part)
    }

    /// The line `row` on its own, which may repeat a message: after what
    /// `part` holds so far, which is pushed first.
    fn push_possible(
        &mut self,
        report: usize,
        part: &mut ImportSession,
        row: ImportRow,
        possible: PossibleDuplicate,
    ) -> Result<(), ImportError> {
        // A first part still holds the session's record: it goes first,
        // even without rows.
        if !part.rows.is_empty() || part.meta.is_some() {
            let next = ImportSession {
                session: part.session.clone(),
                created_ms: part.created_ms,
                meta: None,
                rows: Vec::new(),
            };
            let before = std::mem::replace(part, next);
            self.push(report, before)?;
        }
        let single = ImportSession {
            session: part.session.clone(),
            created_ms: part.created_ms,
            meta: None,
            rows: vec![row],
        };
        let owner = Owner {
            report,
            possible: Some(possible),
        };
        self.push_owned(owner, single)
    }

    fn push_owned(&mut self, owner: Owner, part: ImportSession) -> Result<(), ImportError> {
        self.rows += part.rows.len();
        self.parts.push(part);
        self.owners.push(owner);
        if self.rows >= GROUP_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    /// Write the waiting parts in one transaction.
    fn flush(&mut self) -> Result<(), ImportError> {
        let (mut parts, mut owners) = (std::mem::take(&mut self.parts), std::mem::take(&mut self.owners));
        self.rows = 0;
        while !parts.is_empty() {
            let counts: Vec<ImportCounts> = match &mut self.sink {
                Sink::Dry(None) => parts
                    .iter()
                    .map(|s| {
                        let archived = s.rows.iter().filter(|r| r.archive.is_some()).count() as u64;
                        ImportCounts {
                            imported: s.rows.len() as u64 - archived,
                            archived,
                            ..ImportCounts::default()
                        }
                    })
                    .collect(),
                Sink::Dry(Some(conn)) => parts
                    .iter()
                    .map(|s| import_session(conn, s, false))
                    .collect::<rusqlite::Result<_>>()?,
                Sink::Store(store, write) => match store.import_group(&parts, *write) {
                    Ok(c) => c,
                    // The first session's lease is live: it is refused, the
                    // rest are written.
                    Err(e) if e.cause == Cause::TurnLease => {
                        let first = parts[0].session.clone();
                        let mut k = 0;
                        while k < parts.len() {
                            if parts[k].session == first {
                                parts.remove(k);
                                self.reports[owners.remove(k).report].refused = true;
                            } else {
                                k += 1;
                            }
                        }
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            for (owner, c) in owners.drain(..).zip(counts) {
                let r = &mut self.reports[owner.report];
                r.imported += c.imported;
                r.archived += c.archived;
                r.duplicate += c.duplicate;
                r.conflict += c.conflict;
                r.refused |= c.refused;
                if let Some(possible) = owner.possible
                    && c.imported > 0
                {
                    r.possible_duplicate += 1;
                    r.possible_duplicates.push(possible);
                }
            }
            break;
        }
        Ok(())
    }
}

/// `path` with every symlink resolved, for a path that may not exist yet:
/// its nearest existing ancestor resolved, and the rest after it.
fn resolve(path: &Path) -> Result<PathBuf, ImportError> {
    let abs = std::path::absolute(path).map_err(io_err(format!("resolve {}", path.display())))?;
    let mut rest = Vec::new();
    let mut at = abs.as_path();
    loop {
        if let Ok(found) = at.canonicalize() {
            return Ok(rest.iter().rev().fold(found, |p, c| p.join(c)));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return Ok(abs),
        }
    }
}

/// Import the Hermes home at `source` into the turnsafe home `home`.
pub fn import(source: &Path, home: &Path, opts: &ImportOptions) -> Result<Report, ImportError> {
    if !source.join("state.db").is_file() {
        return Err(ImportError::NoSource(source.to_path_buf()));
    }
    let canonical_source = source
        .canonicalize()
        .map_err(io_err(format!("resolve {}", source.display())))?;
    let canonical_home = resolve(home)?;
    // A home inside the Hermes home would add files to it.
    if canonical_home.starts_with(&canonical_source) {
        return Err(ImportError::SameHome(home.to_path_buf()));
    }
    let db = home.join("state.db");
    if opts.db.is_none() {
        crate::store::schema::check_not_newer(&db)?;
    }

    let work = tempfile::tempdir().map_err(io_err("make a work folder"))?;
    let copy_attempts = copy_source(source, work.path(), opts.copy_attempts)?;
    let copy = work.path().join("state.db");
    let conn = Connection::open_with_flags(
        &copy,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let not_hermes = |why: &str| ImportError::NotHermes {
        path: source.join("state.db"),
        why: why.to_string(),
    };
    let message_columns = columns(&conn, "messages").map_err(|e| not_hermes(&e.to_string()))?;
    let session_columns = columns(&conn, "sessions").map_err(|e| not_hermes(&e.to_string()))?;
    if message_columns.is_empty() {
        return Err(not_hermes("it has no `messages` table"));
    }
    for needed in ["id", "session_id", "role"] {
        if !message_columns.iter().any(|c| c == needed) {
            return Err(not_hermes(&format!("its `messages` has no `{needed}` column")));
        }
    }
    if !session_columns.iter().any(|c| c == "id") {
        return Err(not_hermes("it has no `sessions` table with an `id`"));
    }
    let has = |c: &str| message_columns.iter().any(|m| m == c);
    let (active_col, compacted_col) = (has("active"), has("compacted"));

    // Which sessions, in Hermes' order (sessions first, then any session
    // only its messages name).
    let mut ids: Vec<String> = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT id FROM sessions WHERE ?1 IS NULL OR id = ?1 ORDER BY rowid")?;
        for id in stmt.query_map([&opts.session], |r| r.get::<_, String>(0))? {
            ids.push(id?);
        }
        let mut stmt = conn.prepare(
            "SELECT DISTINCT session_id FROM messages WHERE (?1 IS NULL OR session_id = ?1) \
             AND session_id NOT IN (SELECT id FROM sessions) ORDER BY session_id",
        )?;
        for id in stmt.query_map([&opts.session], |r| r.get::<_, String>(0))? {
            ids.push(id?);
        }
    }
    let mut files = Files::scan(&source.join("sessions"))?;
    // Files of no Hermes session stand for sessions of their own.
    let orphan_files: Vec<String> = {
        let known: HashSet<String> = {
            let mut all = conn.prepare("SELECT id FROM sessions UNION SELECT DISTINCT session_id FROM messages")?;
            all.query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut taken = Files::default();
        for id in &known {
            let (d, s) = files.take(id);
            if let Some(d) = d {
                taken.divert.insert(id.clone(), d);
            }
            if let Some(s) = s {
                taken.snapshot.insert(id.clone(), s);
            }
        }
        let mut rest: Vec<String> = files.divert.keys().chain(files.snapshot.keys()).cloned().collect();
        rest.sort();
        rest.dedup();
        // The leftovers are named by their file; the known ones by their id.
        for (k, v) in std::mem::take(&mut files.divert) {
            taken.divert.insert(k, v);
        }
        for (k, v) in std::mem::take(&mut files.snapshot) {
            taken.snapshot.insert(k, v);
        }
        files = taken;
        rest.retain(|r| opts.session.as_deref().is_none_or(|s| s == r));
        rest
    };
    if ids.is_empty()
        && orphan_files.is_empty()
        && let Some(s) = &opts.session
    {
        return Err(ImportError::NoSuchSession(s.clone()));
    }

    let total: i64 = conn.query_row(
        "SELECT count(*) FROM messages WHERE ?1 IS NULL OR session_id = ?1",
        [&opts.session],
        |r| r.get(0),
    )?;
    let bar = progress(total.max(0) as u64);

    let sink = if let Some(url) = &opts.db {
        let lease = LeaseOptions {
            holder: "turnsafe import hermes".into(),
            ..LeaseOptions::default()
        };
        Sink::Store(Box::new(crate::pg::open_store(url.clone(), home, lease)), !opts.dry_run)
    } else if opts.dry_run {
        // Even a read-only open of a WAL database creates its sidecars: a
        // dry run reads a copy of the home's database too.
        Sink::Dry(if db.is_file() {
            let copy = work.path().join("home");
            std::fs::create_dir(&copy).map_err(io_err("make a work folder"))?;
            copy_source(home, &copy, opts.copy_attempts)?;
            Some(Connection::open_with_flags(
                copy.join("state.db"),
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?)
        } else {
            None
        })
    } else {
        let store_opts = StoreOptions {
            holder: "turnsafe import hermes".into(),
            ..StoreOptions::default()
        };
        let store = SessionStore::create(home, store_opts).map_err(|e| ImportError::Io {
            context: e.to_string(),
            source: std::io::Error::other("home"),
        })?;
        Sink::Store(Box::new(store), true)
    };
    let mut run = Run {
        sink,
        reports: Vec::new(),
        parts: Vec::new(),
        owners: Vec::new(),
        rows: 0,
    };
    let mut quarantine = Quarantine::new(home, opts.dry_run);

    let select_session = format!(
        "SELECT {} FROM sessions WHERE id = ?1",
        session_columns
            .iter()
            .map(|c| format!("\"{}\"", c.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let select_rows = format!(
        "SELECT {}, {}, {} FROM messages WHERE session_id = ?1 ORDER BY id",
        message_columns
            .iter()
            .map(|c| format!("\"{}\"", c.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(", "),
        if active_col { "active" } else { "1" },
        if compacted_col { "compacted" } else { "0" },
    );
    let n_cols = message_columns.len();
    let id_at = message_columns.iter().position(|c| c == "id").unwrap_or(0);
    let ts_at = message_columns.iter().position(|c| c == "timestamp");

    let all: Vec<(String, bool)> = ids
        .into_iter()
        .map(|i| (i, true))
        .chain(orphan_files.into_iter().map(|i| (i, false)))
        .collect();
    for (hermes_id, in_db) in all {
        let session_id = safe_session_id(&hermes_id);
        let session =
            SessionId::new(&session_id).map_err(|e| not_hermes(&format!("session id {session_id:?}: {e}")))?;
        // The session's record.
        let mut record: Option<Map<String, Value>> = None;
        if in_db {
            let mut stmt = conn.prepare_cached(&select_session)?;
            let mut rows = stmt.query([&hermes_id])?;
            if let Some(r) = rows.next()? {
                let mut m = Map::new();
                for (i, name) in session_columns.iter().enumerate() {
                    let v = sql_value(r.get_ref(i)?);
                    if !v.is_null() && name != "id" {
                        m.insert(name.clone(), v);
                    }
                }
                record = Some(m);
            }
        }
        let parent = record
            .as_ref()
            .and_then(|m| m.get("parent_session_id"))
            .and_then(Value::as_str)
            .map(safe_session_id);
        let started_ms = record
            .as_ref()
            .and_then(|m| m.get("started_at"))
            .and_then(Value::as_f64)
            .map_or_else(crate::ids::now_ms, |s| (s * 1000.0) as i64);
        let meta = json!({ "hermes": record, "parent": parent }).to_string();
        let report = run.reports.len();
        let (divert, snapshot) = (files.divert.remove(&hermes_id), files.snapshot.remove(&hermes_id));
        run.reports.push(SessionReport {
            hermes_id: hermes_id.clone(),
            session: session_id.clone(),
            renamed: session_id != hermes_id,
            parent,
            files: divert
                .iter()
                .chain(snapshot.iter())
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            ..SessionReport::default()
        });
        // Its divert and snapshot files are read before its rows: they
        // decide which rows are kept to settle them against.
        let mut session_lines = SessionLines::new(
            lines::read(divert, LineKind::Divert)?,
            lines::read(snapshot, LineKind::Snapshot)?,
        );
        let new_part = |meta: Option<String>| ImportSession {
            session: session.clone(),
            created_ms: started_ms,
            meta: meta.map(|m| ("hermes".to_string(), hermes_id.clone(), m)),
            rows: Vec::new(),
        };
        let mut part = new_part(Some(meta));
        let mut seq = 0i64;
        if in_db {
            let mut stmt = conn.prepare_cached(&select_rows)?;
            let mut rows = stmt.query([&hermes_id])?;
            while let Some(r) = rows.next()? {
                let id: i64 = r.get(id_at)?;
                let created_ms = ts_at
                    .and_then(|i| r.get::<_, Option<f64>>(i).ok().flatten())
                    .map_or(started_ms, |t| (t * 1000.0) as i64);
                let mut fields = Vec::with_capacity(n_cols);
                for (i, name) in message_columns.iter().enumerate() {
                    let v = r.get_ref(i)?;
                    if v != ValueRef::Null {
                        fields.push((name.as_str(), sql_value(v)));
                    }
                }
                let item = row_item(fields);
                let active: i64 = r.get::<_, Option<i64>>(n_cols)?.unwrap_or(1);
                let compacted: i64 = r.get::<_, Option<i64>>(n_cols + 1)?.unwrap_or(0);
                let uid = row_uid(id);
                let archive = match (active, compacted) {
                    (0, 0) => Some(Reason::Rewind),
                    (0, _) => Some(Reason::Compaction),
                    _ => None,
                };
                session_lines.row(&uid, &item, archive.is_none());
                part.rows.push(ImportRow {
                    uid,
                    seq,
                    message: Message::from_item(item),
                    created_ms,
                    archive,
                });
                seq += 1;
                run.reports[report].rows += 1;
                bar.inc(1);
                if part.rows.len() >= GROUP_ROWS {
                    run.push(report, std::mem::replace(&mut part, new_part(None)))?;
                }
            }
        }
        // Divert lines, then the snapshot.
        session_lines.import(&mut Target {
            run: &mut run,
            quarantine: &mut quarantine,
            part: &mut part,
            seq: &mut seq,
            report,
            session_id: &session_id,
            started_ms,
        })?;
        run.push(report, part)?;
    }
    run.flush()?;
    bar.finish_and_clear();
    Ok(Report {
        source: source.to_string_lossy().into_owned(),
        home: home.to_string_lossy().into_owned(),
        dry_run: opts.dry_run,
        copy_attempts,
        sessions: run.reports,
        quarantine: quarantine.used.then(|| quarantine.path.to_string_lossy().into_owned()),
    })
}

/// A progress bar on stderr for large homes, only when stderr is a terminal.
fn progress(total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if total < 50_000 || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template("importing {bar:40} {pos}/{len} messages ({eta})") {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
#[path = "import_hermes_tests.rs"]
mod tests;
