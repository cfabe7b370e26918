//! LangGraph checkpoints and writes on PostgreSQL (schema version 4): the
//! same tables, keys and rules as SQLite's version 6
//! ([`crate::store::graph`]).

use postgres::{Client, GenericClient, Row, Transaction};
use serde_json::Value;

use super::write::Stop;
use crate::backend::Flush;
use crate::graph::{
    CheckpointRecord, GraphBatch, GraphEdit, GraphEdited, GraphLine, GraphQuery, StoredCheckpoint, StoredGraph,
    WriteRecord,
};

pub(super) const TABLES: &str = "
CREATE TABLE IF NOT EXISTS checkpoints(
    thread_id            text NOT NULL,
    checkpoint_ns        text NOT NULL DEFAULT '',
    checkpoint_id        text NOT NULL,
    parent_checkpoint_id text,
    type                 text,
    checkpoint           bytea NOT NULL,
    metadata             text NOT NULL,
    run_id               text,
    created_ms           bigint NOT NULL,
    deleted_ms           bigint,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX IF NOT EXISTS checkpoints_by_run ON checkpoints(run_id) WHERE run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS checkpoint_writes(
    thread_id     text NOT NULL,
    checkpoint_ns text NOT NULL DEFAULT '',
    checkpoint_id text NOT NULL,
    task_id       text NOT NULL,
    idx           bigint NOT NULL,
    task_path     text NOT NULL DEFAULT '',
    channel       text NOT NULL,
    type          text,
    value         bytea NOT NULL,
    created_ms    bigint NOT NULL,
    deleted_ms    bigint,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
";

const PUT_CHECKPOINT: &str = "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, type = EXCLUDED.type,
        checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata, run_id = EXCLUDED.run_id,
        created_ms = EXCLUDED.created_ms, deleted_ms = NULL";

/// Replay's puts of a record it settled ([`crate::settle`]): into a free
/// key, or over the stored row (`_OVER`), at the line's time and marked as
/// the settlement says.
const REPLAY_CHECKPOINT: &str = "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms, deleted_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING";

const REPLAY_CHECKPOINT_OVER: &str = "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms, deleted_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, type = EXCLUDED.type,
        checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata, run_id = EXCLUDED.run_id,
        created_ms = EXCLUDED.created_ms, deleted_ms = EXCLUDED.deleted_ms";

const PUT_WRITE: &str = "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = EXCLUDED.task_path, channel = EXCLUDED.channel, type = EXCLUDED.type,
        value = EXCLUDED.value, created_ms = EXCLUDED.created_ms, deleted_ms = NULL
    WHERE $11 OR checkpoint_writes.deleted_ms IS NOT NULL";

const REPLAY_WRITE: &str = "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms, deleted_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING";

const REPLAY_WRITE_OVER: &str = "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms, deleted_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = EXCLUDED.task_path, channel = EXCLUDED.channel, type = EXCLUDED.type,
        value = EXCLUDED.value, created_ms = EXCLUDED.created_ms, deleted_ms = EXCLUDED.deleted_ms";

fn put_checkpoint(
    c: &mut impl GenericClient,
    sql: &str,
    r: &CheckpointRecord,
    now: i64,
    deleted_ms: Option<Option<i64>>,
) -> Result<u64, postgres::Error> {
    let metadata = r.metadata.to_string();
    let run_id = r.run_id();
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![
        &r.thread_id,
        &r.checkpoint_ns,
        &r.checkpoint_id,
        &r.parent_checkpoint_id,
        &r.kind,
        &r.checkpoint,
        &metadata,
        &run_id,
        &now,
    ];
    // Replay's statements also set `deleted_ms`.
    if let Some(d) = &deleted_ms {
        params.push(d);
    }
    c.execute(sql, &params)
}

/// The last parameter of a write's statement: the flush's replace flag,
/// or replay's `deleted_ms` (and whether it writes over the stored row).
enum WriteMode {
    Flush { replace: bool },
    Replay { deleted_ms: Option<i64>, over: bool },
}

fn put_write(c: &mut impl GenericClient, w: &WriteRecord, now: i64, mode: WriteMode) -> Result<u64, postgres::Error> {
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![
        &w.thread_id,
        &w.checkpoint_ns,
        &w.checkpoint_id,
        &w.task_id,
        &w.idx,
        &w.task_path,
        &w.channel,
        &w.kind,
        &w.value,
        &now,
    ];
    let sql = match &mode {
        WriteMode::Flush { replace } => {
            params.push(replace);
            PUT_WRITE
        }
        WriteMode::Replay { deleted_ms, over } => {
            params.push(deleted_ms);
            if *over { REPLAY_WRITE_OVER } else { REPLAY_WRITE }
        }
    };
    c.execute(sql, &params)
}

fn write_one(tx: &mut Transaction<'_>, graph: &GraphBatch, now: i64) -> Result<(), postgres::Error> {
    match graph {
        GraphBatch::Checkpoint(c) => put_checkpoint(tx, PUT_CHECKPOINT, c, now, None).map(drop),
        GraphBatch::Writes(writes) => {
            let replace = writes.iter().all(WriteRecord::is_special);
            for w in writes {
                put_write(tx, w, now, WriteMode::Flush { replace })?;
            }
            Ok(())
        }
    }
}

/// What the graph batches of one group did: a failure that ended their
/// transaction, or each batch's own.
pub(super) struct GraphWritten {
    pub group: Option<Stop>,
    pub each: Vec<Option<Stop>>,
}

/// Write the graph batches of a group in one transaction, each in its own
/// savepoint, after checking the database's generation.
pub(super) fn write_group(client: &mut Client, batches: &[&Flush<'_>], rules: super::tx::TxRules<'_>) -> GraphWritten {
    let mut each: Vec<Option<Stop>> = batches.iter().map(|_| None).collect();
    let now = crate::ids::now_ms();
    let result = (|| -> Result<(), Stop> {
        let mut tx = client.transaction()?;
        // The generation, and the transaction's `synchronous_commit` set as
        // `SET LOCAL` would, in the first statement (one row always).
        let found: Option<String> = tx
            .query_one(
                concat!(
                    "SELECT (SELECT value FROM state_meta WHERE key = 'generation'), ",
                    super::tx::set_level_sql!(1)
                ),
                &[&rules.sync_level],
            )?
            .get(0);
        if found.as_deref() != Some(rules.generation) {
            return Err(Stop::Replaced(found.unwrap_or_default()));
        }
        for (k, flush) in batches.iter().enumerate() {
            let Some(graph) = flush.graph else { continue };
            let mut sp = tx.savepoint("turnsafe_graph")?;
            match write_one(&mut sp, graph, now) {
                Ok(()) => sp.commit()?,
                // An error of this batch alone (a constraint, say): its
                // savepoint is rolled back, the others go on. A lost
                // connection fails the next statement too, and the group.
                Err(e) if !super::translate::ends_transaction(&e) => {
                    sp.rollback()?;
                    each[k] = Some(Stop::Client(e));
                }
                Err(e) => return Err(Stop::Client(e)),
            }
        }
        crate::failpoint::hit("pg.before_commit");
        tx.commit().map_err(Stop::Commit)?;
        crate::failpoint::hit("pg.after_commit");
        Ok(())
    })();
    GraphWritten {
        group: result.err(),
        each,
    }
}

/// After a lost COMMIT: whether every record of the batch is stored,
/// live, with the batch's own bytes ([`crate::same`]); a key that holds
/// other bytes was not this batch's write.
pub(super) fn resolve(client: &mut Client, graph: &GraphBatch) -> Result<bool, postgres::Error> {
    let lines: Vec<GraphLine> = match graph {
        GraphBatch::Checkpoint(c) => vec![GraphLine::Checkpoint(c.clone())],
        GraphBatch::Writes(writes) => writes.iter().cloned().map(GraphLine::Write).collect(),
    };
    for line in &lines {
        let same =
            stored(client, line, false)?.is_some_and(|s| s.deleted_ms.is_none() && s.record.digest() == line.digest());
        if !same {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The row stored under the record's key, marked or not; `lock` holds it
/// (`FOR UPDATE`) until the transaction ends.
pub(super) fn stored(
    c: &mut impl GenericClient,
    line: &GraphLine,
    lock: bool,
) -> Result<Option<StoredGraph>, postgres::Error> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    Ok(match line {
        GraphLine::Checkpoint(r) => c
            .query_opt(
                &format!(
                    "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, \
                     created_ms, deleted_ms FROM checkpoints \
                     WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3{lock}"
                ),
                &[&r.thread_id, &r.checkpoint_ns, &r.checkpoint_id],
            )?
            .map(|row| {
                let (mut record, created_ms) = checkpoint_of(&row);
                // Metadata that is not JSON is compared as its text, so it
                // can never pass for a line's object.
                let text: String = row.get(6);
                if crate::json_in::value(&text).is_err() {
                    record.metadata = Value::String(text);
                }
                StoredGraph {
                    record: GraphLine::Checkpoint(record),
                    created_ms,
                    deleted_ms: row.get(8),
                }
            }),
        GraphLine::Write(w) => c
            .query_opt(
                &format!(
                    "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value, \
                     created_ms, deleted_ms FROM checkpoint_writes \
                     WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 AND task_id = $4 AND idx = $5{lock}"
                ),
                &[&w.thread_id, &w.checkpoint_ns, &w.checkpoint_id, &w.task_id, &w.idx],
            )?
            .map(|row| StoredGraph {
                record: GraphLine::Write(write_of(&row)),
                created_ms: row.get(9),
                deleted_ms: row.get(10),
            }),
    })
}

fn write_of(w: &Row) -> WriteRecord {
    WriteRecord {
        thread_id: w.get(0),
        checkpoint_ns: w.get(1),
        checkpoint_id: w.get(2),
        task_id: w.get(3),
        task_path: w.get(4),
        idx: w.get(5),
        channel: w.get(6),
        kind: w.get(7),
        value: w.get(8),
    }
}

fn checkpoint_of(r: &Row) -> (CheckpointRecord, i64) {
    let metadata: String = r.get(6);
    (
        CheckpointRecord {
            thread_id: r.get(0),
            checkpoint_ns: r.get(1),
            checkpoint_id: r.get(2),
            parent_checkpoint_id: r.get(3),
            kind: r.get(4),
            checkpoint: r.get(5),
            metadata: crate::json_in::value(&metadata).unwrap_or(Value::Object(Default::default())),
        },
        r.get(7),
    )
}

/// The live checkpoints `q` asks for, newest first, with their live writes.
pub(super) fn read(client: &mut Client, q: &GraphQuery) -> Result<Vec<StoredCheckpoint>, postgres::Error> {
    let rows = client.query(
        "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, created_ms
           FROM checkpoints
          WHERE deleted_ms IS NULL
            AND ($1::text IS NULL OR thread_id = $1)
            AND ($2::text IS NULL OR checkpoint_ns = $2)
            AND ($3::text IS NULL OR checkpoint_id = $3)
            AND ($4::text IS NULL OR checkpoint_id COLLATE \"C\" < $4)
          ORDER BY checkpoint_id COLLATE \"C\" DESC, thread_id, checkpoint_ns",
        &[&q.thread_id, &q.checkpoint_ns, &q.checkpoint_id, &q.before],
    )?;
    let limit = q.limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut out = Vec::new();
    for row in &rows {
        if out.len() >= limit {
            break;
        }
        let (record, created_ms) = checkpoint_of(row);
        if !q.matches(&record.metadata) {
            continue;
        }
        out.push(StoredCheckpoint {
            record,
            writes: Vec::new(),
            created_ms,
        });
    }
    for c in &mut out {
        let r = &c.record;
        c.writes = client
            .query(
                "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
                   FROM checkpoint_writes
                  WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 AND deleted_ms IS NULL
                  ORDER BY task_path COLLATE \"C\", task_id COLLATE \"C\", idx",
                &[&r.thread_id, &r.checkpoint_ns, &r.checkpoint_id],
            )?
            .iter()
            .map(write_of)
            .collect();
    }
    Ok(out)
}

/// One graph edit's statements, inside the edit's transaction.
pub(super) fn edit(tx: &mut Transaction<'_>, e: &GraphEdit, now: i64) -> Result<GraphEdited, postgres::Error> {
    let mut done = GraphEdited::default();
    match e {
        GraphEdit::DeleteThread(thread) => {
            done.checkpoints = tx.execute(
                "UPDATE checkpoints SET deleted_ms = $2 WHERE thread_id = $1 AND deleted_ms IS NULL",
                &[thread, &now],
            )?;
            done.writes = tx.execute(
                "UPDATE checkpoint_writes SET deleted_ms = $2 WHERE thread_id = $1 AND deleted_ms IS NULL",
                &[thread, &now],
            )?;
        }
        GraphEdit::DeleteRuns(runs) => {
            done.writes = tx.execute(
                "UPDATE checkpoint_writes w SET deleted_ms = $2 FROM checkpoints c
                  WHERE w.deleted_ms IS NULL AND c.run_id = ANY($1)
                    AND w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id",
                &[runs, &now],
            )?;
            done.checkpoints = tx.execute(
                "UPDATE checkpoints SET deleted_ms = $2 WHERE run_id = ANY($1) AND deleted_ms IS NULL",
                &[runs, &now],
            )?;
        }
        GraphEdit::Prune { threads, keep_latest } => {
            let (w_sql, cp_sql) = if *keep_latest {
                (
                    "UPDATE checkpoint_writes t SET deleted_ms = $2
                      WHERE t.thread_id = ANY($1) AND t.deleted_ms IS NULL
                        AND t.checkpoint_id IS DISTINCT FROM
                            (SELECT k.checkpoint_id FROM checkpoints k
                              WHERE k.thread_id = t.thread_id AND k.checkpoint_ns = t.checkpoint_ns AND k.deleted_ms IS NULL
                              ORDER BY k.checkpoint_id COLLATE \"C\" DESC LIMIT 1)",
                    "UPDATE checkpoints t SET deleted_ms = $2
                      WHERE t.thread_id = ANY($1) AND t.deleted_ms IS NULL
                        AND t.checkpoint_id IS DISTINCT FROM
                            (SELECT k.checkpoint_id FROM checkpoints k
                              WHERE k.thread_id = t.thread_id AND k.checkpoint_ns = t.checkpoint_ns AND k.deleted_ms IS NULL
                              ORDER BY k.checkpoint_id COLLATE \"C\" DESC LIMIT 1)",
                )
            } else {
                (
                    "UPDATE checkpoint_writes t SET deleted_ms = $2 WHERE t.thread_id = ANY($1) AND t.deleted_ms IS NULL",
                    "UPDATE checkpoints t SET deleted_ms = $2 WHERE t.thread_id = ANY($1) AND t.deleted_ms IS NULL",
                )
            };
            // Writes first: the kept checkpoint is read before any is marked.
            done.writes = tx.execute(w_sql, &[threads, &now])?;
            done.checkpoints = tx.execute(cp_sql, &[threads, &now])?;
        }
        GraphEdit::Copy { from, to } => {
            done.checkpoints = tx.execute(
                "INSERT INTO checkpoints(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, created_ms)
                 SELECT $2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, run_id, $3
                   FROM checkpoints WHERE thread_id = $1 AND deleted_ms IS NULL
                 ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
                    parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, type = EXCLUDED.type,
                    checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata, run_id = EXCLUDED.run_id,
                    created_ms = EXCLUDED.created_ms, deleted_ms = NULL",
                &[from, to, &now],
            )?;
            done.writes = tx.execute(
                "INSERT INTO checkpoint_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, created_ms)
                 SELECT $2, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value, $3
                   FROM checkpoint_writes WHERE thread_id = $1 AND deleted_ms IS NULL
                 ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
                    task_path = EXCLUDED.task_path, channel = EXCLUDED.channel, type = EXCLUDED.type,
                    value = EXCLUDED.value, created_ms = EXCLUDED.created_ms, deleted_ms = NULL",
                &[from, to, &now],
            )?;
        }
    }
    Ok(done)
}

/// Replay's put of a record it settled ([`crate::settle`]): made at
/// `created_ms`, marked at `deleted_ms`; over the stored row when `over`,
/// else only into a free key. `true` when it was written.
pub(super) fn replay_put(
    c: &mut impl GenericClient,
    line: &GraphLine,
    created_ms: i64,
    deleted_ms: Option<i64>,
    over: bool,
) -> Result<bool, postgres::Error> {
    let n = match line {
        GraphLine::Checkpoint(r) => {
            let sql = if over {
                REPLAY_CHECKPOINT_OVER
            } else {
                REPLAY_CHECKPOINT
            };
            put_checkpoint(c, sql, r, created_ms, Some(deleted_ms))?
        }
        GraphLine::Write(w) => put_write(c, w, created_ms, WriteMode::Replay { deleted_ms, over })?,
    };
    Ok(n == 1)
}

/// `turnsafe prune`: remove what LangGraph deletes marked at or before
/// `cutoff_ms`. Returns `(checkpoints, writes)`.
pub(super) fn purge_deleted(tx: &mut Transaction<'_>, cutoff_ms: i64) -> Result<(u64, u64), postgres::Error> {
    let writes = tx.execute(
        "DELETE FROM checkpoint_writes WHERE deleted_ms IS NOT NULL AND deleted_ms <= $1",
        &[&cutoff_ms],
    )?;
    let checkpoints = tx.execute(
        "DELETE FROM checkpoints WHERE deleted_ms IS NOT NULL AND deleted_ms <= $1",
        &[&cutoff_ms],
    )?;
    Ok((checkpoints, writes))
}
