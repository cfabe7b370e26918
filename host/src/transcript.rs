//! Reading a session's stored transcript: what `turnsafe show` prints and
//! what the Python package's `Store.show` returns.

use rusqlite::Connection;
use serde_json::{Map, Value, json};

use crate::rows;

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
/// `seq` order. Reads a database of any schema version.
pub fn stored_messages(conn: &Connection, session: &str, limit: Option<u64>) -> rusqlite::Result<Vec<StoredMessage>> {
    let limit = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    let items = rows::has_items(conn)?;
    let cols = rows::item_columns(items);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT uid, seq, {cols} FROM \
         (SELECT id, uid, seq, {cols} FROM messages \
          WHERE session_id = ?1 ORDER BY seq DESC, id DESC LIMIT ?2) \
         ORDER BY seq, id"
    ))?;
    let found = stmt.query_map(rusqlite::params![session, limit], |r| {
        Ok(StoredMessage {
            uid: r.get(0)?,
            seq: r.get(1)?,
            message: rows::read_item(r, 2, items)?,
        })
    })?;
    found.collect()
}
