//! The LangGraph rows a `delete_thread` marks, on SQLite: the thread's
//! pending divert lines stored with them, and `restore --reason delete`
//! bringing them back. Marked rows are LangGraph's archive: every read
//! leaves them out, `turnsafe prune` removes them for good.

use rusqlite::{Connection, params};

use crate::ids::thread_session;
use crate::pending::{PendingRecord, PutBeforeDelete};

/// Store the pending records of a thread being deleted as replay would
/// have stored them, inside the delete's transaction: the delete then
/// marks them with the thread's other rows.
pub(super) fn store_pending(conn: &Connection, pending: &[PendingRecord], now: i64) -> rusqlite::Result<()> {
    for p in pending {
        let stored = super::graph::stored(conn, &p.line)?;
        match p.put_before_delete(stored.as_ref(), now) {
            PutBeforeDelete::Nothing => {}
            PutBeforeDelete::Free { created_ms } => {
                super::graph::replay_put(conn, &p.line, created_ms, None, false)?;
            }
            PutBeforeDelete::Over { created_ms, deleted_ms } => {
                super::graph::replay_put(conn, &p.line, created_ms, deleted_ms, true)?;
            }
        }
    }
    Ok(())
}

/// Bring back the marked rows of every thread whose session (safe id) is
/// `session`, those marked at or after `since_ms` when given. Returns
/// `(checkpoints, writes)` brought back.
pub(super) fn restore_marked(conn: &Connection, session: &str, since_ms: Option<i64>) -> rusqlite::Result<(u64, u64)> {
    let threads: Vec<String> = conn
        .prepare_cached(
            "SELECT thread_id FROM checkpoints WHERE deleted_ms IS NOT NULL
             UNION SELECT thread_id FROM checkpoint_writes WHERE deleted_ms IS NOT NULL",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let (mut checkpoints, mut writes) = (0, 0);
    for thread in threads.iter().filter(|t| thread_session(t) == session) {
        checkpoints += conn
            .prepare_cached(
                "UPDATE checkpoints SET deleted_ms = NULL
                  WHERE thread_id = ?1 AND deleted_ms IS NOT NULL AND (?2 IS NULL OR deleted_ms >= ?2)",
            )?
            .execute(params![thread, since_ms])? as u64;
        writes += conn
            .prepare_cached(
                "UPDATE checkpoint_writes SET deleted_ms = NULL
                  WHERE thread_id = ?1 AND deleted_ms IS NOT NULL AND (?2 IS NULL OR deleted_ms >= ?2)",
            )?
            .execute(params![thread, since_ms])? as u64;
    }
    Ok((checkpoints, writes))
}
