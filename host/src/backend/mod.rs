//! The backend seam: what a session store must do for the flush machine,
//! whatever the database.
//!
//! SQLite (`crate::store`, one file under `--home`) and PostgreSQL
//! (`crate::pg`, a server named by `--db URL` or `TURNSAFE_DB`) perform
//! the same effects ([`Backend`]): open, write a batch with the machine's
//! plan, read which of a batch's uids are stored, read a transcript,
//! search, and check the database's identity. Neither decides anything:
//! a failure is reported as the policy's [`Failure`] and the flush
//! machine says what happens next. [`Writer`] drives the machine over a
//! backend; the divert folder is always on the local disk (`--home`), so
//! a server that cannot be reached costs no turn.

mod flush;
pub mod target;

pub use flush::{Writer, WriterOptions};
pub use target::{DbChoice, TargetError};

use serde_json::Value;
use turnsafe_policy::machine::{Failure, WritePlan};

use crate::capture::{Capture, CaptureError};
use crate::message::Message;
use crate::store::SessionId;

/// One batch, with the uid of every message.
pub struct Batch<'a> {
    pub session: &'a SessionId,
    pub messages: &'a [Message],
    pub uids: &'a [String],
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

/// Which database a handle writes to, as its generation and the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The generation id stamped in the database when it was created.
    pub generation: String,
    /// Where it lives (`postgres://user@host:port/db`, or a path).
    pub location: String,
}

/// One search hit, the same for every backend.
pub use crate::search::Hit;

/// What a search found, and how many messages it read without the index.
#[derive(Debug, Clone, Default)]
pub struct SearchReport {
    pub hits: Vec<Hit>,
    pub unindexed: u64,
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
}

/// The effects a session store performs for the flush machine.
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
    /// Connect (or open the file), migrate, and record the identity. A
    /// reopen that finds a different database reports `db_replaced`.
    fn open(&mut self) -> Result<(), Failure>;
    /// One transaction with the batch: every message committed (a stored
    /// identical one counts), or none.
    fn write(&mut self, batch: &Batch<'_>, plan: &WritePlan, cursor: &mut Cursor, lease: &Lease)
    -> Result<(), Failure>;
    /// After a COMMIT whose answer was lost: on the connection just opened,
    /// whether every one of `uids` is stored for `session`. A failure is
    /// the policy's to classify, like a failed write.
    fn resolve(&mut self, session: &str, uids: &[String]) -> Result<bool, Failure>;
    /// Which of `uids` are stored for `session`.
    fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError>;
    /// The stored transcript in `seq` order, as `show --json` prints it.
    fn transcript(&mut self, session: &str) -> Result<Vec<Value>, BackendError>;
    /// Full-text search over the committed messages; never misses one.
    fn search(&mut self, query: &str, session: Option<&str>, limit: usize) -> Result<SearchReport, BackendError>;
    /// The identity of the database the handle writes to.
    fn identity(&mut self) -> Result<Identity, BackendError>;
    /// Give back our lease on `session` (end of input).
    fn release_lease(&mut self, session: &str, token: &str);
    /// Capture the retired generation this handle still holds, for the
    /// operator (SQLite's WAL through the held descriptor). `trigger` is
    /// the failure that asked for it. A server keeps no generation on this
    /// machine, so PostgreSQL reports the capture as failed.
    fn capture(&mut self, trigger: &str) -> Result<Capture, CaptureError>;
}
