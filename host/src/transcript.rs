//! Reading a session's stored transcript: what `turnsafe show` prints and
//! what the Python package's `Store.show` returns.

use rusqlite::Connection;
use serde_json::{Map, Value, json};

/// One stored message: its uid and place beside it, and the message itself.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    pub uid: String,
    pub seq: i64,
    pub message: Map<String, Value>,
}

impl StoredMessage {
    /// `{"uid", "seq", "message"}`, as `turnsafe show --json` prints it.
    pub fn to_value(&self) -> Value {
        json!({ "uid": self.uid, "seq": self.seq, "message": self.message })
    }

    /// The message's `role`, when it has a string one.
    pub fn role(&self) -> Option<&str> {
        self.message.get("role").and_then(Value::as_str)
    }
}

/// The newest `limit` messages of `session` (all of them with `None`), in
/// `seq` order.
pub fn stored_messages(conn: &Connection, session: &str, limit: Option<u64>) -> rusqlite::Result<Vec<StoredMessage>> {
    let limit = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    let mut stmt = conn.prepare_cached(
        "SELECT uid, seq, role, content, content_json, extra FROM \
         (SELECT id, uid, seq, role, content, content_json, extra FROM messages \
          WHERE session_id = ?1 ORDER BY seq DESC, id DESC LIMIT ?2) \
         ORDER BY seq, id",
    )?;
    let rows = stmt.query_map(rusqlite::params![session, limit], |r| {
        let (uid, seq, role, content, is_json, extra): (String, i64, String, String, bool, String) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?);
        let mut message: Map<String, Value> = serde_json::from_str(&extra).unwrap_or_default();
        let content = if is_json {
            serde_json::from_str(&content).unwrap_or(Value::String(content))
        } else {
            Value::String(content)
        };
        message.insert("role".into(), role.into());
        message.insert("content".into(), content);
        Ok(StoredMessage { uid, seq, message })
    })?;
    rows.collect()
}
