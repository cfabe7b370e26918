// The schema of state.db as the native host writes it: the version this
// host writes, the refusal of a database it must not write to, and the
// creation or migration of one. Every statement that makes or migrates
// the schema comes from the native host's own definitions
// (host/src/store/schema.rs and store/graph.rs), which the build writes
// into gen/schema.json (`turnsafe schema`); none is written here. A plain
// room: functions of a path or a connection, no handle.
import fs from 'node:fs';

import Database from 'better-sqlite3';

import { Refusal } from './errors.js';

/**
 * The schema of the native host this package was built with
 * (gen/schema.json): `version`; `create`, the batches of statements a new
 * database is made with, in order; `migrations`, the steps that only add
 * (`{from, to, ddl}`, each `ddl` a list of batches); and `objects`, what
 * sqlite_master holds in a home that binary created.
 */
const NATIVE_SCHEMA = JSON.parse(fs.readFileSync(new URL('../gen/schema.json', import.meta.url), 'utf8'));
export const SCHEMA_VERSION = NATIVE_SCHEMA.version;

const batches = (x) => Array.isArray(x) && x.length > 0 && x.every((s) => typeof s === 'string' && s.trim() !== '');
if (!Number.isInteger(SCHEMA_VERSION) || !batches(NATIVE_SCHEMA.create) || !Array.isArray(NATIVE_SCHEMA.migrations)
  || !NATIVE_SCHEMA.migrations.every((m) => Number.isInteger(m.from) && m.to === m.from + 1 && batches(m.ddl))) {
  throw new Error('turnsafe-store: gen/schema.json holds no schema statements (built by an older turnsafe); run `npm run build`');
}

/** The adding steps from `from` up to SCHEMA_VERSION, in order; null when they do not reach it. */
function stepsFrom(from) {
  const steps = [];
  for (let v = from; v < SCHEMA_VERSION; v++) {
    const step = NATIVE_SCHEMA.migrations.find((m) => m.from === v);
    if (!step) return null;
    steps.push(step);
  }
  return steps;
}

/**
 * The oldest version this host migrates: every step from it on only adds.
 * An older database (its rows move) is migrated by the native host alone.
 */
let oldest = SCHEMA_VERSION;
while (oldest > 1 && stepsFrom(oldest - 1)) oldest -= 1;
export const OLDEST_MIGRATED = oldest;

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

/**
 * A database older than this host migrates: the native host's first write
 * migrates it (an append of no input writes nothing else); `show` and
 * `doctor` only read.
 */
function olderSchema(found) {
  return new Refusal(`state.db has schema version ${found}, older than this host migrates (${OLDEST_MIGRATED} to ${SCHEMA_VERSION}); `
    + 'the native host\'s first write migrates it: `turnsafe append --home ... --session ... < /dev/null` writes nothing else '
    + '(nothing was written)', { found, code: 'older_schema' });
}

/** Refuse a database newer than this host, or older than it migrates, before anything writes to it. */
export function checkSchema(dbPath) {
  const found = versionAt(dbPath);
  if (found !== null && found > SCHEMA_VERSION) throw newerSchema(found);
  if (found !== null && found > 0 && found < OLDEST_MIGRATED) {
    throw olderSchema(found);
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
    if (again >= OLDEST_MIGRATED && again < SCHEMA_VERSION) {
      // Each step the native host runs from this version on; nothing stored moves.
      for (const step of stepsFrom(again)) for (const ddl of step.ddl) db.exec(ddl);
      db.prepare("INSERT OR REPLACE INTO state_meta(key, value) VALUES ('schema_version', ?)").run(String(SCHEMA_VERSION));
      db.pragma(`user_version = ${SCHEMA_VERSION}`);
    } else if (again !== SCHEMA_VERSION) {
      if (again !== 0) {
        throw olderSchema(again);
      }
      // Any nonzero 32-bit value; zero means never stamped.
      let generation = (Math.random() * 2 ** 32) | 0;
      if (generation === 0) generation = 1;
      for (const ddl of NATIVE_SCHEMA.create) db.exec(ddl);
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
