//! The closed vocabulary of the policy: what a host observed, and what the
//! policy answers. Every enum here is exhaustive on purpose: a new variant
//! must break every `match` that decides something.

#[allow(unused_imports)]
use crate::prelude::*;
use serde::{Deserialize, Serialize};

use crate::text::position;

/// The storage operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Opening the session database (or its first statement).
    Open,
    /// Writing one turn's batch of messages in one transaction.
    AppendBatch,
    /// A WAL checkpoint (including the one SQLite runs at close).
    Checkpoint,
    /// Writing the divert JSONL copy of a batch.
    Divert,
    /// Importing diverted lines back into the database.
    Replay,
}

impl Operation {
    pub const ALL: [Operation; 5] = [
        Operation::Open,
        Operation::AppendBatch,
        Operation::Checkpoint,
        Operation::Divert,
        Operation::Replay,
    ];

    /// The labels, in the order of [`Operation::ALL`].
    const LABELS: [&'static str; 5] = ["open", "append_batch", "checkpoint", "divert", "replay"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<Operation> {
        Self::ALL.get(position(&Self::LABELS, s)).copied()
    }
}

/// Facts the host established with its own probes. Only these can prove
/// `deleted_wal`, `replaced` and the other host-level causes; message text never does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// The WAL (or shm) this connection holds is no longer the one at the path.
    DeletedWalGeneration,
    /// The main database file at the path is not the one this connection holds.
    DbReplaced,
    /// Another holder took this session's turn lease.
    TurnLeaseLost,
    /// A compaction of the session is running.
    CompressionInProgress,
    /// Compaction closed the session and opened a continuation.
    CompressionClosed,
    /// The failing statement touched only the full-text index.
    FtsScope,
    /// The failure came at COMMIT. PostgreSQL: the connection failed after
    /// COMMIT was sent and before its answer came, so the writer cannot
    /// know whether the batch is stored. SQLite: the COMMIT statement
    /// itself failed, possibly after its write ([`crate::possibly_written`]).
    CommitSent,
}

impl Evidence {
    pub const ALL: [Evidence; 7] = [
        Evidence::DeletedWalGeneration,
        Evidence::DbReplaced,
        Evidence::TurnLeaseLost,
        Evidence::CompressionInProgress,
        Evidence::CompressionClosed,
        Evidence::FtsScope,
        Evidence::CommitSent,
    ];

    /// The labels, in the order of [`Evidence::ALL`].
    const LABELS: [&'static str; 7] = [
        "deleted_wal_generation",
        "db_replaced",
        "turn_lease_lost",
        "compression_in_progress",
        "compression_closed",
        "fts_scope",
        "commit_sent",
    ];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<Evidence> {
        Self::ALL.get(position(&Self::LABELS, s)).copied()
    }

    /// The distinct items, in the enum's order: what sorting and
    /// deduplicating gives, in one pass however long the list, and without
    /// the std sort, which costs kilobytes in the component.
    pub(crate) fn set(items: impl IntoIterator<Item = Evidence>) -> Vec<Evidence> {
        let mut seen = [false; Evidence::ALL.len()];
        for e in items {
            seen[e as usize] = true;
        }
        let mut set = Vec::new();
        for e in Evidence::ALL {
            if seen[e as usize] {
                set.push(e);
            }
        }
        set
    }
}

/// The database engine the failed operation ran against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    #[default]
    Sqlite,
    Postgres,
}

impl Engine {
    pub const ALL: [Engine; 2] = [Engine::Sqlite, Engine::Postgres];

    /// The labels, in the order of [`Engine::ALL`].
    const LABELS: [&'static str; 2] = ["sqlite", "postgres"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<Engine> {
        Self::ALL.get(position(&Self::LABELS, s)).copied()
    }
}

/// Why a PostgreSQL connection failed its TLS handshake, as the host's
/// message names it (see [`TlsFailure::of`]). It shapes the copy of a
/// `disk` failure only: the cause stays `disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsFailure {
    /// `sslmode=require` against a server that offers no TLS.
    NotOffered,
    /// The server's certificate did not verify against the roots
    /// (`sslrootcert`, else the Mozilla roots), or not for its host name.
    Certificate,
}

impl TlsFailure {
    pub const ALL: [TlsFailure; 2] = [TlsFailure::NotOffered, TlsFailure::Certificate];

    /// The reason, in the copy's words (its `tls` detail), and as a host's
    /// message names it.
    const TEXTS: [&'static str; 2] = [
        "the server does not offer TLS",
        "the server's certificate failed verification",
    ];

    pub fn text(self) -> &'static str {
        Self::TEXTS[self as usize]
    }

    /// The reason a failure's message names: a PostgreSQL failure with no
    /// SQLSTATE (so its whole message is the host's, none of it the
    /// server's) whose message holds one of the [`TlsFailure::text`]s.
    /// Text only refines the copy of the cause the codes gave (`disk`); it
    /// never makes a cause.
    pub fn of(obs: &Observation) -> Option<TlsFailure> {
        if obs.engine != Engine::Postgres || obs.sqlstate.is_some() {
            return None;
        }
        let named = |t: TlsFailure| crate::text::contains(&obs.message, t.text());
        if named(TlsFailure::NotOffered) {
            Some(TlsFailure::NotOffered)
        } else if named(TlsFailure::Certificate) {
            Some(TlsFailure::Certificate)
        } else {
            None
        }
    }
}

/// Everything the host observed about one failed storage operation.
///
/// Time and chance are inputs: `attempt` (1-based count of attempts made,
/// including the one that just failed; 0 is read as 1), `elapsed_ms` since
/// the first attempt of this operation, and `seed` for the retry jitter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub operation: Operation,
    /// The engine; SQLite unless the host says otherwise.
    pub engine: Engine,
    /// PostgreSQL's five-character SQLSTATE, when the server (or the
    /// client library, for a connection it could not make or lost) gave one.
    pub sqlstate: Option<String>,
    pub code: Option<i64>,
    pub extended_code: Option<i64>,
    pub message: String,
    pub errno: Option<i64>,
    pub evidence: Vec<Evidence>,
    pub attempt: u32,
    pub elapsed_ms: u64,
    pub seed: u64,
    /// The holder of the lease that fenced the write (with
    /// [`Evidence::TurnLeaseLost`]), as the host read it: the copy names it.
    pub lease: Option<Box<crate::lease::LeaseHolder>>,
}

impl Observation {
    /// An observation of `operation` with nothing else known yet.
    pub fn new(operation: Operation) -> Observation {
        Observation {
            operation,
            engine: Engine::Sqlite,
            sqlstate: None,
            code: None,
            extended_code: None,
            message: String::new(),
            errno: None,
            evidence: Vec::new(),
            attempt: 1,
            elapsed_ms: 0,
            seed: 0,
            lease: None,
        }
    }

    pub fn has(&self, e: Evidence) -> bool {
        self.evidence.contains(&e)
    }
}

/// Why the operation failed. Labels are stable API (snake_case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Another connection holds the write lock (BUSY/LOCKED); retryable.
    Locked,
    /// The storage refused the operation: I/O error, cannot open, read-only.
    Disk,
    /// The filesystem or the database's page budget is full.
    DiskFull,
    /// The database file was moved or replaced under the live connection.
    Replaced,
    /// The WAL generation this connection wrote was deleted or replaced.
    DeletedWal,
    /// The database image is damaged.
    Corrupt,
    /// Only the full-text index is damaged; the messages are intact.
    FtsIndex,
    /// This writer no longer holds the session's turn lease (fencing).
    TurnLease,
    /// A compaction of the session is in progress; retryable.
    Compression,
    /// Compaction closed the session; a continuation session exists.
    CompressionClosed,
    /// The session row the batch refers to does not exist.
    SessionRowMissing,
    /// A stored message has the same uid but different content.
    UidConflict,
    /// The database server cannot be reached, or is shutting down, and
    /// COMMIT was not sent; retryable.
    Unavailable,
    /// The database server accepts no writes: a standby, as during a
    /// failover; retryable on a new connection.
    ReadOnly,
    /// The connection failed while COMMIT was in flight: the batch may or
    /// may not be stored, until its uids are looked up.
    OutcomeUnknown,
    /// Nothing known explains the failure.
    Unknown,
}

impl Cause {
    pub const ALL: [Cause; 16] = [
        Cause::Locked,
        Cause::Disk,
        Cause::DiskFull,
        Cause::Replaced,
        Cause::DeletedWal,
        Cause::Corrupt,
        Cause::FtsIndex,
        Cause::TurnLease,
        Cause::Compression,
        Cause::CompressionClosed,
        Cause::SessionRowMissing,
        Cause::UidConflict,
        Cause::Unavailable,
        Cause::ReadOnly,
        Cause::OutcomeUnknown,
        Cause::Unknown,
    ];

    /// The labels, in the order of [`Cause::ALL`].
    const LABELS: [&'static str; 16] = [
        "locked",
        "disk",
        "disk_full",
        "replaced",
        "deleted_wal",
        "corrupt",
        "fts_index",
        "turn_lease",
        "compression",
        "compression_closed",
        "session_row_missing",
        "uid_conflict",
        "unavailable",
        "read_only",
        "outcome_unknown",
        "unknown",
    ];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<Cause> {
        Self::ALL.get(position(&Self::LABELS, s)).copied()
    }

    /// The error string a failed flush returns: `session_persistence_failed:<cause>`.
    pub fn failure_label(self) -> String {
        crate::text::cat(&["session_persistence_failed:", self.label()])
    }
}

/// Sticky causes make the handle divert every later batch without touching
/// the database, until an operator acts.
pub fn is_sticky(cause: Cause) -> bool {
    matches!(cause, Cause::Replaced | Cause::DeletedWal | Cause::Corrupt)
}

/// Causes whose retired WAL generation the host must capture.
pub fn needs_capture(cause: Cause) -> bool {
    matches!(cause, Cause::Replaced | Cause::DeletedWal)
}

/// What the classification rests on, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    Evidence,
    Code,
    Message,
    None,
}

impl Basis {
    pub fn label(self) -> &'static str {
        match self {
            Basis::Evidence => "evidence",
            Basis::Code => "code",
            Basis::Message => "message",
            Basis::None => "none",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Classification {
    pub cause: Cause,
    pub basis: Basis,
}

/// What the host must do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Wait `delay_ms`, roll back if needed, and run the whole operation again.
    Retry,
    /// Write the batch to the divert JSONL, then fail closed.
    Divert,
    /// Return failure; keep nothing, write nothing.
    FailClosed,
    /// Clear the FTS flag in the same transaction and retry once.
    DegradeFts,
    /// Move the batch to the continuation session and retry once.
    AdoptContinuation,
    /// Recreate the missing session row and retry once.
    RecreateSession,
    /// Reconnect and look the batch's uids up: all stored is a commit; none
    /// stored is written again (within patience) or diverted.
    Resolve,
}

impl ActionKind {
    pub const ALL: [ActionKind; 7] = [
        ActionKind::Retry,
        ActionKind::Divert,
        ActionKind::FailClosed,
        ActionKind::DegradeFts,
        ActionKind::AdoptContinuation,
        ActionKind::RecreateSession,
        ActionKind::Resolve,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ActionKind::Retry => "retry",
            ActionKind::Divert => "divert",
            ActionKind::FailClosed => "fail_closed",
            ActionKind::DegradeFts => "degrade_fts",
            ActionKind::AdoptContinuation => "adopt_continuation",
            ActionKind::RecreateSession => "recreate_session",
            ActionKind::Resolve => "resolve",
        }
    }
}

/// The policy's full answer to one observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    pub classification: Classification,
    pub action: ActionKind,
    /// Set exactly when `action` is `Retry`.
    pub delay_ms: Option<u64>,
    /// The handle must divert every later batch without touching the db.
    pub sticky: bool,
    /// The host must capture the retired WAL generation for the operator.
    pub capture: bool,
}

/// Whether a commit the host reports is on stable storage when the
/// outcome is returned. The host knows how it writes: SQLite with
/// `synchronous=FULL` (turnsafe's default) syncs the WAL at every COMMIT;
/// with `synchronous=NORMAL` it syncs only at checkpoints, so a power cut
/// may take the last commits (a killed process does not). PostgreSQL with
/// `synchronous_commit=off` is the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Every COMMIT is synced before it returns.
    #[default]
    Synced,
    /// A COMMIT returns before its sync: a power cut may still lose it.
    Unsynced,
}

impl Durability {
    pub const ALL: [Durability; 2] = [Durability::Synced, Durability::Unsynced];

    /// The labels, in the order of [`Durability::ALL`].
    const LABELS: [&'static str; 2] = ["synced", "unsynced"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<Durability> {
        Self::ALL.get(position(&Self::LABELS, s)).copied()
    }
}

/// How a flush ended, as far as the user is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Committed after a retry, `degrade_fts`, `adopt_continuation` or `recreate_session`.
    Persisted,
    /// Not committed; a durable divert copy with a receipt exists.
    Diverted,
    /// Not committed; writing the divert copy failed too.
    DivertFailed,
    /// Not committed and, by policy, not diverted: handed back to the caller.
    HandedBack,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Persisted,
        Outcome::Diverted,
        Outcome::DivertFailed,
        Outcome::HandedBack,
    ];

    /// The labels, in the order of [`Outcome::ALL`].
    const LABELS: [&'static str; 4] = ["persisted", "diverted", "divert_failed", "handed_back"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<Outcome> {
        Self::ALL.get(position(&Self::LABELS, s)).copied()
    }
}

/// Why a divert failed: the file operation and the errno, never the path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DivertFailure {
    pub operation: String,
    pub errno: Option<i64>,
}

/// Some bytes of a failed divert may remain in the session's divert file:
/// the host could not cut the file back to where the batch began. `path`
/// is for the host and the logs; the copy never names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DivertResidue {
    pub path: String,
    /// Where this batch's bytes begin; everything before it is older lines.
    pub offset: u64,
}

/// One file a capture wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CapturedFile {
    pub name: String,
    pub size: u64,
}

/// Proof that the retired WAL generation was captured: the folder exists,
/// and every file in it and its manifest were fsynced before this was made.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CaptureReceipt {
    /// Absolute path of the capture folder.
    pub path: String,
    pub files: Vec<CapturedFile>,
    /// Hex sha256 of the folder's `manifest.json`.
    pub manifest_sha256: String,
}

/// Why a capture failed: the step and the errno, never a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CaptureFailure {
    pub operation: String,
    pub errno: Option<i64>,
}

/// Proof that a batch is in the divert file, made after its fsync.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DivertReceipt {
    /// Absolute path of the divert file.
    pub path: String,
    /// Byte offset of the first line of this batch.
    pub offset: u64,
    /// Bytes written for this batch (its lines, newlines included).
    pub length: u64,
    /// Lines (messages) written.
    pub count: u64,
    /// Hex sha256 of the bytes in `[offset, offset + length)`.
    pub sha256: String,
}

impl DivertReceipt {
    /// Whether this is a whole receipt, as a host makes one after the
    /// divert's fsync: an absolute path, at least one line, at least a byte
    /// a line, and a sha256 of 64 hex digits. A copy claims a kept copy
    /// only from one that passes.
    pub fn check(&self) -> Result<(), &'static str> {
        let whole = self.path.starts_with('/')
            && self.count > 0
            && self.length >= self.count
            && self.sha256.len() == 64
            && self.sha256.bytes().all(|b| b.is_ascii_hexdigit());
        if whole {
            Ok(())
        } else {
            Err("needs an absolute path, count, length and sha256")
        }
    }
}

/// Everything the copy may mention besides cause and outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CopyContext {
    pub session: Option<String>,
    /// The divert receipt, whole: the same record the flush machine takes
    /// after the divert's fsync. Only a `diverted` copy names its path, and
    /// only a well-formed receipt lets it claim a copy was kept.
    pub receipt: Option<DivertReceipt>,
    pub divert_failure: Option<DivertFailure>,
    /// The errno the original failure carried; it shapes the detail only.
    pub errno: Option<i64>,
    /// A finished capture of the retired generation. Only with it does a
    /// copy say the generation was captured, and where.
    pub capture_receipt: Option<CaptureReceipt>,
    /// A capture that was tried and failed.
    pub capture_failure: Option<CaptureFailure>,
    /// A failed divert that may have left some of its lines behind.
    pub divert_residue: Option<DivertResidue>,
    /// The unsettled capture (its folder's absolute path) that holds rows
    /// of this session the database lacks, and kept the batch from it.
    pub pending_capture: Option<String>,
    /// How the host's commits reach the disk: a `persisted` copy says
    /// "saved" only of synced commits.
    pub durability: Durability,
    /// The engine the failure came from: a PostgreSQL cause's copy names
    /// PostgreSQL's steps, never a SQLite command.
    pub engine: Engine,
    /// The holder of the lease that fenced a `turn_lease` write.
    pub lease: Option<crate::lease::LeaseHolder>,
}

/// User-facing copy: a structured value that hosts render as they like.
/// Its JSON form (see `json`) writes `details` as an object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Copy {
    /// Stable `<cause>.<outcome>` code.
    pub code: String,
    pub cause: Cause,
    pub outcome: Outcome,
    pub title: String,
    pub body: String,
    pub remediation: Vec<String>,
    /// Ordered key/value details (session, receipt path, divert failure, errno).
    pub details: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `label` indexes `LABELS` by discriminant and `from_label` indexes
    /// `ALL` by position: both hold only while `ALL` is in enum order.
    #[test]
    fn labels_read_back_to_their_variants() {
        fn check<T: core::marker::Copy + PartialEq + core::fmt::Debug>(
            all: &[T],
            index: fn(T) -> usize,
            label: fn(T) -> &'static str,
            from_label: fn(&str) -> Option<T>,
        ) {
            for (i, x) in all.iter().enumerate() {
                assert_eq!(index(*x), i, "{x:?} is not at its discriminant in ALL");
                assert_eq!(from_label(label(*x)), Some(*x));
            }
            assert_eq!(from_label("no_such_label"), None);
            assert_eq!(from_label(""), None);
        }
        check(&Operation::ALL, |x| x as usize, Operation::label, Operation::from_label);
        check(&Evidence::ALL, |x| x as usize, Evidence::label, Evidence::from_label);
        check(&Engine::ALL, |x| x as usize, Engine::label, Engine::from_label);
        check(&Cause::ALL, |x| x as usize, Cause::label, Cause::from_label);
        check(&Outcome::ALL, |x| x as usize, Outcome::label, Outcome::from_label);
    }

    #[test]
    fn an_evidence_set_is_the_sorted_distinct_list() {
        let lists: [&[Evidence]; 4] = [
            &[],
            &[Evidence::FtsScope, Evidence::DbReplaced, Evidence::FtsScope],
            &[
                Evidence::CompressionClosed,
                Evidence::CompressionInProgress,
                Evidence::DeletedWalGeneration,
            ],
            &Evidence::ALL,
        ];
        for list in lists {
            let mut sorted = list.to_vec();
            sorted.sort();
            sorted.dedup();
            assert_eq!(Evidence::set(list.iter().copied()), sorted);
        }
        let mut reversed = Evidence::ALL;
        reversed.reverse();
        assert_eq!(Evidence::set(reversed), Evidence::ALL.to_vec());
    }
}
