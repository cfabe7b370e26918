//! History rewrites that lose nothing: what the archive holds, and the
//! rules every engine follows.
//!
//! - **Nothing is deleted by an edit.** `pop`, `clear`, a compaction's
//!   replace, a rewind and `prune --archived-only`'s predecessor `prune`
//!   move rows to the archive, in the same transaction as the edit, with
//!   the reason ([`Reason`]), the time, the session's lease holder and the
//!   edit's id. Only `prune` of archived rows deletes.
//! - **Uids.** A uid is active at most once per session, and may sit in
//!   the archive any number of times (archived, restored, archived again).
//!   `restore` brings back, per uid, its newest archived copy, at its
//!   original seq, and skips (and reports) a uid that is active again: the
//!   active row is never overwritten.
//! - **Diverted lines under a clear.** A clear archives the session's
//!   pending divert lines with its rows (reason `clear`, their own uid and
//!   seq), then settles them as `cleared` in the replay ledger: `restore
//!   --reason clear` brings them back with the rows.
//! - **LangGraph deletes.** `delete_thread` marks the thread's rows
//!   rather than archiving them, and stores its pending divert lines with
//!   them, marked too, before settling them as `deleted`: `restore
//!   --reason delete` brings the marked rows back ([`crate::clear`]).
//! - **Forks** copy the prefix up to and including a seq into a new
//!   session in one transaction; each copy's uid is derived from the new
//!   session and the source uid ([`fork_uid`]), so a retried fork stores
//!   nothing twice and a resend into either session is never taken for
//!   the other's. The new session keeps its lineage.

use serde_json::{Map, Value, json};

use crate::transcript::StoredMessage;

/// Why a row went to the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Reason {
    Pop,
    Clear,
    Compaction,
    Rewind,
    Prune,
    /// LangGraph's `delete_thread`: its rows are marked rather than
    /// archived (`docs/LANGGRAPH.md`), its pending divert lines stored with
    /// them; `restore --reason delete` brings them back.
    Delete,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::Pop,
        Reason::Clear,
        Reason::Compaction,
        Reason::Rewind,
        Reason::Prune,
        Reason::Delete,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::Pop => "pop",
            Reason::Clear => "clear",
            Reason::Compaction => "compaction",
            Reason::Rewind => "rewind",
            Reason::Prune => "prune",
            Reason::Delete => "delete",
        }
    }

    pub fn from_label(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.label() == s)
    }
}

/// One archived row.
#[derive(Debug, Clone, PartialEq)]
pub struct Archived {
    pub uid: String,
    pub seq: i64,
    pub message: Map<String, Value>,
    pub archived_ms: i64,
    pub reason: String,
    pub holder: Option<String>,
    pub edit: String,
}

impl Archived {
    /// `{"uid", "seq", "message", "archived_at", "reason"}`, as `turnsafe
    /// show --archived --json` prints it (`archived_at` in RFC 3339, UTC).
    pub fn to_value(&self) -> Value {
        json!({
            "uid": self.uid,
            "seq": self.seq,
            "message": self.message,
            "archived_at": rfc3339(self.archived_ms),
            "reason": self.reason,
        })
    }
}

/// Which archived rows a restore brings back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// These uids (each its newest archived copy).
    Uids(Vec<String>),
    /// Every row archived for this reason, at or after `since_ms` when given.
    Reason { reason: Reason, since_ms: Option<i64> },
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    /// `(uid, seq)` of each row brought back, in seq order.
    pub restored: Vec<(String, i64)>,
    /// Uids skipped because they are active again.
    pub skipped_active: Vec<String>,
    /// Uids asked for that the archive does not hold.
    pub not_archived: Vec<String>,
    /// LangGraph checkpoints and writes brought back (`--reason delete`).
    pub checkpoints_restored: u64,
    pub writes_restored: u64,
}

impl RestoreReport {
    pub fn to_value(&self) -> Value {
        json!({
            "restored": self.restored.iter().map(|(u, s)| json!({"uid": u, "seq": s})).collect::<Vec<_>>(),
            "skipped_active": self.skipped_active,
            "not_archived": self.not_archived,
            "checkpoints_restored": self.checkpoints_restored,
            "writes_restored": self.writes_restored,
        })
    }
}

/// What a clear archived: the stored rows, and the pending divert lines
/// archived with them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cleared {
    pub rows: Vec<StoredMessage>,
    pub pending: Vec<StoredMessage>,
}

/// What a fork did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkReport {
    pub source: String,
    pub at_seq: i64,
    pub session: String,
    /// Rows copied now.
    pub copied: u64,
    /// Rows a retried fork found already there.
    pub already: u64,
}

impl ForkReport {
    pub fn to_value(&self) -> Value {
        json!({
            "source": self.source,
            "at_seq": self.at_seq,
            "session": self.session,
            "copied": self.copied,
            "already": self.already,
        })
    }
}

/// Which rows a prune takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Rows older than this many milliseconds (active rows by when they
    /// were stored, archived rows by when they were archived).
    NewerThanMs(i64),
    /// The newest N active rows of each session (by seq), and the newest N
    /// archived rows of each session (by when they were archived).
    Last(u64),
}

/// What a prune does, and to which sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneOptions {
    pub keep: Keep,
    /// Only delete archived rows; the transcripts are left alone.
    pub archived_only: bool,
    pub session: Option<String>,
    pub dry_run: bool,
}

/// What a prune did to one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PrunedSession {
    pub session: String,
    /// Active rows moved to the archive (reason `prune`).
    pub archived: u64,
    /// Archived rows deleted for good.
    pub deleted: u64,
}

/// What a prune did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    pub sessions: Vec<PrunedSession>,
    /// Sessions left alone because another writer holds their live lease.
    pub skipped: Vec<String>,
    /// Bytes the file gave back to the file system (SQLite), when measured.
    pub reclaimed_bytes: Option<u64>,
    /// How the freed space was handled: `reclaimed` (SQLite, incremental
    /// vacuum), `reusable` (PostgreSQL's VACUUM: reused by later rows, not
    /// given back), `not_reclaimed` (with why), or `none` (nothing freed).
    pub space: String,
    pub dry_run: bool,
    /// LangGraph checkpoints a delete or prune had marked, removed for
    /// good (with `--session`, none: they belong to threads).
    pub checkpoints_purged: u64,
    /// Their writes, and writes marked on their own.
    pub writes_purged: u64,
}

impl PruneReport {
    pub fn archived(&self) -> u64 {
        self.sessions.iter().map(|s| s.archived).sum()
    }
    pub fn deleted(&self) -> u64 {
        self.sessions.iter().map(|s| s.deleted).sum()
    }
    /// Rows removed for good: archived messages and LangGraph's marked rows.
    pub fn removed(&self) -> u64 {
        self.deleted() + self.checkpoints_purged + self.writes_purged
    }
}

/// A session's lineage, when it was forked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    pub session: String,
    pub seq: i64,
}

impl Lineage {
    pub fn to_value(&self) -> Value {
        json!({"session": self.session, "seq": self.seq})
    }
}

/// Why a fork cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForkRefused {
    #[error("session {session} already exists and is not a fork of {source_session} at seq {at_seq}")]
    Exists {
        session: String,
        source_session: String,
        at_seq: i64,
    },
    #[error("session {0} has no message at or before seq {1}")]
    NothingToFork(String, i64),
    #[error("a session cannot be forked into itself")]
    Same,
}

/// The uid of a forked copy: derived from the new session and the source
/// uid, so a retried fork finds its own copies, and a uid in either
/// session never stands for the other's message.
pub fn fork_uid(new_session: &str, source_uid: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"turnsafe fork\0");
    h.update(new_session.as_bytes());
    h.update(b"\0");
    h.update(source_uid.as_bytes());
    let digest = h.finalize();
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("fork-{hex}")
}

/// Milliseconds since the epoch as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_their_labels() {
        for r in Reason::ALL {
            assert_eq!(Reason::from_label(r.label()), Some(r));
        }
        assert_eq!(Reason::from_label("deleted"), None);
        assert_eq!(Reason::from_label(""), None);
    }

    #[test]
    fn a_fork_uid_depends_on_both_the_new_session_and_the_source() {
        let a = fork_uid("new", "u1");
        assert_eq!(a, fork_uid("new", "u1"), "stable");
        assert_ne!(a, fork_uid("other", "u1"));
        assert_ne!(a, fork_uid("new", "u2"));
        assert!(crate::message::valid_uid(&a), "{a}");
    }

    #[test]
    fn archived_at_is_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
