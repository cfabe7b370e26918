//! `turnsafe append`: the streaming session writer.

mod many;

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::{Engine, LeaseOptions};
use crate::exit;
use crate::ids::SessionId;
use crate::message::Message;
use crate::store::{SessionStore, StoreOptions, Synchronous};
use crate::target::DbChoice;

/// Append batches read from stdin, one batch per line, to one session
/// (`--session`) or, without it, to the session each line names.
///
/// Each line is a batch: a JSON array of messages, each any JSON object
/// (`role` and `content` are used for `show` and search when present; a
/// top-level string `uid` is the message's uid and is not stored in it),
/// or `{"items": [...], "uids": [...]}`, whose items are stored exactly as
/// they are, any `uid` field included, with `uids` (optional, one string
/// or null per item) beside them. After each batch one bare JSON object is
/// printed: `persisted`, `operation` (`open` when the store could not be
/// opened), `cause`, `action`, `attempts`, `committed`,
/// `diverted`, `handed_back` (these three sum to the batch size),
/// `receipt`, `divert_error`, `divert_residue`, `capture`, `copy`, `error`,
/// `uids`, `minted_uids`. A line that is not a batch gets
/// `{"error": ..., "line": N}`. Exit status: 0 when every batch persisted,
/// 3 otherwise.
///
/// Opening follows the policy like writing does: a lock held while the
/// schema is created is waited out within the policy's patience; a corrupt
/// `state.db` quarantines the writer, which diverts every later batch
/// without opening the file again; a file that cannot be opened (missing
/// folder, no free descriptor, read-only) diverts the batch, and the next
/// batch tries the open once more.
///
/// When a batch is handed back, resend it with the `uids` the outcome
/// lists: a later `turnsafe replay` then cannot store any message twice.
///
/// Without `--session`, each line is `{"session": ID, "messages": [...]}`
/// (or `{"session": ID, "items": [...], "uids": [...]}`), and its answer is
/// the outcome with `"session"` added, in input order; a line without a
/// session (a bare array, say) gets `{"error": ..., "line": N}` and is not
/// stored. Batches already waiting on stdin are committed together, in one
/// transaction with one sync (at most 64 batches or 1 MiB of messages);
/// each still gets its own outcome, and `seq` follows input order within a
/// session. A batch that fails alone (a uid conflict, a lease held by
/// another writer) fails only itself; a failure of the whole transaction
/// is settled by each batch as the policy says.
///
/// With `--db URL` (or `TURNSAFE_DB`) the messages go to PostgreSQL under
/// the same policy; the divert folder stays under `--home` on this
/// machine, so a server that cannot be reached costs no turn.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home: `state.db` and `sessions/` live here (created 0700 if missing).
    #[arg(long)]
    home: PathBuf,
    /// PostgreSQL instead of `<home>/state.db`: `postgres://user@host:port/db?sslmode=require|disable`
    /// (default: `TURNSAFE_DB`). Keep passwords in `TURNSAFE_DB` or a password file.
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// The session id (letters, digits, `-`, `_`, `.`, `:`; at most 128 bytes).
    /// Without it, each line names its own session.
    #[arg(long)]
    session: Option<String>,
    /// This writer's name in the turn lease.
    #[arg(long)]
    holder: Option<String>,
    /// Turn lease time-to-live in seconds.
    #[arg(long, default_value_t = 30)]
    lease_ttl: u64,
    /// `PRAGMA synchronous` for the store.
    #[arg(long, value_enum, default_value = "full")]
    synchronous: Synchronous,
    /// The hidden testing aids, in test builds only.
    #[command(flatten)]
    hooks: TestHooks,
}

/// The testing aids of a `test-hooks` build, all hidden; a release build
/// has none of them (the flag is an unexpected argument, exit 2).
#[cfg(feature = "test-hooks")]
#[derive(Debug, clap::Args)]
struct TestHooks {
    /// Testing aid: after N batches (0: before the store is opened), lower
    /// RLIMIT_NOFILE so that no new file descriptor can be opened.
    #[arg(long, hide = true, value_name = "N")]
    exhaust_fds_after: Option<u64>,
    /// Testing aid: fail every K-th WAL write through the fault-injecting VFS.
    #[arg(long, hide = true, value_name = "K")]
    fault_wal_write_every: Option<u32>,
    /// Testing aid: after N batches, fail the next sync of the WAL once,
    /// through the fault-injecting VFS: the next batch's COMMIT fails
    /// after its frames were written to the file.
    #[arg(long, hide = true, value_name = "N")]
    fault_wal_sync_after: Option<u64>,
    /// Testing aid, with `--exhaust-fds-after`: leave K descriptors free.
    #[arg(long, hide = true, value_name = "K", default_value_t = 0)]
    fd_headroom: u64,
}

#[cfg(not(feature = "test-hooks"))]
#[derive(Debug, clap::Args)]
struct TestHooks {}

#[cfg(feature = "test-hooks")]
impl TestHooks {
    fn any(&self) -> bool {
        self.exhaust_fds_after.is_some() || self.fault_wal_write_every.is_some() || self.fault_wal_sync_after.is_some()
    }

    /// Arm the WAL fault for `home`, and name the fault VFS in `opts`.
    fn arm_wal_fault(
        &self,
        home: &std::path::Path,
        opts: &mut StoreOptions,
    ) -> Result<Option<crate::faultvfs::FaultGuard>, String> {
        use crate::faultvfs::{Fault, FileKind, Op, arm};
        if self.fault_wal_sync_after.is_some() {
            // Armed later (`exhaust`); the store opens through the VFS now.
            crate::faultvfs::register()?;
            opts.vfs = Some(crate::faultvfs::VFS_NAME.into());
        }
        let Some(every) = self.fault_wal_write_every else {
            return Ok(None);
        };
        let guard = arm(Fault::new(&wal_tag(home)?, Op::Write, FileKind::Wal, every).every(every))?;
        opts.vfs = Some(crate::faultvfs::VFS_NAME.into());
        Ok(Some(guard))
    }

    /// After the `when`-th batch (0: before the open), lower the limit, or
    /// arm the WAL's sync fault for `home`, if asked.
    fn exhaust(&self, when: u64, home: &std::path::Path) {
        if self.exhaust_fds_after == Some(when) {
            match exhaust_fds(self.fd_headroom) {
                Ok(n) => tracing::warn!(limit = n, "RLIMIT_NOFILE lowered: no new descriptors can be opened"),
                Err(e) => tracing::error!(error = %e, "could not lower RLIMIT_NOFILE"),
            }
        }
        if self.fault_wal_sync_after == Some(when) {
            use crate::faultvfs::{Fault, FaultGuard, FileKind, Op, arm};
            // Held for the rest of the process: it fires once, then stays inert.
            static SYNC_FAULT: std::sync::OnceLock<FaultGuard> = std::sync::OnceLock::new();
            match wal_tag(home).and_then(|tag| arm(Fault::new(&tag, Op::Sync, FileKind::Wal, 1))) {
                Ok(guard) => {
                    let _ = SYNC_FAULT.set(guard);
                    tracing::warn!("the next sync of the WAL fails");
                }
                Err(e) => tracing::error!(error = %e, "could not arm the WAL's sync fault"),
            }
        }
    }
}

/// The path filter of a fault on `home`'s files.
#[cfg(feature = "test-hooks")]
fn wal_tag(home: &std::path::Path) -> Result<String, String> {
    Ok(std::path::absolute(home)
        .map_err(|e| e.to_string())?
        .to_string_lossy()
        .into_owned())
}

#[cfg(not(feature = "test-hooks"))]
impl TestHooks {
    fn any(&self) -> bool {
        false
    }

    fn arm_wal_fault(&self, _: &std::path::Path, _: &mut StoreOptions) -> Result<Option<()>, String> {
        Ok(None)
    }

    #[inline(always)]
    fn exhaust(&self, _: u64, _: &std::path::Path) {}
}

/// Lower the soft RLIMIT_NOFILE to the lowest free descriptor number (plus
/// `headroom`), so later opens fail with EMFILE while held descriptors keep
/// working.
#[cfg(feature = "test-hooks")]
fn exhaust_fds(headroom: u64) -> std::io::Result<u64> {
    let mut lowest = 0u64;
    while lowest < 65_536 {
        // SAFETY: F_GETFD only queries whether the descriptor number is open.
        if unsafe { libc::fcntl(lowest as i32, libc::F_GETFD) } == -1 {
            break;
        }
        lowest += 1;
    }
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let new = rustix::process::Rlimit {
        current: Some(lowest + headroom),
        maximum: lim.maximum,
    };
    rustix::process::setrlimit(rustix::process::Resource::Nofile, new).map_err(std::io::Error::from)?;
    Ok(lowest)
}

/// The store a run writes to: SQLite or PostgreSQL, behind the one
/// executor (batches that wait together share one transaction on both).
type Store = Box<dyn Engine>;

pub fn run(args: Args) -> i32 {
    let session = match args.session.as_deref().map(SessionId::new) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            eprintln!("error: invalid --session: {e}");
            return exit::USAGE;
        }
    };
    let choice = match DbChoice::resolve(args.db.as_deref(), Some(&args.home)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    if let DbChoice::Postgres(url) = choice {
        if let Some(why) = url.writer_refusal() {
            eprintln!("error: --db {}: {why}", url.display());
            return exit::USAGE;
        }
        if args.hooks.any() {
            eprintln!("error: the SQLite testing aids do not apply to --db");
            return exit::USAGE;
        }
        if let Err(e) = ensure_home(&args.home) {
            tracing::error!(error = %e, "could not create the home directory");
        }
        let mut opts = LeaseOptions {
            lease_ttl: Duration::from_secs(args.lease_ttl),
            ..LeaseOptions::default()
        };
        if let Some(h) = args.holder {
            opts.holder = h;
        }
        tracing::info!(target_db = url.display(), "appending to postgres");
        let store = crate::pg::open_store(*url, &args.home, opts);
        return match session {
            Some(session) => stream(Box::new(store), &session, |_| {}),
            // Sessions that wait together pipeline their groups.
            None => many::stream_shared(crate::backend::SharedStore::over(store, &args.home)),
        };
    }
    let mut opts = StoreOptions {
        lease_ttl: Duration::from_secs(args.lease_ttl),
        synchronous: args.synchronous,
        ..StoreOptions::default()
    };
    if let Some(h) = args.holder {
        opts.holder = h;
    }
    let _fault = match args.hooks.arm_wal_fault(&args.home, &mut opts) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: cannot arm the fault VFS: {e}");
            return exit::FAILURE;
        }
    };
    let exhaust = |when: u64| args.hooks.exhaust(when, &args.home);
    exhaust(0);
    // A home that cannot be created still gets every batch answered: the
    // open fails, the policy decides, and the outcome says what happened.
    let store = match SessionStore::create(&args.home, opts.clone()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "could not create the home directory");
            SessionStore::new(&args.home, opts)
        }
    };
    // A database a newer turnsafe wrote is refused before any batch is
    // read: nothing was accepted, so nothing is lost, and the store's
    // open (its only one) wrote nothing.
    if let Some(newer) = store.open_error().and_then(crate::store::schema::NewerSchema::of) {
        eprintln!("error: {newer}");
        return exit::USAGE;
    }
    let store: Store = Box::new(store);
    match session {
        Some(session) => stream(store, &session, exhaust),
        None => many::stream(store, exhaust),
    }
}

/// Create `home` (0700) if missing, its entry durable in its parent (the
/// diverts under it fsync the home, never its parent).
fn ensure_home(home: &std::path::Path) -> std::io::Result<()> {
    crate::durable::create_dir_all(home, 0o700)
}

/// Answer each stdin batch with its outcome; `after(n)` runs after the n-th batch.
fn stream(mut store: Store, session: &SessionId, after: impl Fn(u64)) -> i32 {
    let exhaust = after;
    let (mut all_persisted, mut batches) = (true, 0u64);
    let read = super::for_each_exact_line(|line_no, line| {
        let answer = match line.and_then(|text| Message::batch_from_json(text).map_err(|e| e.to_string())) {
            Ok(batch) => {
                let outcome = crate::backend::group::append_one(store.as_mut(), session, &batch);
                all_persisted &= outcome.persisted;
                batches += 1;
                exhaust(batches);
                crate::failpoint::hit("append.before_print");
                // The policy's own JSON text, as is: no parse and print again.
                outcome.report.to_json()
            }
            Err(e) => {
                all_persisted = false;
                serde_json::json!({ "error": e, "line": line_no }).to_string()
            }
        };
        super::emit(&answer)
    });
    if let Err(e) = read {
        eprintln!("turnsafe append: reading stdin: {e}");
        all_persisted = false;
    }
    store.release_lease(session);
    if all_persisted { exit::OK } else { exit::NOT_PERSISTED }
}
