//! Writing another runtime's history into a home ([`crate::import_hermes`]):
//! sessions with their metadata, rows with given uids and seqs, and rows
//! that runtime had already taken out of the transcript, straight into the
//! archive.
//!
//! One group of sessions is one edit ([`SessionStore::edit`]): one
//! `BEGIN IMMEDIATE` transaction that checks the generation guard first,
//! whose failure the policy decides. A session whose live turn lease is held
//! by another writer is skipped inside the transaction and reported as
//! refused; the others of the group are written.
//!
//! Idempotent by uid: a uid already in the session, active or archived
//! (popped since the last import, say), is a duplicate and is never written
//! again.
//!
//! Seqs: a row's seq is its given seq plus the session's base, recorded in
//! its `session_meta` record (`seq_base`) at its first import: 0 for a new
//! session, just past its rows for a session turnsafe already wrote to, so
//! those stay first and every later import numbers the same way.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::{EditError, SessionStore};
use crate::ids::now_ms;
use crate::import_rows::with_seq_base;
pub use crate::import_rows::{IMPORT_EDIT, IMPORT_HOLDER, ImportCounts, ImportRow, ImportSession};

/// Whether `session`'s live turn lease is held (by anyone: an import holds
/// none).
fn lease_live(conn: &Connection, session: &str) -> rusqlite::Result<bool> {
    let lease: Option<(Option<String>, Option<i64>, Option<String>)> = conn
        .prepare_cached("SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = ?1")?
        .query_row([session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(match lease {
        // Live until its expiry, or until the policy finds its holder gone.
        Some((Some(_), expires, stored)) => matches!(
            crate::lease_proof::judge(
                session,
                stored.as_deref(),
                expires,
                now_ms(),
                turnsafe_policy::ServerProbe::Unrecorded
            ),
            crate::lease_proof::Judged::Fenced(_)
        ),
        _ => false,
    })
}

fn table_exists(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)")?
        .query_row([name], |r| r.get(0))
}

/// Import `s` through `conn`, inside the caller's transaction; with `write`
/// false nothing is written and the counts say what would be.
pub fn import_session(conn: &Connection, s: &ImportSession, write: bool) -> rusqlite::Result<ImportCounts> {
    let mut counts = ImportCounts::default();
    let session = s.session.as_str();
    let has_sessions = table_exists(conn, "sessions")?;
    if has_sessions && lease_live(conn, session)? {
        counts.refused = true;
        return Ok(counts);
    }
    let has_archive = table_exists(conn, "archive")?;
    // Uids of the session already in the archive: a duplicate, whether an
    // earlier import put them there or an edit since did.
    let mut archived: HashMap<String, String> = HashMap::new();
    if has_archive {
        let mut stmt = conn.prepare_cached("SELECT uid, item FROM archive WHERE session_id = ?1")?;
        for row in stmt.query_map([session], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
            let (uid, item) = row?;
            archived.insert(uid, item);
        }
    }
    let has_messages = table_exists(conn, "messages")?;
    let base = seq_base(conn, session, has_messages)?;
    if write {
        conn.prepare_cached("INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)")?
            .execute(params![session, s.created_ms])?;
        if let Some((origin, origin_id, meta)) = &s.meta {
            let meta = with_seq_base(meta, base);
            conn.prepare_cached(
                "INSERT INTO session_meta(session_id, origin, origin_id, meta, imported_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT(session_id) DO UPDATE SET origin = excluded.origin, origin_id = excluded.origin_id, \
                 meta = excluded.meta WHERE meta IS NOT excluded.meta",
            )?
            .execute(params![session, origin, origin_id, meta, now_ms()])?;
        }
    }
    let mut active = if has_messages {
        let columns = crate::rows::item_columns(crate::rows::has_items(conn)?);
        Some(conn.prepare_cached(&format!(
            "SELECT {columns} FROM messages WHERE session_id = ?1 AND uid = ?2"
        ))?)
    } else {
        None
    };
    // Prepared only to write: a dry run may read a database of an earlier
    // version, without the archive.
    let (mut insert, mut to_archive) = if write {
        (
            Some(conn.prepare_cached(crate::rows::INSERT_OR_KEEP)?),
            Some(conn.prepare_cached(
                "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, reason, \
                 holder, edit) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )?),
        )
    } else {
        (None, None)
    };
    let at_ms = now_ms();
    let items = has_messages && crate::rows::has_items(conn)?;
    for row in &s.rows {
        if let Some(stored) = archived.get(&row.uid) {
            counts.held(crate::same::same_object_text(stored, row.message.item()));
            continue;
        }
        match row.archive {
            None if insert.is_some() => {
                let Some(insert) = insert.as_mut() else { continue };
                if crate::rows::insert(insert, session, &row.uid, base + row.seq, &row.message, row.created_ms)? == 1 {
                    counts.imported += 1;
                } else {
                    counts.held(crate::rows::same_row(conn, session, &row.uid, &row.message)?);
                }
            }
            _ => {
                let stored: Option<serde_json::Map<String, serde_json::Value>> = match active.as_mut() {
                    Some(stmt) => stmt
                        .query_row(params![session, row.uid], |r| crate::rows::read_item(r, 0, items))
                        .optional()?,
                    None => None,
                };
                if let Some(stored) = stored {
                    let text = serde_json::Value::Object(stored).to_string();
                    counts.held(crate::same::same_object_text(&text, row.message.item()));
                    continue;
                }
                match row.archive {
                    None => counts.imported += 1,
                    Some(reason) => {
                        if let Some(to_archive) = to_archive.as_mut() {
                            to_archive.execute(params![
                                session,
                                row.uid,
                                base + row.seq,
                                row.message.role(),
                                row.message.content_text(),
                                row.message.item_text(),
                                row.created_ms,
                                at_ms,
                                reason.label(),
                                IMPORT_HOLDER,
                                IMPORT_EDIT
                            ])?;
                        }
                        // A source's rows have distinct uids; one archived
                        // twice in this run meets its first copy.
                        archived.insert(row.uid.clone(), row.message.item_text());
                        counts.archived += 1;
                    }
                }
            }
        }
    }
    Ok(counts)
}

/// Where the imported rows' seqs start: `seq_base` in the session's
/// record once it was imported; before, just past the session's rows (a
/// session turnsafe already wrote to keeps them first), else 0.
fn seq_base(conn: &Connection, session: &str, has_messages: bool) -> rusqlite::Result<i64> {
    if table_exists(conn, "session_meta")? {
        let recorded: Option<Option<i64>> = conn
            .prepare_cached("SELECT json_extract(meta, '$.seq_base') FROM session_meta WHERE session_id = ?1")?
            .query_row([session], |r| r.get(0))
            .optional()?;
        if let Some(base) = recorded {
            return Ok(base.unwrap_or(0));
        }
    }
    if !has_messages {
        return Ok(0);
    }
    conn.prepare_cached("SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE session_id = ?1")?
        .query_row([session], |r| r.get(0))
}

impl SessionStore {
    /// Import a group of sessions in one edit (one transaction). The
    /// edit's own lease check is for the group's first session; every
    /// session's is checked again inside, and a session whose lease is
    /// live is skipped and counted `refused`.
    pub fn import_group(&mut self, group: &[ImportSession]) -> Result<Vec<ImportCounts>, EditError> {
        let Some(first) = group.first() else {
            return Ok(Vec::new());
        };
        self.edit("import", &first.session, |conn, _| {
            group.iter().map(|s| import_session(conn, s, true)).collect()
        })
    }
}
