//! Recovery: copy what is readable from a damaged or retired database into
//! a fresh one. The source is never opened in place: its main file and
//! sidecars are copied first, and the copy is aborted if they changed
//! while being copied. Installing the result obeys the publish refusal,
//! and carries over every row of the replaced database that the rebuilt
//! one lacks, so no order of replay, recover and install loses a line.
//! Installing from a capture, or dismissing one, settles it
//! ([`crate::captures`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use serde_json::{Value, json};

use crate::captures::{self, How, Settled, Status};
use crate::db_copy::{CopyError, Fingerprint, fingerprint};
use crate::holders;
use crate::message::Message;
use crate::rows;
use crate::store::{StoreOptions, configure, schema};

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("no database at {0} (a db file, or a capture folder holding state.db)")]
    NoSource(PathBuf),
    #[error("{0} is not a capture folder (state.db.retired-*, or a folder holding its manifest.json)")]
    NotACapture(PathBuf),
    #[error("{0} changed while it was being copied; try again when no process writes to it")]
    Changed(PathBuf),
    /// Acting could lose data; the text says what was refused and why.
    #[error("{0}")]
    Refused(String),
    #[error(
        "cannot read {path} to carry its rows over: {source}; nothing was installed (move it aside yourself if \
         its rows are not needed)"
    )]
    CarryOver { path: PathBuf, source: rusqlite::Error },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

impl From<CopyError> for RecoverError {
    fn from(e: CopyError) -> RecoverError {
        match e {
            CopyError::NoSource(p) => RecoverError::NoSource(p),
            CopyError::Changed(p) => RecoverError::Changed(p),
            CopyError::Io { context, source } => RecoverError::Io { context, source },
        }
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RecoverError {
    let context = context.into();
    move |source| RecoverError::Io { context, source }
}

/// Copy the source into `work`, checking nothing changed during the copy
/// ([`crate::db_copy`]).
pub fn copy_source(source: &Path, work: &Path) -> Result<Vec<Value>, RecoverError> {
    Ok(crate::db_copy::copy_source(source, work)?)
}

/// What a copy of the source holds.
pub fn inspect(db: &Path) -> Result<Value, RecoverError> {
    let c = Connection::open(db)?;
    let check: Vec<String> = {
        let mut s = c.prepare("PRAGMA quick_check")?;
        s.query_map([], |r| r.get(0))?.filter_map(Result::ok).collect()
    };
    let count = |sql: &str| -> Option<i64> { c.query_row(sql, [], |r| r.get(0)).ok() };
    let mut per_session = serde_json::Map::new();
    if let Ok(mut s) = c.prepare("SELECT session_id, count(*) FROM messages GROUP BY session_id ORDER BY session_id")
        && let Ok(rows) = s.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
    {
        for (k, n) in rows.flatten() {
            per_session.insert(k, n.into());
        }
    }
    let generation: Option<String> = c
        .query_row("SELECT value FROM state_meta WHERE key = 'generation'", [], |r| {
            r.get(0)
        })
        .optional()
        .ok()
        .flatten();
    Ok(json!({
        "quick_check": check,
        "sessions": count("SELECT count(*) FROM sessions"),
        "messages": count("SELECT count(*) FROM messages"),
        "messages_by_session": per_session,
        "schema_version": count("PRAGMA user_version"),
        "generation": generation,
    }))
}

/// Copy sessions and messages from `src` into a fresh database at
/// `output`, row by row so one unreadable row does not cost the rest.
pub fn rebuild(src: &Path, output: &Path) -> Result<Value, RecoverError> {
    if output.exists() {
        return Err(RecoverError::Refused(format!(
            "refusing to write {}: it already exists",
            output.display()
        )));
    }
    let from = Connection::open_with_flags(src, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(output)
            .map_err(io_err(format!("create {}", output.display())))?;
    }
    let to = Connection::open(output)?;
    configure(&to, &StoreOptions::default())?;
    let (mut sessions, mut messages, mut unreadable) = (0u64, 0u64, 0u64);
    // Copy without the index, then rebuild it once.
    to.execute_batch("BEGIN IMMEDIATE")?;
    schema::disable_fts(&to)?;
    {
        let mut s = from.prepare("SELECT id, created_ms FROM sessions")?;
        let rows = s.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            match row {
                Ok((id, created)) => {
                    to.execute(
                        "INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)",
                        rusqlite::params![id, created],
                    )?;
                    sessions += 1;
                }
                Err(_) => unreadable += 1,
            }
        }
        let total: i64 = from
            .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
            .unwrap_or(0);
        let bar = progress(total.max(0) as u64);
        let items = rows::has_items(&from)?;
        let mut s = from.prepare(&format!(
            "SELECT session_id, uid, seq, created_ms, {} FROM messages ORDER BY id",
            rows::item_columns(items)
        ))?;
        let found = s.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                rows::read_item(r, 4, items)?,
            ))
        })?;
        let mut insert = to.prepare_cached(rows::INSERT_OR_KEEP)?;
        for row in found {
            match row {
                Ok((sid, uid, seq, created, item)) => {
                    to.execute(
                        "INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)",
                        rusqlite::params![sid, created],
                    )?;
                    rows::insert(&mut insert, &sid, &uid, seq, &Message::from_item(item), created)?;
                    messages += 1;
                    bar.inc(1);
                }
                Err(_) => unreadable += 1,
            }
        }
        bar.finish_and_clear();
    }
    to.execute_batch("COMMIT")?;
    schema::rebuild_fts(&to)?;
    let _: (i64, i64, i64) = to.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?;
    drop(to);
    Ok(json!({ "sessions": sessions, "messages": messages, "unreadable_rows": unreadable }))
}

/// A progress bar on stderr for large inputs, only when stderr is a terminal.
fn progress(total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if total < 50_000 || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template("recovering {bar:40} {pos}/{len} messages ({eta})") {
        bar.set_style(style);
    }
    bar
}

/// Refuse while any process (this one included) holds `db` or a sidecar,
/// or while that cannot be told.
fn refuse_if_held(db: &Path, what: &str) -> Result<(), RecoverError> {
    let held = holders::scan(&holders::db_files(db), false).map_err(io_err("scan /proc"))?;
    if !held.unreadable.is_empty() {
        return Err(RecoverError::Refused(format!(
            "{what}: cannot tell whether processes {:?} hold {} (their /proc/<pid>/fd is unreadable)",
            held.unreadable,
            db.display()
        )));
    }
    if !held.is_empty() {
        return Err(RecoverError::Refused(format!(
            "{what}: {} or its sidecars are held open by pid(s) {:?}",
            db.display(),
            held.pids()
        )));
    }
    Ok(())
}

/// Identities and sizes of the files that exist among `files`.
fn fingerprints(files: &[PathBuf]) -> Result<Vec<Option<Fingerprint>>, RecoverError> {
    files
        .iter()
        .map(|f| {
            if f.exists() {
                fingerprint(f).map(Some).map_err(RecoverError::from)
            } else {
                Ok(None)
            }
        })
        .collect()
}

/// Rows of the replaced database copied into the installed one.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CarryOver {
    /// Messages whose (session, uid) the rebuilt database lacked.
    pub rows: u64,
    pub by_session: BTreeMap<String, u64>,
    /// Messages the rebuilt database has under the same uid with other
    /// content: the rebuilt row stays, the other is in the set-aside file.
    pub conflicts: u64,
    /// Rows of the replaced database that could not be read (they remain
    /// in the set-aside file).
    pub unreadable: u64,
}

/// Copy into `new_db` every message of the database at `current` whose
/// (session, uid) `new_db` lacks, in `seq` order, keeping each `seq`. The
/// current database is copied first and read from the copy.
pub fn carry_over(current: &Path, new_db: &Path) -> Result<CarryOver, RecoverError> {
    let mut out = CarryOver::default();
    // No file (never created, or a directory in its place): no rows.
    if !current.is_file() {
        return Ok(out);
    }
    let work = tempfile::tempdir().map_err(io_err("work folder"))?;
    copy_source(current, work.path())?;
    let unreadable = |source| RecoverError::CarryOver {
        path: current.to_path_buf(),
        source,
    };
    let from = Connection::open_with_flags(work.path().join("state.db"), OpenFlags::SQLITE_OPEN_READ_WRITE)
        .map_err(unreadable)?;
    let tables: i64 = from
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('sessions', 'messages')",
            [],
            |r| r.get(0),
        )
        .map_err(unreadable)?;
    // A database the writer never got to create its schema in holds no rows.
    if tables < 2 {
        return Ok(out);
    }
    let to = Connection::open(new_db)?;
    to.busy_timeout(std::time::Duration::from_secs(10))?;
    to.execute_batch("BEGIN IMMEDIATE")?;
    let copied = (|| -> Result<(), RecoverError> {
        let mut sessions = from
            .prepare("SELECT id, created_ms FROM sessions")
            .map_err(unreadable)?;
        let rows = sessions
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(unreadable)?;
        for row in rows {
            match row {
                Ok((id, created)) => {
                    to.execute(
                        "INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)",
                        rusqlite::params![id, created],
                    )?;
                }
                Err(_) => out.unreadable += 1,
            }
        }
        let items = rows::has_items(&from).map_err(unreadable)?;
        let mut messages = from
            .prepare(&format!(
                "SELECT session_id, uid, seq, created_ms, {} FROM messages ORDER BY session_id, seq, id",
                rows::item_columns(items)
            ))
            .map_err(unreadable)?;
        let found = messages
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    rows::read_item(r, 4, items)?,
                ))
            })
            .map_err(unreadable)?;
        let mut insert = to.prepare_cached(rows::INSERT_OR_KEEP)?;
        for row in found {
            let Ok((sid, uid, seq, created, item)) = row else {
                out.unreadable += 1;
                continue;
            };
            to.execute(
                "INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)",
                rusqlite::params![sid, created],
            )?;
            let message = Message::from_item(item);
            if rows::insert(&mut insert, &sid, &uid, seq, &message, created)? == 1 {
                out.rows += 1;
                *out.by_session.entry(sid).or_default() += 1;
            } else if !rows::same_row(&to, &sid, &uid, &message)? {
                out.conflicts += 1;
            }
        }
        Ok(())
    })();
    match copied {
        Ok(()) => to.execute_batch("COMMIT")?,
        Err(e) => {
            if !to.is_autocommit() {
                let _ = to.execute_batch("ROLLBACK");
            }
            return Err(e);
        }
    }
    // The carried rows land past the search index's watermark: index them
    // now, so the installed database's index is complete. They are
    // committed either way, and search scans what is not indexed.
    if let Err(e) = crate::store::index::catch_up(&to, None, None) {
        tracing::warn!(error = %e, "carry-over: the search index did not catch up");
    }
    // Everything into the main file: it is installed without its WAL.
    let _: (i64, i64, i64) = to.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?;
    drop(to);
    Ok(out)
}

/// What an install did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Installed {
    /// The new `state.db`.
    pub installed: String,
    /// Where the old files went.
    pub set_aside: Vec<String>,
    /// Rows of the old `state.db` the rebuilt database lacked, now in it.
    pub carried_over: u64,
    pub carried_over_by_session: BTreeMap<String, u64>,
    /// Old rows under a uid the rebuilt database holds with other content.
    pub carry_conflicts: u64,
    /// Old rows that could not be read.
    pub carry_unreadable: u64,
}

/// Install `new_db` as `home/state.db`, unless any process holds the old
/// file or its sidecars. Every row of the old database that `new_db`
/// lacks is carried over first; the old files are then set aside under a
/// dated name, never deleted.
pub fn install(new_db: &Path, home: &Path) -> Result<Installed, RecoverError> {
    let target = home.join("state.db");
    let files = holders::db_files(&target);
    refuse_if_held(&target, "refusing to install")?;
    fold_wal(&target);
    let before = fingerprints(&files)?;
    let carried = carry_over(&target, new_db)?;
    // The old rows were read from a copy: nobody may have opened or
    // changed the old files since.
    refuse_if_held(&target, "refusing to install")?;
    if fingerprints(&files)? != before {
        return Err(RecoverError::Changed(target));
    }
    let stamp = crate::capture::utc_stamp();
    let mut set_aside = Vec::new();
    // Whatever part of the swap a power cut keeps, a database stays at the
    // path: the old main file gets its set-aside name as a second link (it
    // stays at the path), the old sidecars are moved aside (an old WAL must
    // never meet the new file), and one rename then puts the new file over
    // the old. Renaming the old file away first left no `state.db` at all
    // when a cut kept that rename and not the next one.
    for f in &files {
        if f.exists() {
            let mut aside = f.as_os_str().to_owned();
            aside.push(format!(".replaced-{stamp}"));
            let moved = if *f == target {
                std::fs::hard_link(f, &aside).or_else(|_| std::fs::rename(f, &aside))
            } else {
                std::fs::rename(f, &aside)
            };
            moved.map_err(io_err(format!("set aside {}", f.display())))?;
            set_aside.push(PathBuf::from(aside).to_string_lossy().into_owned());
        }
    }
    // Same filesystem: rename over the old file; otherwise copy, fsync,
    // rename.
    if std::fs::rename(new_db, &target).is_err() {
        let tmp = home.join(".state.db.installing");
        std::fs::copy(new_db, &tmp).map_err(io_err("copy the new database"))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io_err("fsync the new database"))?;
        std::fs::rename(&tmp, &target).map_err(io_err("install the new database"))?;
    }
    crate::divert::sync_dir(home).map_err(io_err("fsync home"))?;
    Ok(Installed {
        installed: target.to_string_lossy().into_owned(),
        set_aside,
        carried_over: carried.rows,
        carried_over_by_session: carried.by_session,
        carry_conflicts: carried.conflicts,
        carry_unreadable: carried.unreadable,
    })
}

/// Checkpoint the WAL of the database at `db` into its main file (SQLite
/// then removes the WAL at the close), as any writer's open would: the
/// swap moves the old WAL aside before the new file takes the path, and a
/// power cut between the two must not leave the old file at the path
/// without the frames a killed writer committed. Best effort: a file that
/// cannot be opened keeps its WAL, set aside with it.
fn fold_wal(db: &Path) {
    let wal = crate::guard::path_of(db, crate::guard::Part::Wal);
    if std::fs::metadata(&wal).map_or(true, |m| m.len() == 0) {
        return;
    }
    if let Ok(c) = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE) {
        let _ = c.busy_timeout(std::time::Duration::from_secs(5));
        if let Err(e) = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
            tracing::warn!(db = %db.display(), error = %e, "could not fold the old WAL in before the install");
        }
    }
}

/// Mark `capture` settled by an install from it.
pub fn settle_installed(capture: &Path, installed: &Installed) -> Result<PathBuf, RecoverError> {
    let mut marker = Settled::now(How::Installed);
    marker.carried_over = installed.carried_over;
    marker.carried_over_by_session = installed.carried_over_by_session.clone();
    marker.installed = Some(installed.installed.clone());
    captures::settle(capture, &marker).map_err(io_err(format!("write {}", captures::MARKER)))
}

/// The process that made `capture`, if it is still running: from its
/// manifest (pid and start time), else from the folder's name
/// (`state.db.retired-<UTC>-<pid>`).
fn maker_alive(capture: &Path) -> Option<u32> {
    let (pid, started) = match captures::manifest(capture) {
        Ok(m) if m.pid.is_some() => (m.pid?, m.pid_start),
        _ => {
            let name = capture.file_name()?.to_string_lossy().into_owned();
            (name.rsplit_once('-')?.1.parse().ok()?, None)
        }
    };
    (pid != std::process::id() && crate::holders::alive(pid, started)).then_some(pid)
}

/// The capture folder `source` names: the folder itself, or the folder a
/// `state.db` inside one sits in.
pub fn capture_of(source: &Path) -> Option<PathBuf> {
    if source.is_dir() {
        return captures::is_capture(source).then(|| source.to_path_buf());
    }
    let parent = source.parent()?;
    let named_state_db = source.file_name().is_some_and(|n| n == "state.db");
    (named_state_db && captures::is_capture(parent)).then(|| parent.to_path_buf())
}

/// A dismissal.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Dismissed {
    pub capture: String,
    /// The marker's path.
    pub settled: String,
    /// It was settled before; the marker was left as it was.
    pub already_settled: bool,
    pub marker: Settled,
}

/// Settle `capture` without installing anything: the operator decided its
/// frames do not matter. Refused while the process that made it is alive:
/// that process may still hold frames of the retired generation the
/// capture lacks. Other writers of the home, which divert the sessions it
/// holds without holding the database for it, do not block it.
pub fn dismiss(capture: &Path, home: &Path) -> Result<Dismissed, RecoverError> {
    if !captures::is_capture(capture) {
        return Err(RecoverError::NotACapture(capture.to_path_buf()));
    }
    let _ = home;
    if let Some(pid) = maker_alive(capture) {
        return Err(RecoverError::Refused(format!(
            "refusing to dismiss {}: pid {pid}, which made it, is still running and may hold frames it lacks; \
             stop it first (or settle the capture with `--install`)",
            capture.display()
        )));
    }
    let settled_path = capture.join(captures::MARKER);
    let (marker, already_settled) = match captures::status(capture) {
        Status::Settled(marker) => (marker, true),
        Status::Pending | Status::Unreadable(_) => {
            let marker = Settled::now(How::Dismissed);
            captures::settle(capture, &marker).map_err(io_err(format!("write {}", captures::MARKER)))?;
            (marker, false)
        }
    };
    Ok(Dismissed {
        capture: capture.to_string_lossy().into_owned(),
        settled: settled_path.to_string_lossy().into_owned(),
        already_settled,
        marker,
    })
}
