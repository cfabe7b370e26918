//! A pending divert line as an edit takes it: a message line a clear
//! archives, or a LangGraph line of a thread being deleted, and what the
//! delete puts before it marks the thread. Beside the store's vocabulary
//! (`Backend` names these types), below the edits that take the lines
//! ([`crate::clear`]).

use crate::graph::{GraphLine, StoredGraph};
use crate::message::Message;

/// A pending message line as a clear archives it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingMessage {
    pub uid: String,
    /// The line's place in the transcript, when it had one.
    pub seq: Option<i64>,
    pub message: Message,
}

/// A pending LangGraph line of a thread being deleted.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingRecord {
    pub line: GraphLine,
    /// When it was diverted (its `at`), if the line says.
    pub at_ms: Option<i64>,
}

/// What a delete does with a pending record before it marks the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PutBeforeDelete {
    /// The stored row already holds what the put would have left.
    Nothing,
    /// Into its free key, a put made at `created_ms`.
    Free { created_ms: i64 },
    /// Over the stored row, a put made at `created_ms` (marked at
    /// `deleted_ms` by an earlier delete that still holds).
    Over { created_ms: i64, deleted_ms: Option<i64> },
}

impl PendingRecord {
    /// The put the live call would have made, had it been made when the
    /// line was diverted, as replay decides it ([`crate::settle::graph`]):
    /// the delete then marks what it left. `now` stands for a line with no
    /// `at`.
    pub(crate) fn put_before_delete(&self, stored: Option<&StoredGraph>, now: i64) -> PutBeforeDelete {
        let facts = stored.map(|s| crate::settle::Stored {
            digest: s.record.digest(),
            created_ms: s.created_ms,
            deleted_ms: s.deleted_ms,
        });
        let created_ms = self.at_ms.unwrap_or(now);
        match crate::settle::graph(&self.line.digest(), self.line.replaces(), self.at_ms, facts.as_ref()) {
            crate::settle::Verdict::Insert => PutBeforeDelete::Free { created_ms },
            crate::settle::Verdict::Apply { deleted_ms } => PutBeforeDelete::Over { created_ms, deleted_ms },
            _ => PutBeforeDelete::Nothing,
        }
    }
}
