//! LangGraph checkpoints and writes in `state.db` (schema version 6): the
//! statements a flush, a read, an edit and replay run. Keys and
//! semantics are in [`crate::graph`].

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use crate::graph::{
    CheckpointRecord, GraphBatch, GraphEdit, GraphEdited, GraphLine, GraphQuery, StoredCheckpoint, StoredGraph,
    WriteRecord,
};

/// Version 6's tables. `deleted_ms` marks what a LangGraph delete or
/// prune took out of every read; `turnsafe prune` removes those rows.
pub(super) const TABLES: &str = "
CREATE TABLE IF NOT EXISTS checkpoints(
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL DEFAULT '',
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type                 TEXT,
    checkpoint           BLOB NOT NULL,
    metadata             TEXT NOT NULL,
    run_id               TEXT,
    created_ms           INTEGER NOT NULL,
    deleted_ms           INTEGER,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS checkpoints_by_run ON checkpoints(run_id) WHERE run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS checkpoint_writes(
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    task_path     TEXT NOT NULL DEFAULT '',
    channel       TEXT NOT NULL,
    type          TEXT,
    value         BLOB NOT NULL,
    created_ms    INTEGER NOT NULL,
    deleted_ms    INTEGER,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
) WITHOUT ROWID;
";

/// A put replaces the checkpoint it meets (LangGraph's savers do), and
/// brings back one a delete had marked.
const PUT_CHECKPOINT: &str = "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms, deleted_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
    ON CONFLICT(thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = excluded.parent_checkpoint_id, type = excluded.type,
        checkpoint = excluded.checkpoint, metadata = excluded.metadata, run_id = excluded.run_id,
        created_ms = excluded.created_ms, deleted_ms = NULL";

/// Replay's put of a checkpoint it settled ([`crate::settle`]): at the
/// time the line was diverted, marked when a later delete had marked the
/// key. `over` chooses [`REPLAY_CHECKPOINT_OVER`] instead.
const REPLAY_CHECKPOINT: &str = "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms, deleted_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING";

const REPLAY_CHECKPOINT_OVER: &str = "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms, deleted_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
    ON CONFLICT(thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = excluded.parent_checkpoint_id, type = excluded.type,
        checkpoint = excluded.checkpoint, metadata = excluded.metadata, run_id = excluded.run_id,
        created_ms = excluded.created_ms, deleted_ms = excluded.deleted_ms";

/// A special write replaces the one it meets; an ordinary one keeps the
/// first copy unless that copy was deleted.
const PUT_WRITE: &str = "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
    ON CONFLICT(thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = excluded.task_path, channel = excluded.channel, type = excluded.type,
        value = excluded.value, created_ms = excluded.created_ms, deleted_ms = NULL
    WHERE ?11 OR checkpoint_writes.deleted_ms IS NOT NULL";

const REPLAY_WRITE: &str = "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms, deleted_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) ON CONFLICT DO NOTHING";

const REPLAY_WRITE_OVER: &str = "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms, deleted_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
    ON CONFLICT(thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = excluded.task_path, channel = excluded.channel, type = excluded.type,
        value = excluded.value, created_ms = excluded.created_ms, deleted_ms = excluded.deleted_ms";

fn metadata_text(c: &CheckpointRecord) -> String {
    c.metadata.to_string()
}

/// A checkpoint's statement: a flush's put (`deleted_ms` `None`) or replay's.
fn insert_checkpoint(
    conn: &Connection,
    sql: &str,
    c: &CheckpointRecord,
    now: i64,
    deleted_ms: Option<i64>,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params![
        c.thread_id,
        c.checkpoint_ns,
        c.checkpoint_id,
        c.parent_checkpoint_id,
        c.kind,
        c.checkpoint,
        metadata_text(c),
        c.run_id(),
        now,
        deleted_ms
    ])
}

/// A write's statement: `last` is the flush's replace flag, or replay's
/// `deleted_ms`.
fn insert_write(
    conn: &Connection,
    sql: &str,
    w: &WriteRecord,
    now: i64,
    last: &dyn rusqlite::ToSql,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params![
        w.thread_id,
        w.checkpoint_ns,
        w.checkpoint_id,
        w.task_id,
        w.idx,
        w.task_path,
        w.channel,
        w.kind,
        w.value,
        now,
        last
    ])
}

/// A flush's statements for one graph batch, inside the group's
/// transaction.
pub(super) fn write(conn: &Connection, graph: &GraphBatch, now: i64) -> rusqlite::Result<()> {
    match graph {
        GraphBatch::Checkpoint(c) => insert_checkpoint(conn, PUT_CHECKPOINT, c, now, None).map(drop),
        GraphBatch::Writes(writes) => {
            // LangGraph's rule: a batch of special writes only replaces.
            let replace = writes.iter().all(WriteRecord::is_special);
            for w in writes {
                insert_write(conn, PUT_WRITE, w, now, &replace)?;
            }
            Ok(())
        }
    }
}

/// Replay's put of one diverted record it settled ([`crate::settle`]):
/// made at `created_ms`, marked at `deleted_ms`; over the stored row when
/// `over`, else only into a free key. `true` when it was written.
pub fn replay_put(
    conn: &Connection,
    line: &GraphLine,
    created_ms: i64,
    deleted_ms: Option<i64>,
    over: bool,
) -> rusqlite::Result<bool> {
    let n = match line {
        GraphLine::Checkpoint(c) => {
            let sql = if over {
                REPLAY_CHECKPOINT_OVER
            } else {
                REPLAY_CHECKPOINT
            };
            insert_checkpoint(conn, sql, c, created_ms, deleted_ms)?
        }
        GraphLine::Write(w) => {
            let sql = if over { REPLAY_WRITE_OVER } else { REPLAY_WRITE };
            insert_write(conn, sql, w, created_ms, &deleted_ms)?
        }
    };
    Ok(n == 1)
}

/// The row stored under the record's key, marked or not.
pub fn stored(conn: &Connection, line: &GraphLine) -> rusqlite::Result<Option<StoredGraph>> {
    match line {
        GraphLine::Checkpoint(c) => conn
            .prepare_cached(
                "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, created_ms, deleted_ms
                   FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3",
            )?
            .query_row(params![c.thread_id, c.checkpoint_ns, c.checkpoint_id], |r| {
                let (mut record, created_ms) = checkpoint_of(r)?;
                // Metadata that is not JSON is compared as its text, so it
                // can never pass for a line's object.
                let text: String = r.get(6)?;
                if crate::json_in::value(&text).is_err() {
                    record.metadata = Value::String(text);
                }
                Ok(StoredGraph {
                    record: GraphLine::Checkpoint(record),
                    created_ms,
                    deleted_ms: r.get(8)?,
                })
            })
            .optional(),
        GraphLine::Write(w) => conn
            .prepare_cached(
                "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value, created_ms, deleted_ms
                   FROM checkpoint_writes
                  WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3 AND task_id = ?4 AND idx = ?5",
            )?
            .query_row(
                params![w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx],
                |r| {
                    Ok(StoredGraph {
                        record: GraphLine::Write(write_of(r)?),
                        created_ms: r.get(9)?,
                        deleted_ms: r.get(10)?,
                    })
                },
            )
            .optional(),
    }
}

/// After a lost COMMIT: whether every record of the batch is stored,
/// live, with the batch's own bytes ([`crate::same`]); a key that holds
/// other bytes was not this batch's write.
pub(super) fn resolve(conn: &Connection, graph: &GraphBatch) -> rusqlite::Result<bool> {
    let lines: Vec<GraphLine> = match graph {
        GraphBatch::Checkpoint(c) => vec![GraphLine::Checkpoint(c.clone())],
        GraphBatch::Writes(writes) => writes.iter().cloned().map(GraphLine::Write).collect(),
    };
    for line in &lines {
        let same = stored(conn, line)?.is_some_and(|s| s.deleted_ms.is_none() && s.record.digest() == line.digest());
        if !same {
            return Ok(false);
        }
    }
    Ok(true)
}

fn write_of(w: &Row<'_>) -> rusqlite::Result<WriteRecord> {
    Ok(WriteRecord {
        thread_id: w.get(0)?,
        checkpoint_ns: w.get(1)?,
        checkpoint_id: w.get(2)?,
        task_id: w.get(3)?,
        task_path: w.get(4)?,
        idx: w.get(5)?,
        channel: w.get(6)?,
        kind: w.get(7)?,
        value: w.get(8)?,
    })
}

fn checkpoint_of(r: &Row<'_>) -> rusqlite::Result<(CheckpointRecord, i64)> {
    let metadata: String = r.get(6)?;
    Ok((
        CheckpointRecord {
            thread_id: r.get(0)?,
            checkpoint_ns: r.get(1)?,
            checkpoint_id: r.get(2)?,
            parent_checkpoint_id: r.get(3)?,
            kind: r.get(4)?,
            checkpoint: r.get(5)?,
            metadata: crate::json_in::value(&metadata).unwrap_or(Value::Object(Default::default())),
        },
        r.get(7)?,
    ))
}

/// The live checkpoints `q` asks for, newest first, each with its live
/// writes in LangGraph's order.
pub fn read(conn: &Connection, q: &GraphQuery) -> rusqlite::Result<Vec<StoredCheckpoint>> {
    let mut stmt = conn.prepare_cached(
        "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, created_ms
           FROM checkpoints
          WHERE deleted_ms IS NULL
            AND (?1 IS NULL OR thread_id = ?1)
            AND (?2 IS NULL OR checkpoint_ns = ?2)
            AND (?3 IS NULL OR checkpoint_id = ?3)
            AND (?4 IS NULL OR checkpoint_id < ?4)
          ORDER BY checkpoint_id DESC, thread_id, checkpoint_ns",
    )?;
    let rows = stmt.query_map(
        params![q.thread_id, q.checkpoint_ns, q.checkpoint_id, q.before],
        checkpoint_of,
    )?;
    let limit = q.limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut out = Vec::new();
    for row in rows {
        if out.len() >= limit {
            break;
        }
        let (record, created_ms) = row?;
        if !q.matches(&record.metadata) {
            continue;
        }
        out.push(StoredCheckpoint {
            record,
            writes: Vec::new(),
            created_ms,
        });
    }
    drop(stmt);
    let mut writes = conn.prepare_cached(
        "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
           FROM checkpoint_writes
          WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3 AND deleted_ms IS NULL
          ORDER BY task_path, task_id, idx",
    )?;
    for c in &mut out {
        let r = &c.record;
        c.writes = writes
            .query_map(params![r.thread_id, r.checkpoint_ns, r.checkpoint_id], write_of)?
            .collect::<rusqlite::Result<_>>()?;
    }
    Ok(out)
}

/// One graph edit's statements, inside the edit's transaction.
pub(super) fn edit(conn: &Connection, e: &GraphEdit, now: i64) -> rusqlite::Result<GraphEdited> {
    let mut done = GraphEdited::default();
    match e {
        GraphEdit::DeleteThread(thread) => {
            done.checkpoints = conn.execute(
                "UPDATE checkpoints SET deleted_ms = ?2 WHERE thread_id = ?1 AND deleted_ms IS NULL",
                params![thread, now],
            )? as u64;
            done.writes = conn.execute(
                "UPDATE checkpoint_writes SET deleted_ms = ?2 WHERE thread_id = ?1 AND deleted_ms IS NULL",
                params![thread, now],
            )? as u64;
        }
        GraphEdit::DeleteRuns(runs) => {
            for run in runs {
                done.writes += conn.execute(
                    "UPDATE checkpoint_writes SET deleted_ms = ?2
                      WHERE deleted_ms IS NULL AND (thread_id, checkpoint_ns, checkpoint_id) IN
                            (SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints WHERE run_id = ?1)",
                    params![run, now],
                )? as u64;
                done.checkpoints += conn.execute(
                    "UPDATE checkpoints SET deleted_ms = ?2 WHERE run_id = ?1 AND deleted_ms IS NULL",
                    params![run, now],
                )? as u64;
            }
        }
        GraphEdit::Prune { threads, keep_latest } => {
            for thread in threads {
                // The newest live checkpoint of each namespace stays, with its writes.
                let keep = "(SELECT MAX(k.checkpoint_id) FROM checkpoints k
                              WHERE k.thread_id = ?1 AND k.checkpoint_ns = t.checkpoint_ns AND k.deleted_ms IS NULL)";
                let (cp_sql, w_sql) = if *keep_latest {
                    (
                        format!(
                            "UPDATE checkpoints AS t SET deleted_ms = ?2
                              WHERE t.thread_id = ?1 AND t.deleted_ms IS NULL AND t.checkpoint_id < {keep}"
                        ),
                        format!(
                            "UPDATE checkpoint_writes AS t SET deleted_ms = ?2
                              WHERE t.thread_id = ?1 AND t.deleted_ms IS NULL
                                AND t.checkpoint_id IS NOT {keep}"
                        ),
                    )
                } else {
                    (
                        "UPDATE checkpoints AS t SET deleted_ms = ?2 WHERE t.thread_id = ?1 AND t.deleted_ms IS NULL".into(),
                        "UPDATE checkpoint_writes AS t SET deleted_ms = ?2 WHERE t.thread_id = ?1 AND t.deleted_ms IS NULL"
                            .into(),
                    )
                };
                // Writes first: the kept checkpoint is read before any is marked.
                done.writes += conn.execute(&w_sql, params![thread, now])? as u64;
                done.checkpoints += conn.execute(&cp_sql, params![thread, now])? as u64;
            }
        }
        GraphEdit::Copy { from, to } => {
            done.checkpoints = conn.execute(
                "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms)
                 SELECT ?2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, ?3
                   FROM checkpoints WHERE thread_id = ?1 AND deleted_ms IS NULL
                 ON CONFLICT(thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
                    parent_checkpoint_id = excluded.parent_checkpoint_id, type = excluded.type,
                    checkpoint = excluded.checkpoint, metadata = excluded.metadata, run_id = excluded.run_id,
                    created_ms = excluded.created_ms, deleted_ms = NULL",
                params![from, to, now],
            )? as u64;
            done.writes = conn.execute(
                "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms)
                 SELECT ?2, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, ?3
                   FROM checkpoint_writes WHERE thread_id = ?1 AND deleted_ms IS NULL
                 ON CONFLICT(thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
                    task_path = excluded.task_path, channel = excluded.channel, type = excluded.type,
                    value = excluded.value, created_ms = excluded.created_ms, deleted_ms = NULL",
                params![from, to, now],
            )? as u64;
        }
    }
    Ok(done)
}

/// `turnsafe prune`: remove for good what LangGraph deletes marked at or
/// before `cutoff_ms`. Returns `(checkpoints, writes)` removed.
pub(super) fn purge_deleted(conn: &Connection, cutoff_ms: i64) -> rusqlite::Result<(u64, u64)> {
    let writes = conn.execute(
        "DELETE FROM checkpoint_writes WHERE deleted_ms IS NOT NULL AND deleted_ms <= ?1",
        [cutoff_ms],
    )? as u64;
    let checkpoints = conn.execute(
        "DELETE FROM checkpoints WHERE deleted_ms IS NOT NULL AND deleted_ms <= ?1",
        [cutoff_ms],
    )? as u64;
    Ok((checkpoints, writes))
}

/// Live and deleted counts, for `doctor`: `(checkpoints, writes, deleted checkpoints, deleted writes)`.
pub fn counts(conn: &Connection) -> rusqlite::Result<(i64, i64, i64, i64)> {
    conn.query_row(
        "SELECT (SELECT count(*) FROM checkpoints WHERE deleted_ms IS NULL),
                (SELECT count(*) FROM checkpoint_writes WHERE deleted_ms IS NULL),
                (SELECT count(*) FROM checkpoints WHERE deleted_ms IS NOT NULL),
                (SELECT count(*) FROM checkpoint_writes WHERE deleted_ms IS NOT NULL)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cp(blob: &[u8], step: i64) -> CheckpointRecord {
        CheckpointRecord {
            thread_id: "t".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: "c1".into(),
            parent_checkpoint_id: None,
            kind: Some("msgpack".into()),
            checkpoint: blob.to_vec(),
            metadata: json!({"step": step}),
        }
    }

    fn wr(value: &[u8]) -> WriteRecord {
        WriteRecord {
            thread_id: "t".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: "c1".into(),
            task_id: "task".into(),
            task_path: String::new(),
            idx: 0,
            channel: "messages".into(),
            kind: None,
            value: value.to_vec(),
        }
    }

    /// A lost COMMIT's lookup takes a key for the batch only when the
    /// whole record's bytes are stored: metadata, value, and not marked.
    #[test]
    fn a_lost_commit_is_resolved_by_the_whole_record() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(TABLES).unwrap();
        write(&conn, &GraphBatch::Checkpoint(cp(b"A", 1)), 1).unwrap();
        write(&conn, &GraphBatch::Writes(vec![wr(b"X")]), 1).unwrap();

        assert!(resolve(&conn, &GraphBatch::Checkpoint(cp(b"A", 1))).unwrap());
        assert!(
            !resolve(&conn, &GraphBatch::Checkpoint(cp(b"A", 2))).unwrap(),
            "other metadata"
        );
        assert!(
            !resolve(&conn, &GraphBatch::Checkpoint(cp(b"B", 1))).unwrap(),
            "another blob"
        );
        assert!(resolve(&conn, &GraphBatch::Writes(vec![wr(b"X")])).unwrap());
        assert!(
            !resolve(&conn, &GraphBatch::Writes(vec![wr(b"Y")])).unwrap(),
            "another value"
        );

        conn.execute("UPDATE checkpoints SET deleted_ms = 2", []).unwrap();
        assert!(!resolve(&conn, &GraphBatch::Checkpoint(cp(b"A", 1))).unwrap(), "marked");
    }
}
