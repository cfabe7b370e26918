//! The backend seam: what a session store must do for the flush machine,
//! whatever the database.
//!
//! SQLite (`crate::store`, one file under `--home`) and PostgreSQL
//! (`crate::pg`, a server named by `--db URL` or `TURNSAFE_DB`) perform
//! the same effects ([`Backend`]): open, write a group of batches in one
//! transaction, look a lost COMMIT up by uid, capture, read a transcript,
//! search, and check the database's identity. Neither decides anything:
//! a failure is reported as the policy's [`Failure`] and the flush
//! machine says what happens next. One executor ([`group`]) drives the
//! machines over either; the divert folder is always on the local disk
//! (`--home`), so a server that cannot be reached costs no turn.

pub mod edit;
pub mod group;
pub mod hits;
pub mod readable;
pub mod shared;

pub use edit::{EditError, run_edit};
pub use group::{Flush, GROUP_MAX_BATCHES, GROUP_MAX_BYTES, GroupWrite, Ledger};
pub use readable::readable;
pub use shared::SharedStore;

use std::time::{Duration, Instant};

use serde_json::Value;
use turnsafe_policy::Evidence;
use turnsafe_policy::machine::{Failure, WritePlan};

use crate::capture::{Capture, CaptureError};
use crate::graph::{GraphBatch, GraphEdit, GraphEdited, GraphQuery, StoredCheckpoint};
use crate::history::{Archived, Cleared, ForkRefused, ForkReport, Lineage, RestoreReport, Selector};
use crate::ids::SessionId;
use crate::message::Message;
use crate::outcome::FlushOutcome;
use crate::pending::{PendingMessage, PendingRecord};
use crate::transcript::StoredMessage;

/// Effects counted for the fail-closed tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub open_attempts: u64,
    pub connections_opened: u64,
    pub append_attempts: u64,
    pub diverts: u64,
}

/// What a writer knows of one session between batches.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    /// Our turn lease token, once the first batch took the lease.
    pub lease_token: Option<String>,
    /// The seq the next message gets, when known.
    pub next_seq: Option<i64>,
}

/// Who writes, and for how long a lease holds.
#[derive(Debug, Clone)]
pub struct Lease {
    pub holder: String,
    pub ttl_ms: i64,
}

/// How a store takes leases.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// Name of this writer in the turn lease.
    pub holder: String,
    pub lease_ttl: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            holder: format!("pid-{}", std::process::id()),
            lease_ttl: Duration::from_secs(30),
        }
    }
}

impl LeaseOptions {
    pub fn lease(&self) -> Lease {
        Lease {
            holder: self.holder.clone(),
            ttl_ms: i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// How a shared store may commit several groups at once
/// ([`shared::SharedStore`]): up to `depth` handles, the first the one it
/// was given, each further one made by `make` when first needed.
pub struct Pipeline {
    pub depth: usize,
    pub make: Box<dyn Fn() -> Box<dyn Engine + Send> + Send + Sync>,
}

/// Which database a handle writes to, as its generation and the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The generation id stamped in the database when it was created.
    pub generation: String,
    /// Where it lives (`postgres://user@host:port/db`, or a path).
    pub location: String,
}

/// One search hit, the same for every backend.
pub use hits::Hit;

/// What a search found, and how many messages it read without the index.
#[derive(Debug, Clone, Default)]
pub struct SearchReport {
    pub hits: Vec<Hit>,
    pub unindexed: u64,
}

/// A read of a session's rows that failed, with the policy's cause when
/// it knows one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ReadError {
    pub message: String,
    pub cause: Option<turnsafe_policy::Cause>,
}

/// A read that failed; the message never holds a password.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{target}: {message}")]
    Unavailable { target: String, message: String },
    #[error("the query is empty")]
    EmptyQuery,
    #[error("{target}: schema version {found} is newer than this turnsafe knows ({known})")]
    NewerSchema { target: String, found: i64, known: i64 },
    /// A sticky handle refuses every read ([`readable`]), with the error
    /// `rows` gives.
    #[error(transparent)]
    Refused(#[from] ReadError),
}

/// The effects a session store performs for the flush machine. The executor ([`group::run`]) calls the
/// effects; each reports a failure as the policy's [`Failure`] (its
/// `elapsed_ms` is the executor's to fill) and decides nothing.
// A `Failure` is the flush machine's own event, handed to it as it is; a
// failed open or write is rare, so its size on the error path costs
// nothing worth a box (and an allocation) per failure.
#[allow(clippy::result_large_err)]
pub trait Backend {
    /// Where the data lives, as it may be shown.
    fn location(&self) -> String;
    /// A live connection is held.
    fn is_open(&self) -> bool;
    /// How this backend's COMMIT reaches stable storage, as the flush
    /// machine is told at each batch's start.
    fn durability(&self) -> turnsafe_policy::Durability;
    /// What the machines know across flushes, each session's cursor, the
    /// divert folder and the counters.
    fn ledger(&mut self) -> &mut Ledger;
    /// The unsettled captures that hold some session's rows, read before
    /// every group. A server keeps no capture on this machine: none.
    fn pending_holds(&mut self) -> Vec<crate::captures::Hold> {
        Vec::new()
    }
    /// How long a batch started at `started` has waited without progress,
    /// as the policy's patience counts it. By default, since its start.
    fn patience_ms(&self, started: Instant) -> u64 {
        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
    /// Connect (or open the file), migrate, and record the identity. A
    /// reopen that finds a different database reports `db_replaced`.
    fn open(&mut self) -> Result<(), Failure>;
    /// One transaction for every batch, each in its own savepoint: a
    /// failure of one batch alone (a uid conflict, a fenced lease) fails
    /// only it; a failure that ends the transaction fails every batch
    /// without one of its own. Each session's cursor in the ledger moves
    /// only when the COMMIT succeeded.
    fn write_group(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> GroupWrite;
    /// After a COMMIT whose answer was lost: on the connection just opened,
    /// whether every one of `messages` is stored for `session` under its
    /// uid (`uids`, in the same order) with its own bytes
    /// ([`crate::same`]): a uid that holds other bytes was not this
    /// batch's write. A failure is the policy's to classify, like a failed
    /// write.
    fn resolve(&mut self, session: &str, uids: &[String], messages: &[Message]) -> Result<bool, Failure>;
    /// [`Backend::resolve`] for a LangGraph batch: whether every one of its
    /// records is stored.
    fn resolve_graph(&mut self, graph: &GraphBatch) -> Result<bool, Failure>;
    /// Capture the retired generation this handle still holds, once, for
    /// the operator (SQLite's WAL through the held descriptor). `trigger`
    /// and `evidence` are the failure that asked for it. A server keeps no
    /// generation on this machine, so PostgreSQL reports it as failed.
    fn capture(&mut self, trigger: &str, evidence: &[Evidence]) -> Result<Capture, CaptureError>;
    /// Give back every lease this handle holds (end of input).
    fn release_all_leases(&mut self);
    /// Further handles on the same database for a pipeline of groups, or
    /// `None` where one group commits at a time (SQLite has one writer).
    fn pipeline(&self) -> Option<Pipeline> {
        None
    }
    /// Give back this handle's lease on `session`.
    fn release_lease(&mut self, session: &SessionId);

    /// Flush several batches at once, each under its own flush machine and
    /// with its own outcome, in the order given (see [`group`]).
    fn append_group(&mut self, batches: &[(&SessionId, &[Message])]) -> Vec<FlushOutcome> {
        group::append_group(self, batches)
    }

    /// Flush one LangGraph checkpoint or one task's writes: committed,
    /// diverted with a receipt, or handed back.
    fn put_graph(&mut self, graph: &GraphBatch) -> FlushOutcome {
        group::put_graph(self, graph)
    }

    /// Flush one turn's batch. Every message ends committed, diverted with
    /// a receipt, or handed back; the outcome says which.
    fn append_batch(&mut self, session: &SessionId, messages: &[Message]) -> FlushOutcome {
        group::append_one(self, session, messages)
    }
}

/// What every command reads and edits of a store, outside the flush:
/// transcripts, history edits, search, LangGraph's reads and deletes, the
/// database's identity. Each edit runs the policy's edit machine
/// ([`edit::run_edit`]).
#[allow(clippy::result_large_err)]
pub trait History {
    /// The live LangGraph checkpoints `query` asks for, newest first, with
    /// their writes. A sticky handle refuses.
    fn graph_read(&mut self, query: &GraphQuery) -> Result<Vec<StoredCheckpoint>, ReadError>;
    /// A LangGraph delete, prune or copy, in one transaction, as the
    /// policy's edit machine says. A `delete_thread` that settles the
    /// thread's pending divert lines is [`crate::clear::delete_thread`].
    fn graph_edit(&mut self, edit: &GraphEdit) -> Result<GraphEdited, EditError>;
    /// `delete_thread` with the thread's pending divert lines read by
    /// [`crate::clear::delete_thread`], in one transaction: each is stored
    /// as replay would have stored it, then every row of the thread is
    /// marked, theirs included.
    fn graph_delete_thread(&mut self, thread: &str, pending: &[PendingRecord]) -> Result<GraphEdited, EditError>;
    /// Which of `uids` are stored for `session`.
    fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError>;
    /// The stored transcript in `seq` order, as `show --json` prints it.
    fn transcript(&mut self, session: &str) -> Result<Vec<Value>, BackendError>;
    /// The newest `limit` messages of `session` (all with `None`), in `seq`
    /// order, through the handle's own connection. A sticky handle refuses.
    fn rows(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<StoredMessage>, ReadError>;
    /// Remove and return the newest message of `session` (`None` when it
    /// has none). A write: it follows the policy, as replay does.
    fn pop_last(&mut self, session: &SessionId) -> Result<Option<StoredMessage>, EditError>;
    /// Move every stored message of `session` to the archive; returns how
    /// many. Its pending divert lines are not touched: [`crate::clear::clear`]
    /// archives and settles them with the rows.
    fn clear_session(&mut self, session: &SessionId) -> Result<u64, EditError>;
    /// Move every stored message of `session`, and `pending` (the divert
    /// lines [`crate::clear::clear`] took and read), to the archive in one
    /// transaction; returns what it archived.
    fn clear_archiving(&mut self, session: &SessionId, pending: &[PendingMessage]) -> Result<Cleared, EditError>;
    /// The archived rows of `session`, newest archived first.
    fn archived(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<Archived>, ReadError>;
    /// Bring archived rows back (see [`crate::history`]).
    fn restore(&mut self, session: &SessionId, selector: &Selector) -> Result<RestoreReport, EditError>;
    /// Copy `session`'s rows up to and including `at_seq` into `new_session`.
    fn fork(
        &mut self,
        session: &SessionId,
        at_seq: i64,
        new_session: &SessionId,
    ) -> Result<Result<ForkReport, ForkRefused>, EditError>;
    /// Replace the suffix from `start_seq` on with `items`, archiving what
    /// it replaced (and, with `prune_below`, the rows before that seq), in
    /// one transaction; `Ok(false)` when `expected` is not the stored suffix.
    fn replace_suffix(
        &mut self,
        session: &SessionId,
        start_seq: i64,
        items: &[Message],
        expected: Option<&[String]>,
        prune_below: Option<i64>,
    ) -> Result<bool, EditError>;
    /// A session's lineage, when it is a fork.
    fn lineage(&mut self, session: &str) -> Option<Lineage>;
    /// Retention (see `turnsafe prune --help`).
    fn prune(&mut self, opts: &crate::history::PruneOptions) -> Result<crate::history::PruneReport, EditError>;
    /// Delete a session for good: rows, archive, lineage. Returns `(rows, archived rows)`.
    fn delete_session(&mut self, session: &SessionId) -> Result<(u64, u64), EditError>;
    /// Import a group of another runtime's sessions in one transaction
    /// ([`crate::import_rows`]); with `write` false, what it would do,
    /// nothing written.
    fn import_group(
        &mut self,
        group: &[crate::import_rows::ImportSession],
        write: bool,
    ) -> Result<Vec<crate::import_rows::ImportCounts>, EditError>;
    /// Full-text search over the committed messages; never misses one.
    /// With `archived`, the archive's rows too, after them.
    fn search(
        &mut self,
        query: &str,
        session: Option<&str>,
        limit: usize,
        archived: bool,
    ) -> Result<SearchReport, BackendError>;
    /// The identity of the database the handle writes to.
    fn identity(&mut self) -> Result<Identity, BackendError>;
}

/// A whole engine: the flush's effects and the reads and edits. SQLite's
/// `SessionStore` and PostgreSQL's `PgStore` are both; a caller that picks
/// one at run time holds a `Box<dyn Engine>`.
pub trait Engine: Backend + History {}

impl<T: Backend + History + ?Sized> Engine for T {}
