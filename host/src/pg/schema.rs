//! The PostgreSQL schema, mirroring SQLite's: `state_meta` (schema
//! version, generation), `sessions` with the turn lease, `messages` with a
//! uid unique per session and a `seq`, and a `tsvector` search index in a
//! table of its own that no commit touches (`search` brings it up to date).
//!
//! Migrations run in one transaction under a transaction-scoped advisory
//! lock, so two writers starting together migrate once; DDL is
//! transactional in PostgreSQL, so a failed migration leaves nothing.
//!
//! Version 2 stores messages of any shape, as SQLite's version 3 does:
//! `item` is the object exactly as written; `role` and `content` (the text
//! projection search indexes) are kept when present and may be NULL.
//!
//! Version 3 keeps what edits replace, as SQLite's version 4 does: the
//! `archive` table, and each session's lineage (`forked_from`,
//! `forked_at_seq`).
//!
//! Version 4 keeps LangGraph's state, as SQLite's version 6 does:
//! `checkpoints` and `checkpoint_writes` (`super::graph`).
//!
//! Version 5 keeps where an imported session came from, as SQLite's
//! version 5 does: `session_meta` (`turnsafe import hermes --db`).

use postgres::{Client, Transaction};

/// Current schema version (`state_meta.schema_version`).
pub const VERSION: i64 = 5;

/// The advisory lock key migrations take ("turnsafe" in ASCII).
pub const MIGRATION_LOCK: i64 = 0x7475_726e_7361_6665;

const V1: &str = "
CREATE TABLE IF NOT EXISTS state_meta(
    key   text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions(
    id               text PRIMARY KEY,
    created_ms       bigint NOT NULL,
    lease_token      text,
    lease_holder     text,
    lease_expires_ms bigint
);
CREATE TABLE IF NOT EXISTS messages(
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id   text NOT NULL REFERENCES sessions(id),
    uid          text NOT NULL,
    seq          bigint NOT NULL,
    role         text NOT NULL,
    content      text NOT NULL,
    content_json boolean NOT NULL DEFAULT false,
    extra        text NOT NULL DEFAULT '{}',
    created_ms   bigint NOT NULL,
    UNIQUE(session_id, uid)
);
CREATE INDEX IF NOT EXISTS messages_by_seq ON messages(session_id, seq);
CREATE TABLE IF NOT EXISTS messages_search(
    message_id bigint PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    tsv        tsvector NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_search_tsv ON messages_search USING gin(tsv);
";

/// Version 3: the archive, and each session's lineage.
const V3: &str = "
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS forked_from text;
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS forked_at_seq bigint;
CREATE TABLE IF NOT EXISTS archive(
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id   text NOT NULL,
    uid          text NOT NULL,
    seq          bigint NOT NULL,
    role         text,
    content      text,
    item         text NOT NULL,
    created_ms   bigint NOT NULL,
    archived_ms  bigint NOT NULL,
    reason       text NOT NULL,
    holder       text,
    edit         text NOT NULL
);
CREATE INDEX IF NOT EXISTS archive_by_session ON archive(session_id, archived_ms);
";

/// Version 5: each imported session's origin and record.
const V5: &str = "
CREATE TABLE IF NOT EXISTS session_meta(
    session_id   text PRIMARY KEY,
    origin       text NOT NULL,
    origin_id    text NOT NULL,
    meta         text NOT NULL,
    imported_ms  bigint NOT NULL
);
";

/// What [`migrate`] found or made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Migrated {
    /// The schema is at [`VERSION`]; the database's generation id.
    Ready { generation: String },
    /// A newer turnsafe wrote this database; nothing was changed.
    Newer { found: i64 },
}

/// Bring the schema to [`VERSION`] and return the database's generation.
pub fn migrate(client: &mut Client) -> Result<Migrated, postgres::Error> {
    // Most opens find the schema current: read it without the lock, so
    // writers starting together do not queue on it.
    if let Some(ready) = current(client)? {
        return Ok(ready);
    }
    // Waiting for the flush whatever the server's setting: a migration a
    // crash undid would leave a new generation behind, which every writer
    // that saw the old one takes for a replaced database.
    let mut tx = super::tx::begin(client, Some("on"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    let exists: bool = tx
        .query_one("SELECT to_regclass('state_meta') IS NOT NULL", &[])?
        .get(0);
    let found: i64 = if exists {
        tx.query_opt("SELECT value FROM state_meta WHERE key = 'schema_version'", &[])?
            .and_then(|r| r.get::<_, String>(0).parse().ok())
            .unwrap_or(0)
    } else {
        0
    };
    if found > VERSION {
        tx.rollback()?;
        return Ok(Migrated::Newer { found });
    }
    if found < VERSION {
        tx.batch_execute(V1)?;
        to_items(&mut tx)?;
        tx.batch_execute(V3)?;
        tx.batch_execute(super::graph::TABLES)?;
        tx.batch_execute(V5)?;
        let generation = crate::ids::mint();
        tx.execute(
            "INSERT INTO state_meta(key, value) VALUES ('generation', $1), ('schema_version', $2) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value WHERE state_meta.key = 'schema_version'",
            &[&generation, &VERSION.to_string()],
        )?;
    }
    let generation: String = tx
        .query_one("SELECT value FROM state_meta WHERE key = 'generation'", &[])?
        .get(0);
    tx.commit()?;
    Ok(Migrated::Ready { generation })
}

/// The generation, when the schema is already at [`VERSION`].
fn current(client: &mut Client) -> Result<Option<Migrated>, postgres::Error> {
    let exists: bool = client
        .query_one("SELECT to_regclass('state_meta') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let version: Option<String> = client
        .query_opt("SELECT value FROM state_meta WHERE key = 'schema_version'", &[])?
        .map(|r| r.get(0));
    if version.as_deref() != Some(VERSION.to_string().as_str()) {
        return Ok(None);
    }
    let generation: Option<String> = client
        .query_opt("SELECT value FROM state_meta WHERE key = 'generation'", &[])?
        .map(|r| r.get(0));
    Ok(generation.map(|generation| Migrated::Ready { generation }))
}

/// Version 1 -> 2 (and a new database's step to 2): each row's object put
/// back together from `extra`, `role` and `content`, `content` turned into
/// the text projection (its search entry dropped where that changed it, so
/// search indexes it again), and the old columns gone.
fn to_items(tx: &mut Transaction<'_>) -> Result<(), postgres::Error> {
    let has_extra: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = 'messages' AND column_name = 'extra')",
            &[],
        )?
        .get(0);
    if !has_extra {
        return Ok(());
    }
    tx.batch_execute(
        "ALTER TABLE messages ADD COLUMN IF NOT EXISTS item text;
         ALTER TABLE messages ALTER COLUMN role DROP NOT NULL, ALTER COLUMN content DROP NOT NULL;",
    )?;
    let rows = tx.query(
        "SELECT id, role, content, content_json, extra FROM messages WHERE item IS NULL ORDER BY id",
        &[],
    )?;
    for r in rows {
        let id: i64 = r.get(0);
        let old: String = r.get(2);
        let item = crate::rows::legacy_item(r.get(1), old.clone(), r.get(3), &r.get::<_, String>(4));
        let (role, content) = crate::rows::projection(&item);
        let text = serde_json::Value::Object(item).to_string();
        tx.execute(
            "UPDATE messages SET item = $2, role = $3, content = $4 WHERE id = $1",
            &[&id, &text, &role, &content],
        )?;
        if content.as_deref() != Some(old.as_str()) {
            tx.execute("DELETE FROM messages_search WHERE message_id = $1", &[&id])?;
        }
    }
    tx.batch_execute(
        "ALTER TABLE messages ALTER COLUMN item SET NOT NULL;
         ALTER TABLE messages DROP COLUMN content_json, DROP COLUMN extra;",
    )
}
