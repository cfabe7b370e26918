//! Clear and delete: the pending divert lines of what an edit removes are
//! settled with that edit, exactly the lines it read.
//!
//! A `clear` (and a session deleted for good) settles the session's
//! pending message lines `cleared`; a LangGraph `delete_thread` settles
//! the thread's pending checkpoint and write lines `deleted`. Either way,
//! in this order ([`settle_with`]):
//!
//! 1. **take and read**: the session's files being settled
//!    (`sessions/settling/<session>@*.jsonl`) are read, then its divert
//!    file is taken under its `flock`, read whole under that lock and
//!    renamed into `settling/` (as replay takes it), so no line is
//!    appended to it after the read. A read that fails fails the edit
//!    before anything is changed: nothing moved, nothing removed.
//! 2. **the edit**, in one transaction, with the lines read: a clear
//!    archives the message lines with the rows; a delete stores the
//!    thread's lines whose key is not stored and marks them with the rest
//!    of the thread. If the edit fails, the taken file goes back to its
//!    name (or, when a writer has made a new file there since, stays in
//!    `settling/`, pending either way).
//! 3. **settle** exactly the lines read: one ledger line each (`cleared`
//!    or `deleted`; `quarantined`, with replay's reason, for a line that
//!    cannot be read), the lines of others (a thread's lines under a
//!    clear, a session's under a delete) written back to the divert file,
//!    pending, then the files move to `sessions/settled/`, kept.
//!
//! A line diverted after the read goes to a new divert file and stays
//! pending for replay.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::backend::EditError;
use crate::backend::Engine;
use crate::divert::sync_dir;
use crate::divert_files;
use crate::graph::{GraphEdited, GraphLine};
use crate::history::Cleared;
use crate::ids::thread_session;
use crate::ids::{SessionId, now_ms};
use crate::replay::{ReplayError, io_err, open_ledger, parse_divert_line};
use crate::settle::session_of_settling;

pub use crate::pending::{PendingMessage, PendingRecord};

/// Which lines an edit settles, and as what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// The session's message lines, `cleared` (a clear, or the session
    /// deleted for good).
    Cleared,
    /// The LangGraph lines of this thread, `deleted` (`delete_thread`).
    Deleted { thread: String },
}

impl Settlement {
    fn state(&self) -> &'static str {
        match self {
            Settlement::Cleared => "cleared",
            Settlement::Deleted { .. } => "deleted",
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Settlement::Cleared => "the session was cleared",
            Settlement::Deleted { .. } => "the thread was deleted",
        }
    }
}

/// What settling did, line by line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Settled {
    /// Lines settled `cleared` or `deleted`.
    pub settled: u64,
    /// Lines that could not be read, settled `quarantined`.
    pub quarantined: u64,
    /// Lines of others, written back to the divert file, still pending.
    pub kept: u64,
}

/// Why an edit and its pending lines did not settle.
#[derive(Debug, thiserror::Error)]
pub enum ClearError {
    /// The pending lines could not be read: the edit was not attempted.
    #[error("{edit} of {session} refused: its pending divert lines could not be read ({source}); nothing was changed")]
    Read {
        edit: &'static str,
        session: String,
        source: ReplayError,
    },
    /// The edit failed: nothing was removed, the lines stay pending.
    #[error(transparent)]
    Edit(#[from] EditError),
    /// The edit committed, then settling its lines failed: they stay
    /// pending (`settling/`) for replay.
    #[error("the {edit} of {session} is done, but settling its pending divert lines failed: {source}")]
    Settle {
        edit: &'static str,
        session: String,
        source: ReplayError,
    },
}

/// What a clear did: the rows and lines archived, and how the lines settled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClearReport {
    pub cleared: Cleared,
    pub settled: Settled,
}

/// What a `delete_thread` did: the rows it marked (the thread's pending
/// lines stored with them included), and how the lines settled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThreadDeleted {
    pub edited: GraphEdited,
    pub settled: Settled,
}

/// Clear `session`: its rows and exactly the pending message lines read
/// go to the archive in one transaction (reason `clear`), then those lines
/// are settled `cleared`.
pub fn clear(store: &mut dyn Engine, home: &Path, session: &SessionId) -> Result<ClearReport, ClearError> {
    let (cleared, settled) = settle_with(home, session.as_str(), "clear", Settlement::Cleared, |taken| {
        store.clear_archiving(session, &taken.messages())
    })?;
    Ok(ClearReport { cleared, settled })
}

/// LangGraph's `delete_thread`: in one transaction, the thread's pending
/// lines read are stored as replay would have stored them, and every row
/// of the thread is marked, theirs included; then those lines are settled
/// `deleted`. `turnsafe
/// restore --reason delete` brings the rows back, the lines' included.
pub fn delete_thread(store: &mut dyn Engine, home: &Path, thread: &str) -> Result<ThreadDeleted, ClearError> {
    let session = thread_session(thread);
    let settlement = Settlement::Deleted { thread: thread.into() };
    let (edited, settled) = settle_with(home, &session, "delete", settlement, |taken| {
        store.graph_delete_thread(thread, &taken.records())
    })?;
    Ok(ThreadDeleted { edited, settled })
}

/// Take and read `session`'s pending lines, run `edit` with them, then
/// settle exactly those lines (see the module's documentation). `edit`
/// is the name errors give it.
pub fn settle_with<T>(
    home: &Path,
    session: &str,
    edit: &'static str,
    settlement: Settlement,
    run: impl FnOnce(&Taken) -> Result<T, EditError>,
) -> Result<(T, Settled), ClearError> {
    let taken = Taken::take(home, session, settlement).map_err(|source| ClearError::Read {
        edit,
        session: session.to_string(),
        source,
    })?;
    let done = match run(&taken) {
        Ok(v) => v,
        Err(e) => {
            taken.put_back();
            return Err(ClearError::Edit(e));
        }
    };
    let settled = taken.settle().map_err(|source| ClearError::Settle {
        edit,
        session: session.to_string(),
        source,
    })?;
    Ok((done, settled))
}

/// What one line read is.
#[derive(Debug, Clone)]
enum Kind {
    /// A message line, with the object to write back as it was.
    Message(PendingMessage, Map<String, Value>),
    /// A LangGraph line, likewise.
    Graph(GraphLine, Map<String, Value>),
    /// Why it cannot be read.
    Unreadable(&'static str),
}

#[derive(Debug, Clone)]
struct Line {
    number: u64,
    offset: u64,
    uid: Option<String>,
    kind: Kind,
}

/// A file of the session's pending lines, read.
#[derive(Debug)]
struct TakenFile {
    /// Where it is now, in `settling/`.
    path: PathBuf,
    /// Its name in `sessions/` when this edit took it from there.
    from: Option<PathBuf>,
    lines: Vec<Line>,
}

/// The pending lines of a session, taken from under their writers and
/// read (step 1 of [`settle_with`]).
#[derive(Debug)]
pub struct Taken {
    sessions: PathBuf,
    session: String,
    settlement: Settlement,
    files: Vec<TakenFile>,
}

impl Taken {
    /// Read the session's files in `settling/`, then take its divert file
    /// and read it under its lock. Only files holding a line this
    /// settlement settles are taken; a failed read fails before anything
    /// is moved, unless it is the divert file's own read after the rename
    /// (it is then put back).
    pub fn take(home: &Path, session: &str, settlement: Settlement) -> Result<Taken, ReplayError> {
        let sessions = home.join("sessions");
        let mut taken = Taken {
            sessions: sessions.clone(),
            session: session.to_string(),
            settlement,
            files: Vec::new(),
        };
        if !sessions.is_dir() {
            return Ok(taken);
        }
        let settling = sessions.join("settling");
        for path in settling_entries(&settling, session)? {
            let data = read_regular(&path)?;
            let lines = parse_lines(&data, session);
            if taken.concerns(&lines) {
                taken.files.push(TakenFile {
                    path,
                    from: None,
                    lines,
                });
            }
        }
        let listing =
            divert_files::list(&sessions, Some(session)).map_err(io_err(format!("list {}", sessions.display())))?;
        for (_, path) in &listing.divert {
            if let Some(file) = taken.take_file(path, &settling)? {
                taken.files.push(file);
            }
        }
        if taken.files.iter().any(|f| f.from.is_some()) {
            sync_dir(&settling).map_err(io_err("fsync settling/"))?;
            sync_dir(&sessions).map_err(io_err("fsync sessions/"))?;
        }
        Ok(taken)
    }

    /// Whether a file holds a line this settlement settles.
    fn concerns(&self, lines: &[Line]) -> bool {
        lines.iter().any(|l| match (&self.settlement, &l.kind) {
            (Settlement::Cleared, Kind::Message(..) | Kind::Unreadable(_)) => true,
            (Settlement::Deleted { thread }, Kind::Graph(g, _)) => g.thread_id() == thread,
            _ => false,
        })
    }

    /// Take one divert file: lock it, read it whole, and rename it into
    /// `settling/` under the lock (`None`, untouched, when it holds nothing
    /// this settlement settles).
    fn take_file(&self, path: &Path, settling: &Path) -> Result<Option<TakenFile>, ReplayError> {
        let shown = path.display().to_string();
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(io_err(format!("open {shown}")))?;
        if !f.metadata().map_err(io_err(format!("stat {shown}")))?.is_file() {
            return Err(io_err(format!("read {shown}"))(io::Error::other("not a regular file")));
        }
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io_err(format!("lock {shown}"))(e.into()))?;
        let data = crate::failpoint::io_fault("clear.read")
            .map_or_else(|| crate::lines::read_whole(&mut f, &shown), Err)
            .map_err(io_err(format!("read {shown}")))?;
        let lines = parse_lines(&data, &self.session);
        if !self.concerns(&lines) {
            return Ok(None);
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(settling)
            .map_err(io_err(format!("mkdir {}", settling.display())))?;
        let target = settling.join(format!("{}@{}-{}.jsonl", self.session, now_ms(), std::process::id()));
        std::fs::rename(path, &target).map_err(io_err(format!("move {shown} to settling/")))?;
        drop(f);
        Ok(Some(TakenFile {
            path: target,
            from: Some(path.to_path_buf()),
            lines,
        }))
    }

    /// The readable message lines, for a clear's archive.
    pub fn messages(&self) -> Vec<PendingMessage> {
        self.lines()
            .filter_map(|l| match &l.kind {
                Kind::Message(m, _) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    /// The readable LangGraph lines of the deleted thread, for its delete.
    pub fn records(&self) -> Vec<PendingRecord> {
        let Settlement::Deleted { thread } = &self.settlement else {
            return Vec::new();
        };
        self.lines()
            .filter_map(|l| match &l.kind {
                Kind::Graph(g, obj) if g.thread_id() == thread => Some(PendingRecord {
                    line: g.clone(),
                    at_ms: divert_time_ms(obj),
                }),
                _ => None,
            })
            .collect()
    }

    fn lines(&self) -> impl Iterator<Item = &Line> {
        self.files.iter().flat_map(|f| f.lines.iter())
    }

    /// The edit failed: each file this edit took goes back to its name,
    /// unless a writer has made a new file there since (it then stays in
    /// `settling/`, where replay finds it). Pending either way.
    fn put_back(self) {
        for f in &self.files {
            let Some(from) = &f.from else { continue };
            let back = rustix::fs::renameat_with(
                rustix::fs::CWD,
                &f.path,
                rustix::fs::CWD,
                from,
                rustix::fs::RenameFlags::NOREPLACE,
            );
            if let Err(e) = back {
                tracing::warn!(file = %f.path.display(), error = %e, "a taken divert file stays in settling/, pending");
            }
        }
        for dir in [self.sessions.join("settling"), self.sessions.clone()] {
            if let Err(e) = sync_dir(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "fsync after putting divert files back");
            }
        }
    }

    /// Settle exactly the lines read: the lines of others are written back
    /// (fsynced) first, then one ledger line per settled or quarantined
    /// line, then each file moves to `settled/`. A cut before the move
    /// leaves a written-back line twice, which replay stores once.
    fn settle(self) -> Result<Settled, ReplayError> {
        let mut settled = Settled::default();
        if self.files.is_empty() {
            return Ok(settled);
        }
        let settled_dir = self.sessions.join("settled");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&settled_dir)
            .map_err(io_err(format!("mkdir {}", settled_dir.display())))?;
        let mut kept = Vec::new();
        let mut entries = Vec::new();
        for f in &self.files {
            let name = f
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for l in &f.lines {
                let (state, reason) = match (&self.settlement, &l.kind) {
                    (_, Kind::Unreadable(r)) => ("quarantined", *r),
                    (Settlement::Cleared, Kind::Message(..)) => (self.settlement.state(), self.settlement.reason()),
                    (Settlement::Deleted { thread }, Kind::Graph(g, _)) if g.thread_id() == thread => {
                        (self.settlement.state(), self.settlement.reason())
                    }
                    (_, Kind::Message(_, obj) | Kind::Graph(_, obj)) => {
                        kept.push(Value::Object(obj.clone()));
                        continue;
                    }
                };
                if state == "quarantined" {
                    settled.quarantined += 1;
                } else {
                    settled.settled += 1;
                }
                entries.push(json!({
                    "file": name, "line": l.number, "offset": l.offset, "session": self.session,
                    "uid": l.uid, "state": state, "reason": reason, "at_ms": now_ms(),
                }));
            }
        }
        if !kept.is_empty() {
            crate::divert::append_lines(&self.sessions, &self.session, &kept).map_err(|e| {
                io_err(format!("keep the pending lines of others in {}.jsonl", self.session))(io::Error::other(
                    e.to_string(),
                ))
            })?;
            settled.kept = kept.len() as u64;
        }
        let mut ledger = open_ledger(&self.sessions)?;
        let mut out = Vec::new();
        for entry in &entries {
            serde_json::to_writer(&mut out, entry).map_err(|e| io_err("encode ledger")(io::Error::other(e)))?;
            out.push(b'\n');
        }
        ledger.write_all(&out).map_err(io_err("write ledger.jsonl"))?;
        ledger.sync_all().map_err(io_err("fsync ledger.jsonl"))?;
        for f in &self.files {
            let Some(name) = f.path.file_name() else { continue };
            std::fs::rename(&f.path, settled_dir.join(name))
                .map_err(io_err(format!("settle {}", name.to_string_lossy())))?;
        }
        sync_dir(&settled_dir).map_err(io_err("fsync settled/"))?;
        sync_dir(&self.sessions.join("settling")).map_err(io_err("fsync settling/"))?;
        Ok(settled)
    }
}

/// When a line was diverted (its `at`, RFC 3339), in ms since the epoch.
fn divert_time_ms(obj: &Map<String, Value>) -> Option<i64> {
    let at = humantime::parse_rfc3339(obj.get("at")?.as_str()?).ok()?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()
}

/// `settling/<session>@*` entries, sorted (none when there is no folder).
fn settling_entries(settling: &Path, session: &str) -> Result<Vec<PathBuf>, ReplayError> {
    let context = format!("list {}", settling.display());
    let rd = match std::fs::read_dir(settling) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(context)(e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        let path = entry.map_err(io_err(context.clone()))?.path();
        if path.file_name().and_then(|n| n.to_str()).and_then(session_of_settling) == Some(session) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// A file's bytes, refusing anything but a regular file (never through a
/// symlink, never blocking on a FIFO).
fn read_regular(path: &Path) -> Result<Vec<u8>, ReplayError> {
    let shown = path.display().to_string();
    let mut f = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err(format!("open {shown}")))?;
    if !f.metadata().map_err(io_err(format!("stat {shown}")))?.is_file() {
        return Err(io_err(format!("read {shown}"))(io::Error::other("not a regular file")));
    }
    crate::failpoint::io_fault("clear.read")
        .map_or_else(|| crate::lines::read_whole(&mut f, &shown), Err)
        .map_err(io_err(format!("read {shown}")))
}

/// Every non-blank line of a divert file, read as replay reads it.
fn parse_lines(data: &[u8], session: &str) -> Vec<Line> {
    let mut out = Vec::new();
    let (mut offset, mut number) = (0u64, 0u64);
    for raw in data.split_inclusive(|b| *b == b'\n') {
        number += 1;
        let line_offset = offset;
        offset += raw.len() as u64;
        // As replay: only ASCII whitespace is blank, and a line that is not
        // UTF-8 is never read as lossy text.
        if raw.trim_ascii().is_empty() {
            continue;
        }
        let (uid, kind) = match std::str::from_utf8(raw) {
            Ok(text) => classify(text.trim_end_matches('\n'), session),
            Err(_) => (None, Kind::Unreadable("not UTF-8")),
        };
        out.push(Line {
            number,
            offset: line_offset,
            uid,
            kind,
        });
    }
    out
}

/// What replay would read of one line: a LangGraph line, a message, or
/// why neither can be read.
fn classify(text: &str, session: &str) -> (Option<String>, Kind) {
    let obj = match crate::json_in::value(text) {
        Ok(Value::Object(obj)) => obj,
        Ok(_) => return (None, Kind::Unreadable("not a JSON object")),
        Err(_) => return (None, Kind::Unreadable("torn or invalid JSON")),
    };
    let uid = obj.get("uid").and_then(Value::as_str).map(String::from);
    if let Some(parsed) = GraphLine::parse(&obj, session) {
        return match parsed {
            Ok(line) => (uid, Kind::Graph(line, obj)),
            Err(reason) => (uid, Kind::Unreadable(reason)),
        };
    }
    match parse_divert_line(text, session) {
        Ok((uid, seq, message)) => (
            Some(uid.clone()),
            Kind::Message(PendingMessage { uid, seq, message }, obj),
        ),
        Err((uid, reason)) => (uid, Kind::Unreadable(reason)),
    }
}
