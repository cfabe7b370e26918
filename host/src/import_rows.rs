//! What an import of another runtime's history writes, whichever engine
//! it writes to ([`crate::import_hermes`]; SQLite in `store/import.rs`,
//! PostgreSQL in `pg/import.rs`): sessions with their metadata, rows with
//! given uids and seqs, and rows that runtime had already taken out of the
//! transcript, for the archive.
//!
//! Idempotent on every engine: a uid already in the session, active or
//! archived, is never written again; it is a duplicate when the stored row
//! has the row's bytes (the one comparison, [`crate::same`]), and a
//! conflict, set aside, when it has others. A row's seq is
//! its given seq plus the session's base, recorded in its `session_meta`
//! record (`seq_base`) at its first import: 0 for a new session, just past
//! its rows for a session turnsafe already wrote to.

use crate::history::Reason;
use crate::ids::SessionId;
use crate::message::Message;

/// The `edit` stamped on every archived row an import writes.
pub const IMPORT_EDIT: &str = "import";

/// One row to import.
#[derive(Debug, Clone)]
pub struct ImportRow {
    pub uid: String,
    pub seq: i64,
    pub message: Message,
    pub created_ms: i64,
    /// `Some`: the source had taken it out of the transcript; it goes to the
    /// archive with this reason.
    pub archive: Option<Reason>,
}

/// One session's rows (all of them, or the next part of them), and its
/// metadata.
#[derive(Debug, Clone)]
pub struct ImportSession {
    pub session: SessionId,
    pub created_ms: i64,
    /// `(origin, origin_id, meta JSON)` for `session_meta`.
    pub meta: Option<(String, String, String)>,
    pub rows: Vec<ImportRow>,
}

/// What one session's import did (or, in a dry run, would do).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportCounts {
    /// Rows written as active history.
    pub imported: u64,
    /// Rows written to the archive.
    pub archived: u64,
    /// Rows the session already holds, active or archived, with the same
    /// bytes ([`crate::same`]).
    pub duplicate: u64,
    /// Rows whose uid the session holds with other bytes: not written (the
    /// stored row stays), counted apart.
    pub conflict: u64,
    /// Another writer holds the session's live turn lease: nothing written.
    pub refused: bool,
}

impl ImportCounts {
    /// A row whose uid the session already holds: a duplicate when the
    /// stored row has its bytes, else a conflict.
    pub(crate) fn held(&mut self, same_bytes: bool) {
        if same_bytes {
            self.duplicate += 1;
        } else {
            self.conflict += 1;
        }
    }
}

/// The record `meta` (a JSON object) with `seq_base` set.
pub(crate) fn with_seq_base(meta: &str, base: i64) -> String {
    match crate::json_in::value(meta) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.insert("seq_base".into(), base.into());
            serde_json::Value::Object(m).to_string()
        }
        _ => meta.to_string(),
    }
}

/// The `holder` stamped on every archived row an import writes.
pub const IMPORT_HOLDER: &str = "turnsafe import";
