//! The schema and its migrations. `PRAGMA user_version` is the schema
//! version; each migration runs in its own immediate transaction.
//!
//! **Version 2** takes the full-text index off the commit path. A commit
//! writes only the messages; the index catches up afterwards
//! ([`super::index`]) and `state_meta.fts_watermark` holds the highest
//! `messages.id` it covers. Every row at or below the watermark is in the
//! index; every row above it is not yet.
//!
//! The watermark stays true because ids are never reused below it. Rows
//! are never deleted on the commit path, and the `messages_fts_unindex`
//! trigger keeps the rule for any delete: it removes an indexed row from
//! the index first (external-content FTS5 needs the old values for that),
//! then lowers the watermark to the highest id left, so the id SQLite
//! hands out next (one past the highest) is always above the watermark.
//! This costs nothing per commit, unlike `AUTOINCREMENT`, which rewrites
//! `sqlite_sequence` in every transaction.
//!
//! `state_meta.fts_enabled` is `1` while the index is kept and `0` once it
//! is marked for rebuild (damaged, or never complete); [`rebuild_fts`]
//! rebuilds it from the messages and sets the watermark to the highest id.
//!
//! **Version 3** stores messages of any shape. `item` is the object exactly
//! as it was written (any JSON object: a tool call or a reasoning item has
//! no `role`); `role` and `content` (a text projection of the object's
//! `content`, which is what the index holds) are kept when present and may
//! be NULL. Versions 1 and 2 kept `role`, `content` (text, or JSON text
//! with `content_json`) and the other fields in `extra`.
//!
//! **Version 4** keeps what edits replace. `archive` holds every row a
//! `pop`, `clear`, compaction, rewind or prune took out of the transcript,
//! with its uid, seq and object as they were, when (`archived_ms`), why
//! (`reason`), who held the session's lease (`holder`) and which edit it
//! was (`edit`, one id per edit). A uid is active at most once (the
//! `messages` key) and may sit in the archive any number of times.
//! `sessions` gains its lineage: `forked_from` and `forked_at_seq`.
//!
//! **Version 5** keeps where an imported session came from. `session_meta`
//! holds one row per session an import wrote (`turnsafe import hermes`):
//! the runtime it came from (`origin`, e.g. `hermes`), its id there
//! (`origin_id`), that runtime's session record as a JSON object (`meta`:
//! title, source, lineage, model, token counts...) and when it was first
//! imported (`imported_ms`). Nothing that is stored moves.
//!
//! **Version 6** keeps LangGraph's state (`turnsafe_store.langgraph`):
//! `checkpoints` (one row per `(thread_id, checkpoint_ns, checkpoint_id)`:
//! the serializer's type tag and blob, the metadata as JSON text, its
//! `run_id`) and `checkpoint_writes` (one row per `(thread_id,
//! checkpoint_ns, checkpoint_id, task_id, idx)`), each with `created_ms`
//! and `deleted_ms` (a LangGraph delete or prune marks; `turnsafe prune`
//! removes). Nothing that is stored moves.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};

use crate::rows;

/// Current schema version.
pub const VERSION: i64 = 6;

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS state_meta(
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions(
    id               TEXT PRIMARY KEY,
    created_ms       INTEGER NOT NULL,
    lease_token      TEXT,
    lease_holder     TEXT,
    lease_expires_ms INTEGER,
    forked_from      TEXT,
    forked_at_seq    INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages(
    id           INTEGER PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions(id),
    uid          TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    role         TEXT,
    content      TEXT,
    item         TEXT NOT NULL,
    created_ms   INTEGER NOT NULL,
    UNIQUE(session_id, uid)
);
CREATE INDEX IF NOT EXISTS messages_by_seq ON messages(session_id, seq);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages', content_rowid='id'
);
";

/// Version 4's archive: what edits took out of a transcript.
const ARCHIVE: &str = "
CREATE TABLE IF NOT EXISTS archive(
    id           INTEGER PRIMARY KEY,
    session_id   TEXT NOT NULL,
    uid          TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    role         TEXT,
    content      TEXT,
    item         TEXT NOT NULL,
    created_ms   INTEGER NOT NULL,
    archived_ms  INTEGER NOT NULL,
    reason       TEXT NOT NULL,
    holder       TEXT,
    edit         TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS archive_by_session ON archive(session_id, archived_ms);
";

/// Version 5's record of imported sessions.
const SESSION_META: &str = "
CREATE TABLE IF NOT EXISTS session_meta(
    session_id   TEXT PRIMARY KEY,
    origin       TEXT NOT NULL,
    origin_id    TEXT NOT NULL,
    meta         TEXT NOT NULL,
    imported_ms  INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Version 2's triggers: nothing runs on insert; a delete or a content
/// change of an indexed row keeps the index and the watermark true.
const V2_TRIGGERS: &str = "
DROP TRIGGER IF EXISTS messages_fts_insert;
CREATE TRIGGER IF NOT EXISTS messages_fts_unindex AFTER DELETE ON messages
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content)
    SELECT 'delete', old.id, old.content
    WHERE (SELECT value FROM state_meta WHERE key = 'fts_enabled') = '1'
      AND old.id <= (SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_watermark');
    UPDATE state_meta
       SET value = CAST(MIN(CAST(value AS INTEGER), COALESCE((SELECT MAX(id) FROM messages), 0)) AS TEXT)
     WHERE key = 'fts_watermark';
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_reindex AFTER UPDATE OF content ON messages
WHEN (SELECT value FROM state_meta WHERE key = 'fts_enabled') = '1'
 AND old.id <= (SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_watermark')
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
";

/// Version 4's lineage of each session.
const V4_LINEAGE: &str = "
ALTER TABLE sessions ADD COLUMN forked_from TEXT;
ALTER TABLE sessions ADD COLUMN forked_at_seq INTEGER;
";

/// What a new database is created with, in this order, before its
/// generation is stamped: each entry one batch of statements. The
/// JavaScript host runs these very strings (its build writes them into
/// `js/gen/schema.json` through `turnsafe schema`).
pub const CREATE: [&str; 5] = [TABLES, ARCHIVE, SESSION_META, super::graph::TABLES, V2_TRIGGERS];

/// The migrations that only add (nothing that is stored moves), as
/// `(from, batches)`: each takes version `from` to `from + 1`, in order.
/// Versions 1 and 2 move rows, so only this binary migrates them.
pub const ADDING_STEPS: [(i64, &[&str]); 3] = [
    (3, &[V4_LINEAGE, ARCHIVE]),
    (4, &[SESSION_META]),
    (5, &[super::graph::TABLES]),
];

/// Run the adding migration from version `from` (one of [`ADDING_STEPS`]).
fn add_step(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    for (_, batches) in ADDING_STEPS.iter().filter(|(f, _)| *f == from) {
        for batch in *batches {
            conn.execute_batch(batch)?;
        }
    }
    Ok(())
}

/// A database written by a newer turnsafe. Nothing may write to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "state.db has schema version {found}, newer than this turnsafe knows ({VERSION}); \
     use a newer turnsafe (nothing was written)"
)]
pub struct NewerSchema {
    pub found: i64,
}

const NEWER_PREFIX: &str = "state.db has schema version ";

impl NewerSchema {
    /// As an SQLite-shaped error (`SQLITE_ERROR`), for callers that speak
    /// rusqlite; [`NewerSchema::of`] reads it back.
    pub fn to_sqlite(self) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(self.to_string()),
        )
    }

    /// The refusal inside an error made by [`NewerSchema::to_sqlite`].
    pub fn of(e: &rusqlite::Error) -> Option<NewerSchema> {
        match e {
            rusqlite::Error::SqliteFailure(f, Some(msg)) if f.extended_code == rusqlite::ffi::SQLITE_ERROR => {
                let rest = msg.strip_prefix(NEWER_PREFIX)?;
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let found = digits.parse().ok()?;
                (found > VERSION && *msg == (NewerSchema { found }).to_string()).then_some(NewerSchema { found })
            }
            _ => None,
        }
    }
}

/// The schema version of the database at `db`, read without writing
/// anything (no sidecar is created): from the header when there is no
/// WAL content, through a read-only connection otherwise. `None` when
/// there is no file or it is not a database (the caller's open reports
/// that in its own terms).
pub fn version_at(db: &Path) -> Option<i64> {
    use std::io::Read;
    let wal = crate::guard::path_of(db, crate::guard::Part::Wal);
    let wal_has_frames = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 32);
    if wal_has_frames {
        let c = Connection::open_with_flags(
            db,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .ok()?;
        return c.query_row("PRAGMA user_version", [], |r| r.get(0)).ok();
    }
    let mut header = [0u8; 100];
    std::fs::File::open(db).ok()?.read_exact(&mut header).ok()?;
    if &header[..16] != b"SQLite format 3\0" {
        return None;
    }
    Some(i64::from(i32::from_be_bytes([
        header[60], header[61], header[62], header[63],
    ])))
}

/// Refuse a database newer than this binary, before anything writes to it.
pub fn check_not_newer(db: &Path) -> Result<(), NewerSchema> {
    match version_at(db) {
        Some(found) if found > VERSION => Err(NewerSchema { found }),
        _ => Ok(()),
    }
}

/// Whether the full-text index is being kept (`state_meta.fts_enabled`).
pub fn fts_enabled(conn: &Connection) -> rusqlite::Result<bool> {
    Ok(meta(conn, "fts_enabled")?.as_deref() == Some("1"))
}

/// The highest `messages.id` the index covers (0 when none).
pub fn fts_watermark(conn: &Connection) -> rusqlite::Result<i64> {
    Ok(meta(conn, "fts_watermark")?.and_then(|v| v.parse().ok()).unwrap_or(0))
}

fn meta(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT value FROM state_meta WHERE key = ?1")?
        .query_row([key], |r| r.get(0))
        .optional()
}

/// Mark the full-text index for rebuild (inside the caller's transaction):
/// search stops trusting it until [`rebuild_fts`] runs.
pub fn disable_fts(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute("UPDATE state_meta SET value = '0' WHERE key = 'fts_enabled'", [])
        .map(|_| ())
}

/// Rebuild the full-text index from the messages, switch it back on and
/// move the watermark to the highest id, in one immediate transaction.
pub fn rebuild_fts(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
         UPDATE state_meta SET value = '1' WHERE key = 'fts_enabled';
         INSERT OR REPLACE INTO state_meta(key, value)
             VALUES ('fts_watermark', CAST((SELECT COALESCE(MAX(id), 0) FROM messages) AS TEXT));
         COMMIT;",
    )
    .inspect_err(|_| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
    })
}

/// Bring the schema to [`VERSION`]. `generation` is stamped into
/// `state_meta` when the database is new. A database newer than
/// [`VERSION`] is refused before anything is written.
pub fn migrate(conn: &Connection, generation: i32) -> rusqlite::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > VERSION {
        return Err(NewerSchema { found: version }.to_sqlite());
    }
    if version == VERSION {
        return Ok(());
    }
    // No auto-vacuum at creation: it costs every commit the pointer-map
    // page (9.5 WAL frames per 10-message batch instead of 7.3). The first
    // `turnsafe prune` that frees pages switches the file to incremental
    // vacuum, once, as it does for a database made before version 4.
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        // Re-read under the write lock: another process may have migrated.
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > VERSION {
            return Err(NewerSchema { found: version }.to_sqlite());
        }
        if version == VERSION {
            return Ok(());
        }
        if version == 0 {
            create(conn, generation)?;
        } else {
            if version < 2 {
                v1_to_v2(conn)?;
            }
            if version < 3 {
                v2_to_v3(conn)?;
            }
            if version < 4 {
                v3_to_v4(conn)?;
            }
            if version < 5 {
                v4_to_v5(conn)?;
            }
            v5_to_v6(conn)?;
        }
        conn.execute(
            "INSERT OR REPLACE INTO state_meta(key, value) VALUES ('schema_version', ?1)",
            [VERSION.to_string()],
        )?;
        conn.execute_batch(&format!("PRAGMA user_version = {VERSION}"))
    })();
    // A COMMIT refused for the lock (a new file is still in rollback mode,
    // where committing waits for every reader to finish) leaves the
    // transaction open, holding a lock that keeps every other writer out:
    // roll back whatever is still open, so the open can be tried again.
    match result.and_then(|()| conn.execute_batch("COMMIT")) {
        Ok(()) => Ok(()),
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Err(e)
        }
    }
}

/// A new database, straight at the current version.
fn create(conn: &Connection, generation: i32) -> rusqlite::Result<()> {
    for batch in CREATE {
        conn.execute_batch(batch)?;
    }
    // The generation also lives in the header (application_id, bytes
    // 68-71), written before the switch to WAL so the main file has it.
    conn.execute_batch(&format!("PRAGMA application_id = {generation}"))?;
    conn.execute(
        "INSERT OR IGNORE INTO state_meta(key, value) \
         VALUES ('generation', ?1), ('fts_enabled', '1'), ('fts_watermark', '0')",
        params![generation.to_string()],
    )?;
    Ok(())
}

/// Version 1 kept the index with an `AFTER INSERT` trigger, so an index
/// that was on (`fts_enabled = 1`) covers every row: the watermark starts
/// at the highest id. An index that was off (degraded) stays marked for
/// rebuild, with the watermark at 0.
fn v1_to_v2(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(V2_TRIGGERS)?;
    let complete = fts_enabled(conn)?;
    if !complete {
        conn.execute(
            "INSERT OR REPLACE INTO state_meta(key, value) VALUES ('fts_enabled', '0')",
            [],
        )?;
    }
    conn.execute(
        "INSERT OR REPLACE INTO state_meta(key, value) VALUES ('fts_watermark', \
         CASE WHEN ?1 THEN CAST((SELECT COALESCE(MAX(id), 0) FROM messages) AS TEXT) ELSE '0' END)",
        [complete],
    )?;
    Ok(())
}

/// Version 3's `messages`, built beside the old one and renamed over it.
const V3_MESSAGES: &str = "
CREATE TABLE messages_v3(
    id           INTEGER PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions(id),
    uid          TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    role         TEXT,
    content      TEXT,
    item         TEXT NOT NULL,
    created_ms   INTEGER NOT NULL,
    UNIQUE(session_id, uid)
);
";

const V3_SWAP: &str = "
DROP TABLE messages;
ALTER TABLE messages_v3 RENAME TO messages;
CREATE INDEX messages_by_seq ON messages(session_id, seq);
";

/// Version 2 -> 3: every row's object rebuilt from its pieces (`extra`
/// with `role` and `content` put back), with its id, uid, seq and time;
/// `content` becomes the text projection. Where that changes what the
/// index holds (content that was JSON), the index is rebuilt when it was
/// complete, and stays marked for rebuild when it was not; the watermark
/// keeps its meaning.
fn v2_to_v3(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(V3_MESSAGES)?;
    let mut reindex = false;
    {
        let mut read = conn.prepare(
            "SELECT id, session_id, uid, seq, created_ms, role, content, content_json, extra FROM messages ORDER BY id",
        )?;
        let mut write = conn.prepare(
            "INSERT INTO messages_v3(id, session_id, uid, seq, role, content, item, created_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        let mut found = read.query([])?;
        while let Some(r) = found.next()? {
            let old_content: String = r.get(6)?;
            let item = rows::read_item(r, 5, false)?;
            let (role, content) = rows::projection(&item);
            reindex |= content.as_deref() != Some(old_content.as_str());
            write.execute(params![
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                role,
                content,
                serde_json::Value::Object(item).to_string(),
                r.get::<_, i64>(4)?
            ])?;
        }
    }
    // DROP TABLE fires no delete trigger: the index is left as it was.
    conn.execute_batch(V3_SWAP)?;
    conn.execute_batch(V2_TRIGGERS)?;
    if reindex && fts_enabled(conn)? {
        conn.execute_batch(
            "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
             INSERT OR REPLACE INTO state_meta(key, value)
                 VALUES ('fts_watermark', CAST((SELECT COALESCE(MAX(id), 0) FROM messages) AS TEXT));",
        )?;
    }
    Ok(())
}

/// Version 3 -> 4: the archive, and each session's lineage. Nothing that
/// is stored moves.
fn v3_to_v4(conn: &Connection) -> rusqlite::Result<()> {
    add_step(conn, 3)
}

/// Version 4 -> 5: the record of imported sessions. Nothing that is stored
/// moves.
fn v4_to_v5(conn: &Connection) -> rusqlite::Result<()> {
    add_step(conn, 4)
}

/// Version 5 -> 6: LangGraph's checkpoints and writes. Nothing that is
/// stored moves.
fn v5_to_v6(conn: &Connection) -> rusqlite::Result<()> {
    add_step(conn, 5)
}
