//! The schema and its migrations. `PRAGMA user_version` is the schema
//! version; each migration runs in its own immediate transaction.

use rusqlite::{Connection, params};

/// Current schema version.
pub const VERSION: i64 = 1;

const V1: &str = "
CREATE TABLE IF NOT EXISTS state_meta(
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions(
    id               TEXT PRIMARY KEY,
    created_ms       INTEGER NOT NULL,
    lease_token      TEXT,
    lease_holder     TEXT,
    lease_expires_ms INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages(
    id           INTEGER PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions(id),
    uid          TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    role         TEXT NOT NULL,
    content      TEXT NOT NULL,
    content_json INTEGER NOT NULL DEFAULT 0,
    extra        TEXT NOT NULL DEFAULT '{}',
    created_ms   INTEGER NOT NULL,
    UNIQUE(session_id, uid)
);
CREATE INDEX IF NOT EXISTS messages_by_seq ON messages(session_id, seq);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages', content_rowid='id'
);
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages
WHEN (SELECT value FROM state_meta WHERE key = 'fts_enabled') = '1'
BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
";

/// Whether the full-text index is being kept (`state_meta.fts_enabled`).
pub fn fts_enabled(conn: &Connection) -> rusqlite::Result<bool> {
    use rusqlite::OptionalExtension;
    let v: Option<String> = conn
        .query_row("SELECT value FROM state_meta WHERE key = 'fts_enabled'", [], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.as_deref() == Some("1"))
}

/// Stop keeping the full-text index (inside the caller's transaction):
/// the trigger skips it until [`rebuild_fts`] runs.
pub fn disable_fts(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute("UPDATE state_meta SET value = '0' WHERE key = 'fts_enabled'", [])
        .map(|_| ())
}

/// Rebuild the full-text index from the messages and switch it back on,
/// in one immediate transaction.
pub fn rebuild_fts(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
         UPDATE state_meta SET value = '1' WHERE key = 'fts_enabled';
         COMMIT;",
    )
    .inspect_err(|_| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
    })
}

/// Bring the schema to [`VERSION`]. `generation` is stamped into
/// `state_meta` when the database is new.
pub fn migrate(conn: &Connection, generation: i32) -> rusqlite::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version >= VERSION {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        // Re-read under the write lock: another process may have migrated.
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version >= VERSION {
            return Ok(());
        }
        conn.execute_batch(V1)?;
        // The generation also lives in the header (application_id, bytes
        // 68-71), written before the switch to WAL so the main file has it.
        conn.execute_batch(&format!("PRAGMA application_id = {generation}"))?;
        conn.execute(
            "INSERT OR IGNORE INTO state_meta(key, value) VALUES ('generation', ?1), ('fts_enabled', '1'), ('schema_version', ?2)",
            params![generation.to_string(), VERSION.to_string()],
        )?;
        conn.execute_batch(&format!("PRAGMA user_version = {VERSION}"))
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Err(e)
        }
    }
}
