//! The full-text index catches up after commits, off the flush's path.
//!
//! A flush commits only the messages. [`catch_up`] then adds the rows past
//! `state_meta.fts_watermark` to the index, in chunks of [`CHUNK_ROWS`],
//! one immediate transaction each, and moves the watermark with them. It
//! runs when `turnsafe search` starts, when `turnsafe append` has been
//! idle for a while, and after a replay, never inside a flush.
//!
//! An index failure never fails a turn: the turn is already committed. A
//! failure is classified by the policy like any other write (the index's
//! statements carry `fts_scope`): a lock is retried within the policy's
//! patience; `fts_index` (a damaged index) marks the index for rebuild, so
//! search stops trusting it; anything else leaves the rows past the
//! watermark, and search scans them without the index.

use std::time::{Duration, Instant};

use rusqlite::Connection;
use turnsafe_policy::machine::background::{self, IndexNext};
use turnsafe_policy::{Cause, Evidence, Observation, Operation};

use super::{SessionStore, schema};
use crate::guard::{Guard, Verdict};
use crate::observe;

/// Rows indexed per transaction. A chunk holds the write lock for a few
/// milliseconds, within a concurrent flush's busy timeout.
pub const CHUNK_ROWS: u64 = 128;

/// What a catch-up did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatchUp {
    /// Rows added to the index by this call.
    pub indexed: u64,
    /// The watermark afterwards: every row at or below it is indexed.
    pub watermark: i64,
    /// Committed rows still past the watermark.
    pub pending: u64,
}

/// Why the index is not (or not fully) up to date. The rows past the
/// watermark are committed all the same.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Marked for rebuild before this call: damaged earlier, or never complete.
    #[error("the search index is marked for rebuild")]
    NeedsRebuild,
    /// Found damaged now (`fts_index`), and marked for rebuild if that could be written.
    #[error("the search index is damaged ({source}){}", if *.marked { "; marked for rebuild" } else { "" })]
    Damaged {
        source: rusqlite::Error,
        /// What the policy was shown.
        observation: Box<Observation>,
        /// Whether the rebuild mark was committed.
        marked: bool,
    },
    /// The index could not be written: the policy's cause and SQLite's error.
    #[error("the search index could not be written ({}): {source}", .cause.label())]
    CannotWrite {
        cause: Cause,
        source: rusqlite::Error,
        /// What the policy was shown.
        observation: Box<Observation>,
    },
    /// The file under the handle is not the one it opened: nothing is written through it.
    #[error("not indexing: {0}")]
    Generation(String),
    /// The handle has no open database, or a sticky cause keeps it off the database.
    #[error("not indexing: the store is not open for writing")]
    Unavailable,
}

impl IndexError {
    /// The policy's cause, where there is one.
    pub fn cause(&self) -> Option<Cause> {
        match self {
            IndexError::NeedsRebuild | IndexError::Damaged { .. } => Some(Cause::FtsIndex),
            IndexError::CannotWrite { cause, .. } => Some(*cause),
            IndexError::Generation(_) | IndexError::Unavailable => None,
        }
    }
    /// Whether the index itself is damaged (as opposed to unwritable now).
    pub fn is_damage(&self) -> bool {
        matches!(self, IndexError::NeedsRebuild | IndexError::Damaged { .. })
    }
}

/// Where the index stands, read without writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexState {
    /// `fts_enabled`: false once marked for rebuild.
    pub enabled: bool,
    /// Every row at or below it is indexed (when enabled).
    pub watermark: i64,
    /// The highest committed id.
    pub max_id: i64,
}

/// Read the index's state. A version 1 database (not migrated, e.g. on a
/// read-only home) kept its index with a trigger: when it was on, it covers
/// every row.
pub fn state(conn: &Connection) -> rusqlite::Result<IndexState> {
    let enabled = schema::fts_enabled(conn)?;
    let max_id: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM messages")?
        .query_row([], |r| r.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let watermark = if version < 2 {
        if enabled { max_id } else { 0 }
    } else {
        schema::fts_watermark(conn)?
    };
    Ok(IndexState {
        enabled,
        watermark,
        max_id,
    })
}

/// Committed rows past the watermark (in one session, or all).
pub fn pending(conn: &Connection, watermark: i64, session: Option<&str>) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM messages WHERE id > ?1 AND (?2 IS NULL OR session_id = ?2)")?
        .query_row(rusqlite::params![watermark, session], |r| r.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
}

/// Index committed rows past the watermark: all of them, or at most
/// `max_rows`. With a guard, each chunk first checks, under
/// the write lock, that the file is still the one the guard recorded.
/// Nothing is written when nothing is pending, so a read-only home with an
/// up-to-date index never fails here.
pub fn catch_up(
    conn: &Connection,
    mut guard: Option<&mut Guard>,
    max_rows: Option<u64>,
) -> Result<CatchUp, IndexError> {
    let seed = crate::ids::seed();
    let mut out = CatchUp::default();
    let mut attempt = 0u32;
    let mut started = Instant::now();
    loop {
        let st = match state(conn) {
            Ok(st) => st,
            Err(e) => {
                // A failed read is not waited out: the catch-up stops here.
                let (cause, next, obs) = decide(conn, &e, false, 1, 0, seed);
                return Err(settle(conn, e, cause, next, obs));
            }
        };
        out.watermark = st.watermark;
        if !st.enabled {
            return Err(IndexError::NeedsRebuild);
        }
        if st.max_id <= st.watermark || max_rows.is_some_and(|m| out.indexed >= m) {
            out.pending = pending(conn, st.watermark, None).unwrap_or(0);
            return Ok(out);
        }
        attempt += 1;
        let rows = max_rows.map_or(CHUNK_ROWS, |m| (m - out.indexed).min(CHUNK_ROWS));
        match index_chunk(conn, guard.as_deref_mut(), rows) {
            Ok(Chunk::Indexed { rows, watermark }) => {
                out.indexed += rows;
                out.watermark = watermark;
                attempt = 0;
                started = Instant::now();
            }
            Ok(Chunk::Disabled) => return Err(IndexError::NeedsRebuild),
            Err(ChunkError::Generation(detail)) => return Err(IndexError::Generation(detail)),
            Err(ChunkError::Sqlite { error, in_index }) => {
                let (cause, next, obs) = decide(
                    conn,
                    &error,
                    in_index,
                    attempt,
                    started.elapsed().as_millis() as u64,
                    seed,
                );
                match next {
                    IndexNext::Wait { ms } => std::thread::sleep(Duration::from_millis(ms)),
                    IndexNext::MarkForRebuild | IndexNext::Stop { .. } => {
                        return Err(settle(conn, error, cause, next, obs));
                    }
                }
            }
        }
    }
}

/// Ask the policy what a failed index write means, and what to do next. The catch-up is the
/// deferred half of a batch's write, so it is observed as `append_batch`;
/// a statement that writes only the index carries `fts_scope`.
fn decide(
    conn: &Connection,
    error: &rusqlite::Error,
    in_index: bool,
    attempt: u32,
    elapsed_ms: u64,
    seed: u64,
) -> (Cause, IndexNext, Observation) {
    let evidence = if in_index { vec![Evidence::FtsScope] } else { Vec::new() };
    let obs = observe::observation(
        Operation::AppendBatch,
        error,
        observe::system_errno(conn),
        evidence,
        attempt.max(1),
        elapsed_ms,
        seed,
    );
    let cause = turnsafe_policy::decide(&obs).classification.cause;
    let next = background::after_index_failure(&obs);
    tracing::info!(
        attempt,
        code = ?obs.extended_code,
        cause = cause.label(),
        next = ?next,
        "search index catch-up failed"
    );
    (cause, next, obs)
}

/// A failure the catch-up stops at: it marks the index for rebuild when
/// the policy's step says so.
fn settle(
    conn: &Connection,
    error: rusqlite::Error,
    cause: Cause,
    next: IndexNext,
    observation: Observation,
) -> IndexError {
    let observation = Box::new(observation);
    if next == IndexNext::MarkForRebuild {
        let marked = mark_for_rebuild(conn).is_ok();
        tracing::warn!(marked, "search index damaged; marked for rebuild");
        return IndexError::Damaged {
            source: error,
            observation,
            marked,
        };
    }
    IndexError::CannotWrite {
        cause,
        source: error,
        observation,
    }
}

/// Mark the index for rebuild, in its own transaction.
pub fn mark_for_rebuild(conn: &Connection) -> rusqlite::Result<()> {
    in_immediate(conn, || schema::disable_fts(conn))
}

fn in_immediate<T>(conn: &Connection, f: impl FnOnce() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let r = f().and_then(|v| conn.execute_batch("COMMIT").map(|()| v));
    if r.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    r
}

enum Chunk {
    Indexed {
        rows: u64,
        watermark: i64,
    },
    /// The index was marked for rebuild meanwhile.
    Disabled,
}

enum ChunkError {
    Generation(String),
    Sqlite {
        error: rusqlite::Error,
        /// The failing statement writes only the index.
        in_index: bool,
    },
}

impl From<rusqlite::Error> for ChunkError {
    fn from(error: rusqlite::Error) -> Self {
        ChunkError::Sqlite { error, in_index: false }
    }
}

fn in_index(error: rusqlite::Error) -> ChunkError {
    ChunkError::Sqlite { error, in_index: true }
}

/// Index the next `rows` rows past the watermark in one transaction.
fn index_chunk(conn: &Connection, guard: Option<&mut Guard>, rows: u64) -> Result<Chunk, ChunkError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| -> Result<Chunk, ChunkError> {
        if let Some(g) = guard {
            match g.check(conn) {
                Ok(Verdict::Intact) => {}
                Ok(Verdict::Mismatch { detail, .. }) => return Err(ChunkError::Generation(detail)),
                Err(e) => return Err(ChunkError::Generation(e.to_string())),
            }
        }
        // Re-read under the write lock: another process may have moved on.
        if !schema::fts_enabled(conn)? {
            return Ok(Chunk::Disabled);
        }
        let from = schema::fts_watermark(conn)?;
        let upto: Option<i64> = conn
            .prepare_cached("SELECT MAX(id) FROM (SELECT id FROM messages WHERE id > ?1 ORDER BY id LIMIT ?2)")?
            .query_row(rusqlite::params![from, rows as i64], |r| r.get(0))?;
        let Some(upto) = upto else {
            return Ok(Chunk::Indexed {
                rows: 0,
                watermark: from,
            });
        };
        let n = conn
            .prepare_cached(
                "INSERT INTO messages_fts(rowid, content) SELECT id, content FROM messages WHERE id > ?1 AND id <= ?2",
            )?
            .execute([from, upto])
            .map_err(in_index)?;
        conn.prepare_cached("INSERT OR REPLACE INTO state_meta(key, value) VALUES ('fts_watermark', ?1)")?
            .execute([upto.to_string()])?;
        // FTS5 flushes its pending terms at COMMIT: a failure there is the index's.
        conn.execute_batch("COMMIT").map_err(in_index)?;
        Ok(Chunk::Indexed {
            rows: n as u64,
            watermark: upto,
        })
    })();
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

impl SessionStore {
    /// Bring the search index up to date through this handle, after its
    /// commits: all pending rows, or at most `max_rows`. The guard checks the
    /// file under the write lock first. A sticky handle never touches the
    /// database, so it does not index either.
    pub fn catch_up_index(&mut self, max_rows: Option<u64>) -> Result<CatchUp, IndexError> {
        if self.sticky().is_some() || self.opts.read_only {
            return Err(IndexError::Unavailable);
        }
        let Some(conn) = self.conn.as_ref() else {
            return Err(IndexError::Unavailable);
        };
        catch_up(conn, self.guard.as_mut(), max_rows)
    }
}
