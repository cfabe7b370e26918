//! The LangGraph rows a `delete_thread` marks, on PostgreSQL: the
//! thread's pending divert lines stored with them, and `restore --reason
//! delete` bringing them back, as on SQLite.

use postgres::Transaction;

use crate::ids::thread_session;
use crate::pending::{PendingRecord, PutBeforeDelete};

/// Store the pending records of a thread being deleted as replay would
/// have stored them (each key read with its row locked), inside the
/// delete's transaction: the delete then marks them with the thread's
/// other rows.
pub(super) fn store_pending(
    tx: &mut Transaction<'_>,
    pending: &[PendingRecord],
    now: i64,
) -> Result<(), postgres::Error> {
    for p in pending {
        let stored = super::graph::stored(tx, &p.line, true)?;
        match p.put_before_delete(stored.as_ref(), now) {
            PutBeforeDelete::Nothing => {}
            PutBeforeDelete::Free { created_ms } => {
                super::graph::replay_put(tx, &p.line, created_ms, None, false)?;
            }
            PutBeforeDelete::Over { created_ms, deleted_ms } => {
                super::graph::replay_put(tx, &p.line, created_ms, deleted_ms, true)?;
            }
        }
    }
    Ok(())
}

/// Bring back the marked rows of every thread whose session (safe id) is
/// `session`, those marked at or after `since_ms` when given. Returns
/// `(checkpoints, writes)` brought back.
pub(super) fn restore_marked(
    tx: &mut Transaction<'_>,
    session: &str,
    since_ms: Option<i64>,
) -> Result<(u64, u64), postgres::Error> {
    let threads: Vec<String> = tx
        .query(
            "SELECT thread_id FROM checkpoints WHERE deleted_ms IS NOT NULL
             UNION SELECT thread_id FROM checkpoint_writes WHERE deleted_ms IS NOT NULL",
            &[],
        )?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    let (mut checkpoints, mut writes) = (0, 0);
    for thread in threads.iter().filter(|t| thread_session(t) == session) {
        checkpoints += tx.execute(
            "UPDATE checkpoints SET deleted_ms = NULL
              WHERE thread_id = $1 AND deleted_ms IS NOT NULL AND ($2::int8 IS NULL OR deleted_ms >= $2)",
            &[thread, &since_ms],
        )?;
        writes += tx.execute(
            "UPDATE checkpoint_writes SET deleted_ms = NULL
              WHERE thread_id = $1 AND deleted_ms IS NOT NULL AND ($2::int8 IS NULL OR deleted_ms >= $2)",
            &[thread, &since_ms],
        )?;
    }
    Ok((checkpoints, writes))
}
