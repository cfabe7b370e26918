//! Replay: the idempotent import of diverted JSONL (`docs/DIVERT.md`) back
//! into `state.db`.
//!
//! Each divert file is first taken from under any live writer: its `flock`
//! is held while it is renamed into `sessions/settling/`. Lines are then
//! imported in chunks, one transaction each, by (session, uid): a new uid
//! is `replayed` with its `seq`, a stored row with the line's bytes
//! ([`crate::same`]) is a `duplicate`, a uid stored with other bytes is a
//! `conflict`, and a torn or invalid line is `quarantined` with a reason.
//! A LangGraph line whose key is stored with other bytes is `applied` or
//! `superseded` as the live call would have settled it
//! ([`crate::settle`]). Every line's settlement is appended to
//! `sessions/ledger.jsonl` after its chunk committed. A file whose lines
//! are all settled moves to `sessions/settled/`; its lines, quarantined
//! ones included, stay there. Nothing is ever dropped, and a second run
//! finds nothing to do. A run killed midway is finished by the next one:
//! already-imported lines come back as duplicates.
//!
//! Only turnsafe's own divert files are taken ([`crate::divert_files`]):
//! another runtime's files in `sessions/` stay where they are, untouched.
//! While a capture of a retired generation is pending
//! ([`crate::captures`]), replay refuses unless forced: the capture holds
//! rows the database lacks, and importing later lines first would leave a
//! hole in the transcript.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value, json};

use crate::captures;
use crate::divert::{FORMAT_VERSION, sync_dir};
use crate::divert_files;
use crate::graph::{GraphLine, StoredGraph};
use crate::ids::now_ms;
use crate::lines::{Line, MAX_DIVERT_LINE};
use crate::message::Message;
use crate::rows;
use crate::settle::{self, Verdict};
use crate::store::{StoreOptions, configure, index};

/// Lines imported per transaction.
const CHUNK: usize = 2_000;

#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub session: Option<String>,
    pub dry_run: bool,
    /// Replay even while a live turn lease is held on the session, or a
    /// capture is not settled.
    pub force: bool,
}

/// What one run did.
#[derive(Debug, Clone, Default)]
pub struct ReplayRun {
    /// How each divert file settled.
    pub files: Vec<FileReport>,
    /// Files in `sessions/` that are not turnsafe's, left where they are.
    pub foreign_files: Vec<String>,
}

/// How one file settled.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FileReport {
    pub file: String,
    pub session: String,
    pub lines: u64,
    pub replayed: u64,
    pub duplicate: u64,
    /// LangGraph lines stored over an older version of their key.
    pub applied: u64,
    /// LangGraph lines a newer stored version already settled.
    pub superseded: u64,
    /// Lines set aside: unreadable ones and conflicts.
    pub quarantined: u64,
    /// Of the quarantined, lines whose key holds other bytes.
    pub conflict: u64,
    /// Message lines a clear had already archived, byte for byte (a clear
    /// cut short before it settled them).
    pub cleared: u64,
    /// Where the settled file now lives (none on a dry run).
    pub settled_to: Option<String>,
}

impl ReplayRun {
    /// The run's totals, as `turnsafe replay --json` prints them in its
    /// `summary` record: `files`, `lines`, `replayed`, `duplicate`,
    /// `applied`, `superseded`, `quarantined` (of which `conflict`),
    /// `dry_run`, `foreign_files`.
    pub fn summary(&self, dry_run: bool) -> Value {
        let sum = |f: fn(&FileReport) -> u64| self.files.iter().map(f).sum::<u64>();
        json!({
            "files": self.files.len(), "lines": sum(|r| r.lines), "replayed": sum(|r| r.replayed),
            "duplicate": sum(|r| r.duplicate), "applied": sum(|r| r.applied),
            "superseded": sum(|r| r.superseded), "quarantined": sum(|r| r.quarantined),
            "conflict": sum(|r| r.conflict), "cleared": sum(|r| r.cleared), "dry_run": dry_run,
            "foreign_files": self.foreign_files,
        })
    }

    /// The whole report in one object: the summary's fields, and
    /// `file_reports`, one `replay_file` record per file.
    pub fn report(&self, dry_run: bool) -> Value {
        let mut v = self.summary(dry_run);
        if let Value::Object(m) = &mut v {
            m.insert(
                "file_reports".into(),
                Value::Array(
                    self.files
                        .iter()
                        .map(|r| serde_json::to_value(r).unwrap_or_default())
                        .collect(),
                ),
            );
        }
        v
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("session {session} has a live turn lease held by {holder}; replay refused (use --force to override)")]
    LeaseLive { session: String, holder: String },
    #[error(
        "capture {} (cause {}) is not settled: it holds rows the database may lack, and replaying before it is settled \
         would leave holes in transcripts. Settle it first with `turnsafe recover --source <capture> --output \
         <new.db> --install --home {}` (rows the current state.db has and the capture lacks are carried over), \
         or with `turnsafe recover --source <capture> --dismiss` if its frames do not matter; --force replays \
         anyway",
        join_paths(.captures),
        .causes.iter().map(|c| c.label()).collect::<Vec<_>>().join(", "),
        .home.display()
    )]
    CapturePending {
        captures: Vec<PathBuf>,
        /// Each capture's cause, as its manifest records it.
        causes: Vec<turnsafe_policy::Cause>,
        home: PathBuf,
    },
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    #[error("state.db: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The PostgreSQL target (shown as `postgres://user@host:port/db`).
    #[error("{target}: {message}")]
    Postgres { target: String, message: String },
}

/// Where replay imports to: the same few effects on SQLite and on
/// PostgreSQL. Each chunk of lines is one transaction.
pub trait Target {
    /// The session's turn lease: token, expiry (ms) and holder.
    fn lease(&mut self, session: &str) -> Result<Option<Lease>, ReplayError>;
    /// Before the first chunk is written (SQLite turns its index off).
    fn start(&mut self) -> Result<(), ReplayError>;
    /// Begin a chunk's transaction; the first chunk of a file also makes
    /// sure the session row exists.
    fn begin(&mut self, session: &str, first: bool) -> Result<(), ReplayError>;
    fn commit(&mut self) -> Result<(), ReplayError>;
    /// Roll back whatever is open; errors are ignored (the first one is reported).
    fn rollback(&mut self);
    /// The message stored under `uid`, as its stored JSON text.
    fn stored_item(&mut self, session: &str, uid: &str) -> Result<Option<String>, ReplayError>;
    /// The objects a clear archived under `uid`, as their stored JSON text.
    fn cleared_items(&mut self, session: &str, uid: &str) -> Result<Vec<String>, ReplayError>;
    /// Insert the message unless its uid is stored; `seq` `None` means
    /// after the last. True when it was inserted.
    fn insert(&mut self, session: &str, uid: &str, seq: Option<i64>, row: &Row<'_>) -> Result<bool, ReplayError>;
    /// After the last file (SQLite rebuilds its index).
    fn finish(&mut self) -> Result<(), ReplayError>;
    /// The row stored under a LangGraph record's key, marked or not
    /// (held until the chunk ends, so no writer changes it meanwhile).
    fn graph_stored(&mut self, line: &GraphLine) -> Result<Option<StoredGraph>, ReplayError>;
    /// Store a LangGraph record as a put made at `created_ms`, marked
    /// deleted at `deleted_ms` when given: over the stored row when
    /// `over`, else only when its key is free. True when it was written.
    fn graph_put(
        &mut self,
        line: &GraphLine,
        created_ms: i64,
        deleted_ms: Option<i64>,
        over: bool,
    ) -> Result<bool, ReplayError>;
}

/// A session's turn lease as stored: token, expiry (ms), holder.
pub type Lease = (Option<String>, Option<i64>, Option<String>);

/// A diverted message as it is stored.
pub struct Row<'a> {
    /// The message exactly as it is stored (any JSON object).
    pub message: &'a Message,
}

/// The SQLite store under a home.
struct Sqlite {
    conn: Connection,
    writing: bool,
    /// Whether the database has an archive (read once: replay never makes one).
    has_archive: Option<bool>,
}

impl Sqlite {
    fn open(home: &Path) -> Result<Sqlite, ReplayError> {
        let conn = Connection::open(home.join("state.db"))?;
        let admin = StoreOptions {
            busy_timeout: std::time::Duration::from_secs(10),
            ..StoreOptions::default()
        };
        configure(&conn, &admin)?;
        Ok(Sqlite {
            conn,
            writing: false,
            has_archive: None,
        })
    }
}

impl Target for Sqlite {
    fn lease(&mut self, session: &str) -> Result<Option<Lease>, ReplayError> {
        Ok(self
            .conn
            .query_row(
                "SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = ?1",
                [session],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }
    fn start(&mut self) -> Result<(), ReplayError> {
        self.writing = true;
        Ok(())
    }
    fn begin(&mut self, session: &str, first: bool) -> Result<(), ReplayError> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        if first {
            self.conn.execute(
                "INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)",
                params![session, now_ms()],
            )?;
        }
        Ok(())
    }
    fn commit(&mut self) -> Result<(), ReplayError> {
        Ok(self.conn.execute_batch("COMMIT")?)
    }
    fn rollback(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
    fn stored_item(&mut self, session: &str, uid: &str) -> Result<Option<String>, ReplayError> {
        Ok(rows::stored_item(&self.conn, session, uid)?)
    }
    fn cleared_items(&mut self, session: &str, uid: &str) -> Result<Vec<String>, ReplayError> {
        // A database from before the archive has no clears to look at.
        let has_archive = match self.has_archive {
            Some(known) => known,
            None => {
                let found = self
                    .conn
                    .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'archive'")?
                    .exists([])?;
                *self.has_archive.insert(found)
            }
        };
        if !has_archive {
            return Ok(Vec::new());
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT item FROM archive WHERE session_id = ?1 AND uid = ?2 AND reason = 'clear'")?;
        let items = stmt
            .query_map([session, uid], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(items)
    }
    fn insert(&mut self, session: &str, uid: &str, seq: Option<i64>, row: &Row<'_>) -> Result<bool, ReplayError> {
        let conn = &self.conn;
        // A line goes back to its place unless another message holds it
        // (a writer that diverted it while another writer of the session
        // committed there): then, as a line without a place, at the end.
        let taken = |s: i64| {
            conn.prepare_cached("SELECT 1 FROM messages WHERE session_id = ?1 AND seq = ?2 LIMIT 1")?
                .query_row(params![session, s], |_| Ok(()))
                .optional()
                .map(|found| found.is_some())
        };
        let seq = match seq {
            Some(s) if !taken(s)? => s,
            _ => conn
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = ?1")?
                .query_row([session], |r| r.get(0))?,
        };
        let mut insert = conn.prepare_cached(rows::INSERT_OR_KEEP)?;
        let inserted = rows::insert(&mut insert, session, uid, seq, row.message, now_ms())?;
        Ok(inserted == 1)
    }
    fn graph_stored(&mut self, line: &GraphLine) -> Result<Option<StoredGraph>, ReplayError> {
        Ok(crate::store::graph::stored(&self.conn, line)?)
    }
    fn graph_put(
        &mut self,
        line: &GraphLine,
        created_ms: i64,
        deleted_ms: Option<i64>,
        over: bool,
    ) -> Result<bool, ReplayError> {
        Ok(crate::store::graph::replay_put(
            &self.conn, line, created_ms, deleted_ms, over,
        )?)
    }
    fn finish(&mut self) -> Result<(), ReplayError> {
        // Imported rows land past the index's watermark; index them now. The
        // import is committed either way, and search scans what is not indexed.
        if self.writing
            && let Err(e) = index::catch_up(&self.conn, None, None)
        {
            tracing::warn!(error = %e, "replay: the search index did not catch up");
        }
        Ok(())
    }
}

fn join_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> ReplayError {
    let context = context.into();
    move |source| ReplayError::Io { context, source }
}

/// A line's settlement: its ledger state and reason, and the digests of
/// its canonical bytes and of what its key held.
struct Settled {
    state: &'static str,
    reason: Option<String>,
    digest: Option<String>,
    stored_digest: Option<String>,
}

impl Settled {
    fn quarantined(reason: &str) -> Settled {
        Settled {
            state: "quarantined",
            reason: Some(reason.to_string()),
            digest: None,
            stored_digest: None,
        }
    }

    fn of(v: &Verdict, digest: String, stored_digest: Option<String>) -> Settled {
        Settled {
            state: v.state(),
            reason: v.reason().map(String::from),
            digest: Some(digest),
            stored_digest,
        }
    }
}

/// Replay every pending divert file under `home` (or one session's).
pub fn replay(home: &Path, opts: &ReplayOptions) -> Result<Vec<FileReport>, ReplayError> {
    replay_run(home, opts).map(|run| run.files)
}

/// [`replay`], also naming the files it left alone.
pub fn replay_run(home: &Path, opts: &ReplayOptions) -> Result<ReplayRun, ReplayError> {
    replay_into(home, opts, || {
        Sqlite::open(home).map(|t| Box::new(t) as Box<dyn Target>)
    })
}

/// Replay the divert files under `home` into the target `open` makes
/// (opened only when there is a `sessions/` folder).
pub fn replay_into(
    home: &Path,
    opts: &ReplayOptions,
    open: impl FnOnce() -> Result<Box<dyn Target>, ReplayError>,
) -> Result<ReplayRun, ReplayError> {
    if !opts.force {
        let pending = captures::pending(home).map_err(io_err(format!("list captures in {}", home.display())))?;
        if !pending.is_empty() {
            return Err(ReplayError::CapturePending {
                causes: pending
                    .iter()
                    .map(|c| {
                        c.manifest()
                            .map(|m| m.cause())
                            .unwrap_or(turnsafe_policy::Cause::Unknown)
                    })
                    .collect(),
                captures: pending.into_iter().map(|c| c.path).collect(),
                home: home.to_path_buf(),
            });
        }
    }
    let sessions = home.join("sessions");
    let settling = sessions.join("settling");
    let settled = sessions.join("settled");
    // Divert files are read only from a real folder, where divert writes
    // them: never from wherever a symlink at `sessions/` points.
    if std::fs::symlink_metadata(&sessions).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(io_err(format!(
            "{} is a symbolic link, not a folder",
            sessions.display()
        ))(io::Error::from_raw_os_error(libc::ELOOP)));
    }
    if !sessions.is_dir() {
        return Ok(ReplayRun::default());
    }
    let listing = divert_files::list(&sessions, opts.session.as_deref())
        .map_err(io_err(format!("list {}", sessions.display())))?;
    let mut run = ReplayRun {
        files: Vec::new(),
        foreign_files: listing.foreign,
    };
    let mut target = open()?;
    let conn = target.as_mut();

    let reports = &mut run.files;
    if opts.dry_run {
        for (session, path) in &listing.divert {
            reports.push(settle_file(conn, session, path, None)?);
        }
        return Ok(run);
    }
    for dir in [&settling, &settled] {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err(format!("mkdir {}", dir.display())))?;
    }
    // Take each pending file from under its writers.
    for (session, path) in &listing.divert {
        check_lease(conn, session, opts.force)?;
        take(path, &settling, session)?;
    }
    sync_dir(&settling).map_err(io_err("fsync settling/"))?;
    sync_dir(&sessions).map_err(io_err("fsync sessions/"))?;

    conn.start()?;
    let mut ledger = open_ledger(&sessions)?;
    for (session, path) in settling_files(&settling, opts)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let target = settled.join(&name);
        let mut report = settle_file(conn, &session, &path, Some(&mut ledger))?;
        crate::failpoint::hit("replay.before_settle");
        std::fs::rename(&path, &target).map_err(io_err(format!("settle {name}")))?;
        sync_dir(&settled).map_err(io_err("fsync settled/"))?;
        report.settled_to = Some(target.to_string_lossy().into_owned());
        reports.push(report);
    }
    // The names left `settling/`: a cut must not bring a settled file back
    // there to be settled again.
    sync_dir(&settling).map_err(io_err("fsync settling/"))?;
    conn.finish()?;
    Ok(run)
}

/// Open `sessions/ledger.jsonl` for appending, and make its entry in
/// `sessions/` (and the entries of `settling/` and `settled/`, made just
/// before) durable before any line of it counts: whoever created it, a
/// ledger line fsynced into a file whose name a power cut can take proves
/// nothing.
pub(crate) fn open_ledger(sessions: &Path) -> Result<File, ReplayError> {
    let ledger = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(sessions.join(divert_files::LEDGER))
        .map_err(io_err("open ledger.jsonl"))?;
    crate::divert::sync_path_entries(sessions).map_err(io_err("fsync sessions/"))?;
    Ok(ledger)
}

/// Files in `settling/`, named `<session>@<stamp>.jsonl`.
pub(crate) fn settling_files(settling: &Path, opts: &ReplayOptions) -> Result<Vec<(String, PathBuf)>, ReplayError> {
    files_by_session(settling, opts, crate::settle::session_of_settling)
}

/// The regular files of `dir` whose name `session_of` maps to a session
/// (the one asked for, if any), sorted.
fn files_by_session(
    dir: &Path,
    opts: &ReplayOptions,
    session_of: impl Fn(&str) -> Option<&str>,
) -> Result<Vec<(String, PathBuf)>, ReplayError> {
    let context = format!("list {}", dir.display());
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(context.clone()))? {
        let path = entry.map_err(io_err(context.clone()))?.path();
        let Some(session) = path.file_name().and_then(|n| n.to_str()).and_then(&session_of) else {
            continue;
        };
        if !path.is_file() || opts.session.as_deref().is_some_and(|s| s != session) {
            continue;
        }
        out.push((session.to_string(), path));
    }
    out.sort();
    Ok(out)
}

fn check_lease(conn: &mut dyn Target, session: &str, force: bool) -> Result<(), ReplayError> {
    let row = conn.lease(session)?;
    // A lease ends on its expiry, or on the policy's word that its holder
    // is gone (a writer that was killed leaves its lease behind).
    if let Some((Some(_), expires, stored)) = row
        && !force
        && let crate::lease_proof::Judged::Fenced(holder) = crate::lease_proof::judge(
            session,
            stored.as_deref(),
            expires,
            now_ms(),
            turnsafe_policy::ServerProbe::Unrecorded,
        )
    {
        return Err(ReplayError::LeaseLive {
            session: session.into(),
            holder: holder.name,
        });
    }
    Ok(())
}

/// Rename a divert file into `settling/` while holding its lock, so no
/// writer is appending to it at that moment.
pub(crate) fn take(path: &Path, settling: &Path, session: &str) -> Result<(), ReplayError> {
    // A FIFO put in its place since it was listed must not hang replay.
    let f = crate::lines::open_regular(path).map_err(io_err(format!("open {}", path.display())))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io_err(format!("lock {}", path.display()))(e.into()))?;
    let stamp = format!("{}-{}", now_ms(), std::process::id());
    let target = settling.join(format!("{session}@{stamp}.jsonl"));
    crate::failpoint::hit("replay.before_take");
    std::fs::rename(path, &target).map_err(io_err(format!("move {} to settling/", path.display())))?;
    drop(f);
    Ok(())
}

/// Settle every line of one file. With no ledger, nothing is written (dry run).
fn settle_file(
    conn: &mut dyn Target,
    session: &str,
    path: &Path,
    mut ledger: Option<&mut File>,
) -> Result<FileReport, ReplayError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut report = FileReport {
        file: name.clone(),
        session: session.into(),
        ..FileReport::default()
    };
    // Never through a symlink, never blocking on a FIFO put in its place.
    let f = crate::lines::open_regular(path).map_err(io_err(format!("open {name}")))?;
    let mut reader = BufReader::with_capacity(1 << 16, f);
    let write = ledger.is_some();
    let (mut offset, mut line_no) = (0u64, 0u64);
    let mut buf = Vec::new();
    let mut chunk: Vec<Value> = Vec::new();
    let mut first_chunk = true;
    loop {
        if write {
            conn.begin(session, first_chunk)?;
            first_chunk = false;
        }
        let mut eof = false;
        let result = (|| -> Result<(), ReplayError> {
            for _ in 0..CHUNK {
                // A line past the bound is read past, never held whole
                // (a file of several GB without a newline is one line).
                let Some((n, fits)) = crate::lines::read_line(&mut reader, &mut buf, MAX_DIVERT_LINE)
                    .map_err(io_err(format!("read {name}")))?
                else {
                    eof = true;
                    break;
                };
                line_no += 1;
                let line_offset = offset;
                offset += n;
                // Only a line of ASCII whitespace (JSON's own) is blank: any
                // other byte gets a ledger entry.
                if fits == Line::Whole && buf.trim_ascii().is_empty() {
                    continue;
                }
                // Never read as lossy text: replay would store other bytes
                // than the line's.
                let (uid, settled) = match std::str::from_utf8(&buf) {
                    _ if fits == Line::TooLong => {
                        (None, Settled::quarantined(&crate::lines::too_long(n, MAX_DIVERT_LINE)))
                    }
                    Ok(text) => settle_line(conn, session, text.trim_end_matches('\n'), !write)?,
                    Err(_) => (None, Settled::quarantined("not UTF-8")),
                };
                match settled.state {
                    "replayed" => report.replayed += 1,
                    "duplicate" => report.duplicate += 1,
                    "applied" => report.applied += 1,
                    "superseded" => report.superseded += 1,
                    "conflict" => {
                        report.conflict += 1;
                        report.quarantined += 1;
                    }
                    "cleared" => report.cleared += 1,
                    _ => report.quarantined += 1,
                }
                report.lines += 1;
                chunk.push(json!({
                    "file": name, "line": line_no, "offset": line_offset, "session": session,
                    "uid": uid, "state": settled.state, "reason": settled.reason,
                    "digest": settled.digest, "stored_digest": settled.stored_digest, "at_ms": now_ms(),
                }));
            }
            Ok(())
        })();
        if write {
            if let Err(e) = result {
                conn.rollback();
                return Err(e);
            }
            crate::failpoint::hit("replay.before_commit");
            conn.commit()?;
            crate::failpoint::hit("replay.before_ledger");
            if let Some(l) = ledger.as_deref_mut() {
                let mut out = Vec::new();
                for entry in chunk.drain(..) {
                    serde_json::to_writer(&mut out, &entry)
                        .map_err(|e| io_err("encode ledger")(io::Error::other(e)))?;
                    out.push(b'\n');
                }
                l.write_all(&out).map_err(io_err("write ledger.jsonl"))?;
                l.sync_all().map_err(io_err("fsync ledger.jsonl"))?;
            }
        } else {
            result?;
            chunk.clear();
        }
        if eof {
            break;
        }
    }
    Ok(report)
}

/// A divert line read back: its uid, seq (when it has one) and message.
pub(crate) type DivertLine = (String, Option<i64>, Message);

/// A divert line read back, or why it cannot be read (with its uid when it
/// has one).
pub(crate) fn parse_divert_line(text: &str, session: &str) -> Result<DivertLine, (Option<String>, &'static str)> {
    let Ok(v) = crate::json_in::value(text) else {
        return Err((None, "torn or invalid JSON"));
    };
    let Some(obj) = v.as_object() else {
        return Err((None, "not a JSON object"));
    };
    let uid = obj.get("uid").and_then(Value::as_str).map(String::from);
    let quarantine = |r: &'static str| Err((uid.clone(), r));
    let version = obj.get("v").and_then(Value::as_u64);
    if !matches!(version, Some(1) | Some(FORMAT_VERSION)) {
        return quarantine("unsupported or missing format version `v`");
    }
    if obj.get("session").and_then(Value::as_str) != Some(session) {
        return quarantine("line belongs to another session");
    }
    let Some(uid_s) = uid.clone().filter(|u| crate::message::valid_uid(u)) else {
        return quarantine("missing or invalid `uid`");
    };
    let Some(Value::Object(item)) = obj.get("message") else {
        return quarantine("missing `message` object");
    };
    let mut item = item.clone();
    if version == Some(1) {
        // Version 1 wrote the uid inside the message, and always had `role`
        // and `content`; the uid lives beside the message now.
        item.remove("uid");
        if !(item.get("role").is_some_and(Value::is_string) && item.contains_key("content")) {
            return quarantine("`message` needs `role` and `content`");
        }
    }
    let message = Message::from_item(item);
    let seq = match obj.get("seq") {
        None | Some(Value::Null) => None,
        Some(s) => match s.as_i64() {
            Some(n) => Some(n),
            None => return quarantine("`seq` is not an integer"),
        },
    };
    Ok((uid_s, seq, message))
}

/// Decide and (unless dry) import one line.
fn settle_line(
    conn: &mut dyn Target,
    session: &str,
    text: &str,
    dry: bool,
) -> Result<(Option<String>, Settled), ReplayError> {
    // A LangGraph checkpoint or write (version 3): settled by its bytes
    // against what its key holds.
    if let Ok(Value::Object(obj)) = crate::json_in::value(text)
        && let Some(parsed) = GraphLine::parse(&obj, session)
    {
        let uid = obj.get("uid").and_then(Value::as_str).map(String::from);
        return match parsed {
            Ok(line) => Ok((uid, settle_graph_line(conn, &line, divert_time_ms(&obj), dry)?)),
            Err(reason) => Ok((uid, Settled::quarantined(reason))),
        };
    }
    let (uid_s, seq, message) = match parse_divert_line(text, session) {
        Ok(parsed) => parsed,
        Err((uid, reason)) => return Ok((uid, Settled::quarantined(reason))),
    };
    let uid = Some(uid_s.clone());
    let digest = crate::same::digest_bytes(crate::same::canonical_object(message.item()).as_bytes());
    // A clear archives a session's pending lines with its rows, then
    // settles them; a clear cut short in between leaves them pending. One
    // a clear archived byte for byte is that clear's, not the session's.
    if conn
        .cleared_items(session, &uid_s)?
        .iter()
        .any(|t| crate::same::digest_text(t) == digest)
    {
        return Ok((
            uid,
            Settled {
                state: "cleared",
                reason: Some("the session was cleared: the line is in the archive".into()),
                digest: Some(digest.clone()),
                stored_digest: Some(digest),
            },
        ));
    }
    if !dry && conn.insert(session, &uid_s, seq, &Row { message: &message })? {
        return Ok((uid, Settled::of(&Verdict::Insert, digest, None)));
    }
    // Stored already (or, on a dry run, maybe): compare bytes.
    let stored = conn.stored_item(session, &uid_s)?.map(|t| crate::same::digest_text(&t));
    let verdict = match settle::message(&digest, stored.as_deref()) {
        // The insert found the uid taken, and now nothing holds it: the
        // row changed under replay, which a person must look at.
        Verdict::Insert if !dry => Verdict::Conflict("the stored message changed while replay read it"),
        v => v,
    };
    Ok((uid, Settled::of(&verdict, digest, stored)))
}

/// When a line was diverted (its `at`, RFC 3339), in ms since the epoch.
fn divert_time_ms(obj: &serde_json::Map<String, Value>) -> Option<i64> {
    let at = humantime::parse_rfc3339(obj.get("at")?.as_str()?).ok()?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()
}

/// Settle a LangGraph line as the live call would have, had it been made
/// when the line was diverted ([`settle::graph`]).
fn settle_graph_line(
    conn: &mut dyn Target,
    line: &GraphLine,
    at_ms: Option<i64>,
    dry: bool,
) -> Result<Settled, ReplayError> {
    let digest = line.digest();
    // A key taken between the read and the insert (another writer of the
    // thread on PostgreSQL) is read again; the second read holds the row.
    for _ in 0..2 {
        let stored = conn.graph_stored(line)?;
        let facts = stored.as_ref().map(|s| settle::Stored {
            digest: s.record.digest(),
            created_ms: s.created_ms,
            deleted_ms: s.deleted_ms,
        });
        let verdict = settle::graph(&digest, line.replaces(), at_ms, facts.as_ref());
        let stored_digest = facts.map(|f| f.digest);
        if !dry {
            let created = at_ms.unwrap_or_else(now_ms);
            match verdict {
                Verdict::Insert if !conn.graph_put(line, created, None, false)? => continue,
                Verdict::Apply { deleted_ms } => {
                    conn.graph_put(line, created, deleted_ms, true)?;
                }
                _ => {}
            }
        }
        return Ok(Settled::of(&verdict, digest, stored_digest));
    }
    let v = Verdict::Conflict("the stored version changed while replay read it");
    Ok(Settled::of(&v, digest, None))
}
