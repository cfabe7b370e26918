//! A message as a row of `messages`, in one place: how it is inserted,
//! compared on a resend, and read back from a database of any schema
//! version (older ones kept `role`, `content`, `content_json` and `extra`
//! instead of the object itself).

use rusqlite::{CachedStatement, Connection, OptionalExtension, Row, params};
use serde_json::{Map, Value};

use crate::message::{Message, text_of};

/// Insert one message; the caller decides what a conflict means.
pub(crate) const INSERT: &str = "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// Insert one message unless its (session, uid) is stored; 0 rows then.
pub(crate) const INSERT_OR_KEEP: &str = "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(session_id, uid) DO NOTHING";

/// Run [`INSERT`] or [`INSERT_OR_KEEP`] for `m`.
pub(crate) fn insert(
    stmt: &mut CachedStatement<'_>,
    session: &str,
    uid: &str,
    seq: i64,
    m: &Message,
    created_ms: i64,
) -> rusqlite::Result<usize> {
    stmt.execute(params![
        session,
        uid,
        seq,
        m.role(),
        m.content_text(),
        m.item_text(),
        created_ms
    ])
}

/// The object stored under (session, uid), as its stored JSON text.
pub(crate) fn stored_item(conn: &Connection, session: &str, uid: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT item FROM messages WHERE session_id = ?1 AND uid = ?2")?
        .query_row([session, uid], |r| r.get(0))
        .optional()
}

/// Whether (session, uid) is stored with exactly this object's bytes
/// ([`crate::same`]).
pub(crate) fn same_row(conn: &Connection, session: &str, uid: &str, m: &Message) -> rusqlite::Result<bool> {
    Ok(stored_item(conn, session, uid)?.is_some_and(|s| crate::same::same_object_text(&s, m.item())))
}

/// The object an older row held in pieces: `extra` with `role` and
/// `content` (JSON when `content_json`) put back.
pub(crate) fn legacy_item(role: String, content: String, content_json: bool, extra: &str) -> Map<String, Value> {
    let mut item = crate::json_in::object(extra).unwrap_or_default();
    let content = if content_json {
        crate::json_in::value(&content).unwrap_or(Value::String(content))
    } else {
        Value::String(content)
    };
    item.insert("role".into(), role.into());
    item.insert("content".into(), content);
    item
}

/// Whether `messages` keeps whole objects (an `item` column).
pub(crate) fn has_items(conn: &Connection) -> rusqlite::Result<bool> {
    let n: i64 = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('messages') WHERE name = 'item'",
        [],
        |r| r.get(0),
    )?;
    Ok(n > 0)
}

/// The columns to select for [`read_item`], for this database's layout.
pub(crate) fn item_columns(items: bool) -> &'static str {
    if items {
        "item"
    } else {
        "role, content, content_json, extra"
    }
}

/// The object of a row selected with [`item_columns`] from column `at` on.
pub(crate) fn read_item(r: &Row<'_>, at: usize, items: bool) -> rusqlite::Result<Map<String, Value>> {
    if items {
        let text: String = r.get(at)?;
        crate::json_in::object(&text)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(at, rusqlite::types::Type::Text, Box::new(e)))
    } else {
        Ok(legacy_item(
            r.get(at)?,
            r.get(at + 1)?,
            r.get(at + 2)?,
            &r.get::<_, String>(at + 3)?,
        ))
    }
}

/// The `role` and `content` projection an object is stored with.
pub(crate) fn projection(item: &Map<String, Value>) -> (Option<String>, Option<String>) {
    (
        item.get("role").and_then(Value::as_str).map(String::from),
        item.get("content").and_then(text_of),
    )
}
