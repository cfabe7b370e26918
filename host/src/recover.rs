//! Recovery: copy what is readable from a damaged or retired database into
//! a fresh one. The source is never opened in place: its main file and
//! sidecars are copied first, and the copy is aborted if they changed
//! while being copied. Installing the result obeys the publish refusal.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::holders;
use crate::store::{StoreOptions, configure, schema};

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("no database at {0} (a db file, or a capture folder holding state.db)")]
    NoSource(PathBuf),
    #[error("{0} changed while it was being copied; try again when no process writes to it")]
    Changed(PathBuf),
    #[error("refusing to install: {0}")]
    Refused(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RecoverError {
    let context = context.into();
    move |source| RecoverError::Io { context, source }
}

/// The source's main file and which sidecars exist.
fn source_files(source: &Path) -> Result<Vec<(PathBuf, &'static str)>, RecoverError> {
    let main = if source.is_dir() {
        source.join("state.db")
    } else {
        source.to_path_buf()
    };
    if !main.is_file() {
        return Err(RecoverError::NoSource(source.to_path_buf()));
    }
    let mut out = vec![(main.clone(), "state.db")];
    for (suffix, name) in [("-wal", "state.db-wal"), ("-shm", "state.db-shm")] {
        let mut p = main.as_os_str().to_owned();
        p.push(suffix);
        let p = PathBuf::from(p);
        if p.is_file() {
            out.push((p, name));
        }
    }
    Ok(out)
}

fn fingerprint(p: &Path) -> Result<(u64, u64, i64, i64), RecoverError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).map_err(io_err(format!("stat {}", p.display())))?;
    Ok((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// Copy the source into `work`, checking nothing changed during the copy.
pub fn copy_source(source: &Path, work: &Path) -> Result<Vec<Value>, RecoverError> {
    let mut copied = Vec::new();
    for (path, name) in source_files(source)? {
        let before = fingerprint(&path)?;
        let data = std::fs::read(&path).map_err(io_err(format!("read {}", path.display())))?;
        let after = fingerprint(&path)?;
        if before != after || data.len() as u64 != after.1 {
            return Err(RecoverError::Changed(path));
        }
        std::fs::write(work.join(name), &data).map_err(io_err(format!("copy {name}")))?;
        copied.push(
            json!({ "file": name, "from": path.to_string_lossy(), "size": data.len(),
                            "sha256": hex::encode(Sha256::digest(&data)) }),
        );
    }
    Ok(copied)
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
        return Err(RecoverError::Refused(format!("{} already exists", output.display())));
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
        let mut s = from.prepare(
            "SELECT session_id, uid, seq, role, content, content_json, extra, created_ms FROM messages ORDER BY id",
        )?;
        let rows = s.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, bool>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, i64>(7)?,
            ))
        })?;
        for row in rows {
            match row {
                Ok((sid, uid, seq, role, content, cj, extra, created)) => {
                    to.execute(
                        "INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)",
                        rusqlite::params![sid, created],
                    )?;
                    to.execute(
                        "INSERT OR IGNORE INTO messages(session_id, uid, seq, role, content, content_json, extra, created_ms) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        rusqlite::params![sid, uid, seq, role, content, cj, extra, created],
                    )?;
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

/// Install `new_db` as `home/state.db`, unless any process holds the old
/// file or its sidecars. The old files are set aside under a dated name.
pub fn install(new_db: &Path, home: &Path) -> Result<Value, RecoverError> {
    let target = home.join("state.db");
    let files = holders::db_files(&target);
    let held = holders::scan(&files, false).map_err(io_err("scan /proc"))?;
    if !held.unreadable.is_empty() {
        return Err(RecoverError::Refused(format!(
            "cannot tell whether processes {:?} hold {} (their /proc/<pid>/fd is unreadable)",
            held.unreadable,
            target.display()
        )));
    }
    if !held.is_empty() {
        return Err(RecoverError::Refused(format!(
            "{} or its sidecars are held open by pid(s) {:?}",
            target.display(),
            held.pids()
        )));
    }
    let stamp = crate::capture::utc_stamp();
    let mut set_aside = Vec::new();
    for f in &files {
        if f.exists() {
            let mut aside = f.as_os_str().to_owned();
            aside.push(format!(".replaced-{stamp}"));
            std::fs::rename(f, &aside).map_err(io_err(format!("set aside {}", f.display())))?;
            set_aside.push(PathBuf::from(aside).to_string_lossy().into_owned());
        }
    }
    // Same filesystem: rename; otherwise copy, fsync, rename.
    if std::fs::rename(new_db, &target).is_err() {
        let tmp = home.join(".state.db.installing");
        std::fs::copy(new_db, &tmp).map_err(io_err("copy the new database"))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io_err("fsync the new database"))?;
        std::fs::rename(&tmp, &target).map_err(io_err("install the new database"))?;
    }
    crate::divert::sync_dir(home).map_err(io_err("fsync home"))?;
    Ok(json!({ "installed": target.to_string_lossy(), "set_aside": set_aside }))
}
