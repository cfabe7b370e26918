//! What a full-text search finds, on either engine.

use serde::Serialize;

/// One matching message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hit {
    pub session: String,
    pub uid: String,
    pub seq: i64,
    /// The message's `role`; `None` for a message without one (a tool call).
    pub role: Option<String>,
    /// The matching text, with matches in `[` `]`.
    pub snippet: String,
    /// Set for a row found in the archive: when it was archived and why.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub archived: Option<ArchivedHit>,
}

/// Where an archived hit came from: `"archived": true`, `archived_at`
/// (RFC 3339) and `reason` in the hit's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchivedHit {
    pub archived: bool,
    pub archived_at: String,
    pub reason: String,
}

impl ArchivedHit {
    pub fn new(archived_ms: i64, reason: String) -> ArchivedHit {
        ArchivedHit {
            archived: true,
            archived_at: crate::history::rfc3339(archived_ms),
            reason,
        }
    }
}
