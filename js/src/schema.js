// The schema of state.db as the native host writes it (host/src/store/schema.rs,
// versions 3 to 6): the version this host writes, the refusal of a database
// it must not write to, and the migration of a new or older one. A plain
// room: functions of a path or a connection, no handle.
import fs from 'node:fs';

import Database from 'better-sqlite3';

import { Refusal } from './errors.js';

/**
 * The schema this host writes: the version of the native host it was
 * built with (the build asks that binary, gen/schema.json), one this file
 * knows how to write: 3 (messages of any shape), 4 (3 plus the archive of
 * what edits take out, and each session's lineage), 5 (4 plus the record
 * of imported sessions) or 6 (5 plus LangGraph's checkpoints and writes).
 */
const NATIVE_SCHEMA = JSON.parse(fs.readFileSync(new URL('../gen/schema.json', import.meta.url), 'utf8'));
export const SCHEMA_VERSION = NATIVE_SCHEMA.version;
if (![3, 4, 5, 6].includes(SCHEMA_VERSION)) {
  throw new Error(`turnsafe-store writes schema versions 3 to 6; the turnsafe it was built with writes ${SCHEMA_VERSION}`);
}

const TABLES = `
CREATE TABLE IF NOT EXISTS state_meta(
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions(
    id               TEXT PRIMARY KEY,
    created_ms       INTEGER NOT NULL,
    lease_token      TEXT,
    lease_holder     TEXT,
    lease_expires_ms INTEGER@LINEAGE@
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
`;

/** Version 4's archive: what edits took out of a transcript. */
const ARCHIVE = `
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
`;

/** Version 5's record of imported sessions (`turnsafe import hermes`). */
const SESSION_META = `
CREATE TABLE IF NOT EXISTS session_meta(
    session_id   TEXT PRIMARY KEY,
    origin       TEXT NOT NULL,
    origin_id    TEXT NOT NULL,
    meta         TEXT NOT NULL,
    imported_ms  INTEGER NOT NULL
) WITHOUT ROWID;
`;

/**
 * Version 6's LangGraph checkpoints and pending writes, exactly as the
 * native host creates them (host/src/store/graph.rs `TABLES`). This host
 * writes none; it creates them so a home it makes is the native one.
 */
const GRAPH = `
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
`;

const tables = (version) => TABLES.replace('@LINEAGE@', version >= 4 ? ',\n    forked_from      TEXT,\n    forked_at_seq    INTEGER' : '');

const V2_TRIGGERS = `
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
`;

/**
 * The schema version of the database at `db`, read without writing
 * anything: from the header when the WAL holds no frames, through a
 * read-only connection otherwise. null when there is no database there.
 */
export function versionAt(db) {
  let walSize = 0;
  try {
    walSize = fs.statSync(`${db}-wal`).size;
  } catch {
    walSize = 0;
  }
  if (walSize > 32) {
    try {
      const c = new Database(db, { readonly: true, fileMustExist: true });
      try {
        return c.pragma('user_version', { simple: true });
      } finally {
        c.close();
      }
    } catch {
      return null;
    }
  }
  let fd;
  try {
    fd = fs.openSync(db, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  } catch {
    return null;
  }
  try {
    const h = Buffer.alloc(100);
    if (fs.readSync(fd, h, 0, 100, 0) !== 100 || h.subarray(0, 16).toString('latin1') !== 'SQLite format 3\0') return null;
    return h.readInt32BE(60);
  } catch {
    // not a readable file (a folder, say): the open reports it in its own terms
    return null;
  } finally {
    fs.closeSync(fd);
  }
}

export function newerSchema(found) {
  return new Refusal(`state.db has schema version ${found}, newer than this turnsafe knows (${SCHEMA_VERSION}); `
    + 'use a newer turnsafe (nothing was written)', { found, code: 'newer_schema' });
}

/** Refuse a database newer than this host before anything writes to it. */
export function checkSchema(dbPath) {
  const found = versionAt(dbPath);
  if (found !== null && found > SCHEMA_VERSION) throw newerSchema(found);
  if (found !== null && found > 0 && found < Math.min(3, SCHEMA_VERSION)) {
    throw new Refusal(`state.db has schema version ${found}, older than this host writes (${SCHEMA_VERSION}); `
      + 'any turnsafe command of the native host (`turnsafe doctor --home ...`) migrates it (nothing was written)',
    { found, code: 'older_schema' });
  }
}

/** Bring the schema of `db` to SCHEMA_VERSION, in one immediate transaction. */
export function migrate(db) {
  const v = db.pragma('user_version', { simple: true });
  if (v > SCHEMA_VERSION) throw newerSchema(v);
  if (v === SCHEMA_VERSION) return;
  db.exec('BEGIN IMMEDIATE');
  try {
    // Re-read under the write lock: another process may have migrated.
    const again = db.pragma('user_version', { simple: true });
    if (again > SCHEMA_VERSION) throw newerSchema(again);
    if (again >= 3 && again < SCHEMA_VERSION) {
      // 3 -> 4: the archive and each session's lineage; 4 -> 5: the record
      // of imported sessions; 5 -> 6: LangGraph's checkpoints and writes.
      // Nothing stored moves.
      if (again < 4) {
        db.exec('ALTER TABLE sessions ADD COLUMN forked_from TEXT; ALTER TABLE sessions ADD COLUMN forked_at_seq INTEGER;');
        db.exec(ARCHIVE);
      }
      if (again < 5 && SCHEMA_VERSION >= 5) db.exec(SESSION_META);
      if (again < 6 && SCHEMA_VERSION >= 6) db.exec(GRAPH);
      db.prepare("INSERT OR REPLACE INTO state_meta(key, value) VALUES ('schema_version', ?)").run(String(SCHEMA_VERSION));
      db.pragma(`user_version = ${SCHEMA_VERSION}`);
    } else if (again !== SCHEMA_VERSION) {
      if (again !== 0) {
        throw new Refusal(`state.db has schema version ${again}, older than this host writes (${SCHEMA_VERSION}); `
          + 'any turnsafe command of the native host migrates it (nothing was written)', { found: again, code: 'older_schema' });
      }
      // Any nonzero 32-bit value; zero means never stamped.
      let generation = (Math.random() * 2 ** 32) | 0;
      if (generation === 0) generation = 1;
      db.exec(tables(SCHEMA_VERSION));
      if (SCHEMA_VERSION >= 4) db.exec(ARCHIVE);
      if (SCHEMA_VERSION >= 5) db.exec(SESSION_META);
      if (SCHEMA_VERSION >= 6) db.exec(GRAPH);
      db.exec(V2_TRIGGERS);
      // The generation also lives in the header, written before the switch to WAL.
      db.pragma(`application_id = ${generation}`);
      db.prepare("INSERT OR IGNORE INTO state_meta(key, value) VALUES ('generation', ?), ('fts_enabled', '1'), ('fts_watermark', '0')")
        .run(String(generation));
      db.prepare("INSERT OR REPLACE INTO state_meta(key, value) VALUES ('schema_version', ?)").run(String(SCHEMA_VERSION));
      db.pragma(`user_version = ${SCHEMA_VERSION}`);
    }
    db.exec('COMMIT');
  } catch (e) {
    if (db.inTransaction) db.exec('ROLLBACK');
    throw e;
  }
}
