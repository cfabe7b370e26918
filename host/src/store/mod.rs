//! The session store: one SQLite handle on `<home>/state.db` (WAL,
//! `BEGIN IMMEDIATE`, `synchronous=FULL` by default) and the divert folder
//! `<home>/sessions/`.
//!
//! [`SessionStore::append_batch`] is the flush. It runs one transaction per
//! attempt; on a failure it builds an observation, asks the policy, and
//! does exactly what the policy says. It never reopens an open database,
//! never replays, and never marks anything persisted unless COMMIT
//! succeeded.
//!
//! Opening follows the same decision table as writing: a lock held while
//! the schema is created or migrated is retried with the policy's plan
//! inside the flush; a sticky cause (a corrupt file) quarantines the handle
//! so no later batch opens the file again; a disk-class failure (cannot
//! open, read-only) diverts this batch and the next batch tries the open
//! once more.

mod backend;
mod edit;
pub mod graph;
mod graph_marks;
pub mod history;
pub mod import;
pub mod index;
mod lockwait;
pub mod schema;
pub mod search;
#[cfg(test)]
mod shared_tests;
mod write;

pub use crate::backend::Counters;
pub use crate::backend::EditError;
pub use crate::backend::SharedStore;
use crate::backend::{Backend, Cursor, Flush, Ledger};
pub use crate::backend::{GROUP_MAX_BATCHES, GROUP_MAX_BYTES};
pub use crate::ids::SessionId;
pub use backend::transcript;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use turnsafe_policy::machine::Failure;
use turnsafe_policy::{Cause, Evidence, Operation};

use crate::capture::{self, Capture, CaptureError};
use crate::guard::{self, Guard, Verdict};
use crate::observe;

pub use schema::VERSION as SCHEMA_VERSION;
use write::WriteFailure;

/// `PRAGMA synchronous` for the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Synchronous {
    Full,
    Normal,
}

impl Synchronous {
    /// What the policy is told: in WAL mode, `FULL` syncs the WAL at every
    /// COMMIT, `NORMAL` only at checkpoints.
    pub fn durability(self) -> turnsafe_policy::Durability {
        match self {
            Synchronous::Full => turnsafe_policy::Durability::Synced,
            Synchronous::Normal => turnsafe_policy::Durability::Unsynced,
        }
    }
}

/// How a store is opened and how it writes.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub synchronous: Synchronous,
    /// Kept small: the policy's retry plan, not SQLite's busy handler, decides how long to wait.
    pub busy_timeout: Duration,
    /// How long the write lock may stay taken with no other writer
    /// committing before a flush's attempt fails as busy. While other
    /// writers commit, the flush waits for its turn (`lockwait`).
    pub lock_stall: Duration,
    /// Name of this writer in the turn lease.
    pub holder: String,
    pub lease_ttl: Duration,
    /// Open with `SQLITE_OPEN_READ_ONLY` (every write then fails with SQLite's own READONLY).
    pub read_only: bool,
    /// Open through a named SQLite VFS (the fault-injecting one in tests and the demo).
    pub vfs: Option<String>,
    /// The WAL-generation guard. Turning it off exists only to measure its
    /// cost: without it a deleted or replaced file loses data silently.
    pub guard: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_millis(10),
            lock_stall: Duration::from_millis(1000),
            holder: format!("pid-{}", std::process::id()),
            lease_ttl: Duration::from_secs(30),
            read_only: false,
            vfs: None,
            guard: true,
        }
    }
}

/// Why the database could not be opened, with the connection if SQLite
/// opened the file before a later step (configuration, the guard) failed.
struct OpenFailure {
    error: rusqlite::Error,
    errno: Option<i64>,
    conn: Option<Connection>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("could not create {path}: {source}")]
    Home { path: PathBuf, source: std::io::Error },
}

/// One handle on a turnsafe home.
pub struct SessionStore {
    home: PathBuf,
    db_path: PathBuf,
    opts: StoreOptions,
    conn: Option<Connection>,
    guard: Option<Guard>,
    /// What the policy's machines know across batches, each session's
    /// cursor, the divert folder and the counters.
    ledger: Ledger,
    /// The capture this handle made of its retired generation, once tried.
    captured: Option<Result<Capture, CaptureError>>,
    /// Switching off the checkpoint at close failed for a retired
    /// generation: the connection must never be closed.
    close_may_checkpoint: bool,
    /// Why the open at construction failed; the first batch observes it
    /// instead of opening the file a second time.
    open_failure: Option<Box<OpenFailure>>,
    /// The connection to a file a sticky cause quarantined at open. It is
    /// kept, never used, and closed with the handle: the file is opened
    /// once and never again.
    quarantined: Option<Connection>,
    /// The home's entry in its parent folder was fsynced by this handle:
    /// until it is, nothing is written (see `ensure_open`).
    home_synced: bool,
    /// What the flushes saw of the write lock while they waited for it.
    lock_watch: lockwait::LockWatch,
    /// The captures in the home, as last read.
    holds_watch: crate::captures::HoldsWatch,
}

fn random_u64() -> u64 {
    crate::ids::seed()
}

/// A fresh id (uids, lease tokens, batch ids): see [`crate::ids`].
pub fn mint_id() -> String {
    crate::ids::mint()
}

impl SharedStore {
    /// Create `home` (0700) if missing and open its SQLite store, shared.
    pub fn open(home: &Path, opts: StoreOptions) -> Result<SharedStore, StoreError> {
        Ok(SharedStore::over(SessionStore::create(home, opts)?, home))
    }
}

impl SessionStore {
    /// A handle on `home` (`home/state.db`, diverts in `home/sessions/`).
    /// The database is opened here; if that fails the handle still exists
    /// and every batch is answered (see [`SessionStore::append_batch`]).
    pub fn new(home: &Path, opts: StoreOptions) -> SessionStore {
        let mut s = SessionStore {
            home: home.to_path_buf(),
            db_path: home.join("state.db"),
            opts,
            conn: None,
            guard: None,
            ledger: Ledger::new(home),
            captured: None,
            close_may_checkpoint: false,
            open_failure: None,
            quarantined: None,
            home_synced: false,
            lock_watch: lockwait::LockWatch::new(),
            holds_watch: crate::captures::HoldsWatch::default(),
        };
        // A writer never holds the database open only to divert: with a
        // capture pending, it opens on the first batch that may write, so
        // an operator can still install over a home whose writers divert.
        if !s.pending_holds().is_empty() {
            return s;
        }
        if let Err(failure) = s.ensure_open() {
            s.open_failure = Some(failure);
        }
        s
    }

    /// Create `home` (0700) if missing, with every folder it creates
    /// fsynced into its parent, then open a handle on it. A home made but
    /// not synced (no descriptor left for the fsync, say) still gets its
    /// handle: its first open makes the home's entry durable or fails, and
    /// the policy answers that failure like any other.
    pub fn create(home: &Path, opts: StoreOptions) -> Result<SessionStore, StoreError> {
        if !home.is_dir()
            && let Err(source) = crate::durable::create_dir_all(home, 0o700)
        {
            if !home.is_dir() {
                return Err(StoreError::Home {
                    path: home.to_path_buf(),
                    source,
                });
            }
            tracing::warn!(error = %source, "home created, its folder entry not yet synced");
        }
        Ok(SessionStore::new(home, opts))
    }

    /// fsync the home's parent folder, once per handle, before the first
    /// write: SQLite fsyncs the folder its files are in, never that
    /// folder's parent, so without it a power cut takes a new home, and
    /// every commit made in it, with its entry. Whoever made the home, it
    /// is done here.
    fn sync_home_entry(&mut self) -> Result<(), Box<OpenFailure>> {
        if self.home_synced || self.opts.read_only {
            return Ok(());
        }
        let parent = match self.home.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        match crate::divert::sync_dir(parent) {
            Ok(()) => {
                self.home_synced = true;
                Ok(())
            }
            // As SQLite reports a folder it cannot use: CANTOPEN, with the
            // errno beside it for the copy.
            Err(e) => Err(Box::new(OpenFailure {
                error: rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                    Some(format!("turnsafe could not fsync the home's parent folder: {e}")),
                ),
                errno: e.raw_os_error().map(i64::from),
                conn: None,
            })),
        }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }
    pub fn divert_dir(&self) -> &Path {
        &self.ledger.divert_dir
    }
    pub fn counters(&self) -> Counters {
        self.ledger.counters
    }
    pub fn is_open(&self) -> bool {
        self.conn.is_some()
    }
    /// The sticky cause, once the handle refuses to touch the database.
    pub fn sticky(&self) -> Option<Cause> {
        self.ledger.handle.sticky
    }
    /// The identity of the SQLite connection (its `sqlite3*`), for the
    /// tests that prove a flush never reopens.
    pub fn handle_identity(&self) -> Option<usize> {
        self.conn.as_ref().map(|c| unsafe { c.handle() } as usize)
    }
    /// Why the open at construction failed, until a batch observes it.
    pub fn open_error(&self) -> Option<&rusqlite::Error> {
        self.open_failure.as_ref().map(|f| &f.error)
    }
    /// The live connection, for tests and read-only commands.
    pub fn connection(&self) -> Option<&Connection> {
        self.conn.as_ref()
    }

    fn ensure_open(&mut self) -> Result<(), Box<OpenFailure>> {
        if self.conn.is_some() {
            return Ok(());
        }
        self.ledger.counters.open_attempts += 1;
        self.sync_home_entry()?;
        // Create the file ourselves so it is 0600; SQLite gives its WAL and
        // shm the main file's mode. If this fails, SQLite's own open below
        // reports the failure with its own codes.
        let flags = if self.opts.read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
        } else {
            // Only a missing file is created here, so an existing one is
            // opened by SQLite alone.
            if std::fs::symlink_metadata(&self.db_path).is_err() {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&self.db_path);
            }
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
        };
        let opened = match &self.opts.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(&self.db_path, flags, vfs.as_str()),
            None => Connection::open_with_flags(&self.db_path, flags),
        };
        let conn = match opened {
            Ok(c) => c,
            Err(e) => {
                // The connection is gone, so SQLite's saved errno is too;
                // the OS errno right after the failed open is the best
                // witness, and the policy lets it shape only the copy.
                let errno = std::io::Error::last_os_error().raw_os_error().map(i64::from);
                return Err(Box::new(OpenFailure {
                    error: e,
                    errno,
                    conn: None,
                }));
            }
        };
        match self.configure(&conn) {
            Ok(()) => {
                self.ledger.counters.connections_opened += 1;
                // Record the generation the handle writes to. A probe that
                // cannot run leaves the store closed: fail closed as `disk`.
                let guard = match Guard::record(&self.db_path, &conn) {
                    Ok(g) if self.opts.guard => g,
                    Ok(_) => {
                        self.conn = Some(conn);
                        return Ok(());
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "guard could not record the store's files");
                        let errno = e.source.raw_os_error().map(i64::from);
                        return Err(Box::new(OpenFailure {
                            error: probe_error(&e),
                            errno,
                            conn: Some(conn),
                        }));
                    }
                };
                tracing::debug!(db = %self.db_path.display(), generation = guard.generation(), "store opened");
                self.guard = Some(guard);
                self.conn = Some(conn);
                Ok(())
            }
            Err(e) => {
                let errno = observe::system_errno(&conn);
                Err(Box::new(OpenFailure {
                    error: e,
                    errno,
                    conn: Some(conn),
                }))
            }
        }
    }

    fn configure(&self, conn: &Connection) -> rusqlite::Result<()> {
        configure(conn, &self.opts)
    }

    /// The retired generation must never be checkpointed into whatever file
    /// is at the path now; capture it once for the operator.
    fn retire_generation(&mut self, trigger: &str, evidence: &[Evidence]) -> Option<Result<Capture, CaptureError>> {
        self.forbid_close_checkpoint();
        if self.captured.is_some() {
            return None;
        }
        let why = self.capture_why(trigger, evidence);
        let guard = self.guard.as_ref()?;
        let result = capture::capture(guard, &why);
        match &result {
            Ok(c) => tracing::warn!(capture = %c.path, files = c.files.len(), "retired generation captured"),
            Err(e) => tracing::error!(error = %e, "CAPTURE FAILED: the retired generation was not saved"),
        }
        self.captured = Some(result.clone());
        Some(result)
    }

    /// What a capture made now records of its cause: the handle's sticky
    /// cause, else the cause the evidence proves.
    fn capture_why(&self, trigger: &str, evidence: &[Evidence]) -> capture::Why {
        let mut evidence: Vec<Evidence> = evidence.to_vec();
        evidence.sort();
        evidence.dedup();
        let cause = self.ledger.handle.sticky.unwrap_or_else(|| {
            if evidence.contains(&Evidence::DbReplaced) {
                turnsafe_policy::Cause::Replaced
            } else if evidence.contains(&Evidence::DeletedWalGeneration) {
                turnsafe_policy::Cause::DeletedWal
            } else {
                turnsafe_policy::Cause::Unknown
            }
        });
        capture::Why {
            trigger: trigger.to_string(),
            cause,
            evidence,
        }
    }

    /// Check the generation one last time, then close without ever
    /// checkpointing a retired generation into the wrong file.
    pub fn close(mut self) -> Option<Result<Capture, CaptureError>> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> Option<Result<Capture, CaptureError>> {
        self.release_all_leases();
        let mut capture = None;
        if let (Some(conn), Some(guard)) = (&self.conn, &mut self.guard) {
            match guard.check(conn) {
                Ok(Verdict::Intact) if self.ledger.handle.sticky.is_none() => {}
                Ok(Verdict::Intact) => capture = self.retire_generation("close after a sticky cause", &[]),
                Ok(Verdict::Mismatch { detail, evidence }) => {
                    tracing::warn!(detail = %detail, "generation changed before close");
                    capture = self.retire_generation(&format!("close: {detail}"), &[evidence]);
                }
                Err(e) => {
                    tracing::error!(error = %e, "guard probe failed at close; not checkpointing");
                    self.forbid_close_checkpoint();
                }
            }
        }
        if matches!(self.captured, Some(Err(_)))
            && let Some(guard) = &self.guard
        {
            // The retired frames live only in this handle's descriptors,
            // which the close lets go: one more try to keep them.
            let why = self.capture_why("close: a failed capture tried again", &[]);
            let result = capture::capture(guard, &why);
            match &result {
                Ok(c) => tracing::warn!(capture = %c.path, "retired generation captured at close"),
                Err(e) => tracing::error!(error = %e, "CAPTURE FAILED again at close"),
            }
            self.captured = Some(result.clone());
            capture = Some(result);
        }
        match self.conn.take() {
            Some(conn) if self.close_may_checkpoint => {
                // Fail closed: a close that may checkpoint a retired
                // generation into whatever file is at the path now must not
                // happen. The connection is never closed; its descriptors
                // (the retired frames among them) stay open until the
                // process ends, which closes them without a checkpoint.
                tracing::error!(
                    "cannot forbid the close-time checkpoint; leaving the connection open until the process ends"
                );
                std::mem::forget(conn);
            }
            _ => {}
        }
        capture
    }

    /// Switch off SQLite's checkpoint at close (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`),
    /// the one step that keeps a close from writing a retired generation
    /// over the file now at the path. If it cannot be switched off, the
    /// handle remembers, and [`Self::close`] never closes the connection.
    fn forbid_close_checkpoint(&mut self) {
        let Some(conn) = &self.conn else { return };
        let set = match crate::failpoint::io_fault("store.no_ckpt_on_close") {
            Some(e) => Err(e.to_string()),
            None => conn
                .set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
                .map_err(|e| e.to_string())
                .and_then(|on| {
                    if on {
                        Ok(())
                    } else {
                        Err("SQLite left it off".to_string())
                    }
                }),
        };
        if let Err(e) = set {
            tracing::error!(error = %e, "could not switch off the checkpoint at close");
            self.close_may_checkpoint = true;
        }
    }
}

/// A failed write, as the flush machine takes it.
fn failure_of_write(failure: &WriteFailure, elapsed_ms: u64) -> Failure {
    match failure {
        WriteFailure::Sqlite { error, errno, evidence } => failure_of(error, *errno, evidence.clone(), elapsed_ms),
        WriteFailure::Guard { evidence, detail } => Failure {
            evidence: vec![*evidence],
            message: format!("turnsafe guard: {detail}"),
            elapsed_ms,
            ..Failure::default()
        },
        WriteFailure::Probe(e) => {
            let errno = e.source.raw_os_error().map(i64::from);
            failure_of(&probe_error(e), errno, Vec::new(), elapsed_ms)
        }
        WriteFailure::LeaseLost(holder) => Failure {
            evidence: vec![Evidence::TurnLeaseLost],
            message: "the session's turn lease is held by another writer".into(),
            elapsed_ms,
            lease: holder.clone(),
            ..Failure::default()
        },
    }
}

impl SessionStore {
    /// Rebuild a degraded FTS index and switch the index back on.
    pub fn rebuild_fts(&mut self) -> rusqlite::Result<()> {
        let Some(conn) = &self.conn else {
            return Err(rusqlite::Error::InvalidQuery);
        };
        schema::rebuild_fts(conn)
    }
}

impl Drop for SessionStore {
    /// End of input: give the turn back so the next writer need not wait
    /// for the lease to expire.
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

/// A read-only connection to a store's database, for readers that must
/// not create or change anything (`show`).
pub fn open_read_only(db: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
}

/// Configure a connection the way every turnsafe writer does: busy timeout,
/// foreign keys, schema (which stamps the generation before WAL), WAL, and
/// `synchronous`.
///
/// Writers that open a new home together meet each other's schema
/// creation and switch to WAL: a step refused for the lock is tried again,
/// spaced out, while other writers commit, and for a quarter of
/// `opts.lock_stall` without (every open attempt waits anew), before the
/// open fails and the policy decides.
pub fn configure(conn: &Connection, opts: &StoreOptions) -> rusqlite::Result<()> {
    let mut watch = lockwait::LockWatch::new();
    let (since, pace) = (Instant::now(), lockwait::Pace::Backoff);
    lockwait::wait_while_busy(conn, &mut watch, since, opts.lock_stall / 4, pace, || {
        configure_once(conn, opts)
    })
}

fn configure_once(conn: &Connection, opts: &StoreOptions) -> rusqlite::Result<()> {
    conn.busy_timeout(opts.busy_timeout)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // One plan per statement, whatever the bound values: otherwise the
    // bundled SQLite (STAT4) prepares `WHERE session_id = ?` statements
    // again on every bind, once per batch on the flush's path.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    // Any nonzero 32-bit value; zero means "never stamped".
    let generation = match random_u64() as i32 {
        0 => 1,
        g => g,
    };
    // Stamps application_id and state_meta before the switch to WAL.
    schema::migrate(conn, generation)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("could not switch to WAL (journal_mode is {mode})")),
        ));
    }
    let sync = match opts.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    Ok(())
}

/// A failed SQLite call, as the flush machine takes it.
fn failure_of(err: &rusqlite::Error, errno: Option<i64>, evidence: Vec<Evidence>, elapsed_ms: u64) -> Failure {
    let obs = observe::observation(Operation::AppendBatch, err, errno, evidence, 1, elapsed_ms, 0);
    Failure {
        engine: turnsafe_policy::Engine::Sqlite,
        sqlstate: None,
        code: obs.code,
        extended_code: obs.extended_code,
        message: obs.message,
        errno: obs.errno,
        evidence: obs.evidence,
        elapsed_ms,
        lease: None,
    }
}

/// A guard probe failure as the SQLite-shaped error the policy reads:
/// an I/O error, so the store fails closed as `disk`.
fn probe_error(e: &guard::ProbeError) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        Some(format!("turnsafe {e}")),
    )
}
