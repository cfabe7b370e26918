// The Node host: one handle on a turnsafe home (home/state.db, diverts in
// home/sessions/), the schema the native host writes (host/src/store/schema.rs,
// versions 3 to 6), and the effects the policy component's flush machine asks
// for. It holds no decision of its own: `append` starts a flush on the
// machine (`flush-step-json`), performs each step (open, write, wait,
// resolve, capture, divert) and feeds back what happened until the machine
// says `done`; the outcome is the component's own object. Edits (pop,
// clear, a history transaction) ask the component after each failed
// attempt (`editNext`). Synchronous: it runs in the store's worker thread.
import { createHash, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import Database from 'better-sqlite3';

import { capture, holds, holdsSession, holdValue } from './captures.js';
import { putBack, settleLines, takeLines } from './clear.js';
import { divert, divertMaxSeq, fsyncDir, validSession } from './divert.js';
import { Guard, fdsOf } from './guard.js';
import { holderOf, judge, proofText, readProof } from './lease.js';
import { codesOf, editNext, flushStep, outcomeText, refused, spent, version } from './policy.js';
import { recordObservation } from './record.js';
import { sameText } from './same.js';

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

/** The extension that switches off the checkpoint at close (built into gen/ by scripts/build.mjs). */
const NO_CKPT_EXTENSION = fileURLToPath(new URL('../gen/no_ckpt_on_close.so', import.meta.url));

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

/** A refusal before anything is written: a newer (or older) schema, an invalid session id. */
export class Refusal extends Error {
  constructor(message, extra = {}) {
    super(message);
    this.name = 'Refused';
    Object.assign(this, extra);
  }
}

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

function newerSchema(found) {
  return new Refusal(`state.db has schema version ${found}, newer than this turnsafe knows (${SCHEMA_VERSION}); `
    + 'use a newer turnsafe (nothing was written)', { found, code: 'newer_schema' });
}

/** Keys sorted at every level, as serde_json writes a map (the content projection of a non-text value). */
function sortedJson(v) {
  if (Array.isArray(v)) return `[${v.map(sortedJson).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${sortedJson(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

/** The text projection of `content` the index holds (host/src/message.rs `text_of`). */
export function textOf(content) {
  if (content === null || content === undefined) return null;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    const texts = content.map((p) => (typeof p === 'string' ? p
      : (p !== null && typeof p === 'object' && typeof p.text === 'string' ? p.text : null))).filter((t) => t !== null);
    return texts.length ? texts.join('\n') : null;
  }
  if (typeof content === 'object') return typeof content.text === 'string' ? content.text : sortedJson(content);
  return sortedJson(content);
}

const sleep = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Math.max(0, ms));
const mintId = () => randomUUID().replaceAll('-', '');
const seed = () => Math.floor(Math.random() * 2 ** 32);

/** An edit that did not happen: nothing was changed. */
export class EditFailure extends Error {
  constructor(edit, session, cause, action, message, attempts) {
    super(`${edit} of session ${session} failed: session_persistence_failed:${cause}: ${message}`);
    this.name = 'TurnsafeError';
    Object.assign(this, { edit, session, cause, action, attempts });
  }
}

/** Reads that cannot present the transcript as complete while a capture holds rows of it. */
export class Incomplete extends Error {
  constructor(session, rows, captures) {
    super(`the history of session ${session} is not complete: an unsettled capture holds rows of it (${captures.map((c) => c.path).join(', ')})`);
    this.name = 'HistoryIncomplete';
    Object.assign(this, { session, rows, captures });
  }
}

/** A failed SQLite call (or any failure to open) as the flush machine's `failed` event. */
function failedEvent(err, startedMs, extra = {}) {
  let codes = codesOf(err);
  let errno = null;
  if (codes.code === null && extra.openCode) {
    // better-sqlite3 throws a codeless TypeError for a missing folder: a
    // failure to open the file is what SQLite calls CANTOPEN.
    codes = { code: 14, extended_code: 14 };
    errno = extra.errno ?? null;
  }
  return {
    type: 'failed',
    ...codes,
    message: `${err?.code && typeof err.code === 'string' ? `${err.code}: ` : ''}${err?.message ?? String(err)}`,
    errno,
    evidence: extra.evidence ?? [],
    elapsed_ms: Math.max(0, Math.round(performance.now() - startedMs)),
  };
}

export class Host {
  constructor(home, opts = {}) {
    this.home = path.resolve(home);
    this.dbPath = path.join(this.home, 'state.db');
    this.holder = opts.holder ?? `pid-${process.pid}`;
    this.leaseTtlMs = opts.leaseTtlMs ?? 30_000;
    this.busyTimeoutMs = opts.busyTimeoutMs ?? 10;
    this.synchronous = opts.synchronous === 'normal' ? 'NORMAL' : 'FULL';
    this.guardOn = opts.guard !== false;
    this.db = null;
    this.guard = null;
    this.homeSynced = false;
    // The machine's handle (open, sticky cause, capture), opaque here.
    this.state = null;
    // Per session: {nextSeq, lease}.
    this.cursors = new Map();
    this.captured = null;
    // A connection whose generation is retired is never closed (see close()).
    this.retired = false;
    // Whether SQLite's checkpoint at close is off (null: never asked).
    this.ckptForbidden = null;
    this.ckptError = null;
    this.stmts = null;
    this.counters = { opens: 0, writes: 0, groups: 0, flushes: 0, diverts: 0, flushMs: 0, componentMs: 0 };
    this.holdsNow = [];
  }

  cursor(session) {
    let c = this.cursors.get(session);
    if (!c) {
      c = { nextSeq: null, lease: null };
      this.cursors.set(session, c);
    }
    return c;
  }

  // ---- open --------------------------------------------------------------

  /** Refuse a database newer than this host before anything writes to it. */
  checkSchema() {
    const found = versionAt(this.dbPath);
    if (found !== null && found > SCHEMA_VERSION) throw newerSchema(found);
    if (found !== null && found > 0 && found < Math.min(3, SCHEMA_VERSION)) {
      throw new Refusal(`state.db has schema version ${found}, older than this host writes (${SCHEMA_VERSION}); `
        + 'any turnsafe command of the native host (`turnsafe doctor --home ...`) migrates it (nothing was written)',
      { found, code: 'older_schema' });
    }
  }

  /** Open the store; returns null or the `failed` event. Throws a Refusal for a newer schema. */
  openStore(startedMs) {
    if (this.db) return null;
    this.counters.opens += 1;
    this.checkSchema();
    if (!this.homeSynced) {
      // SQLite fsyncs the folder its files are in, never that folder's
      // parent: without this a power cut takes a new home with its entry.
      try {
        fsyncDir(path.dirname(this.home));
        this.homeSynced = true;
      } catch (e) {
        return failedEvent(Object.assign(new Error(`turnsafe could not fsync the home's parent folder: ${e.message}`),
          { code: 'SQLITE_CANTOPEN' }), startedMs, { errno: e.errno ? Math.abs(e.errno) : null });
      }
    }
    try {
      fs.lstatSync(this.dbPath);
    } catch {
      // Created here so it is 0600 (SQLite gives its WAL and shm the main
      // file's mode); if this fails, SQLite's open reports it in its own terms.
      try {
        const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
        fs.closeSync(fs.openSync(this.dbPath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600));
      } catch {
        // reported by the open below
      }
    }
    // Descriptors of these files this process already holds (another
    // store's connection on the same home): the guard watches its own.
    let real = this.dbPath;
    try {
      real = fs.realpathSync(this.dbPath);
    } catch {
      // not there yet: nobody holds it
    }
    const others = new Set(['', '-wal', '-shm'].flatMap((x) => fdsOf(real + x)));
    let db;
    try {
      db = new Database(this.dbPath, { timeout: this.busyTimeoutMs });
    } catch (e) {
      let errno = null;
      try {
        fs.statSync(this.home);
      } catch (se) {
        errno = se.errno ? Math.abs(se.errno) : null;
      }
      return failedEvent(e, startedMs, { openCode: true, errno: errno ?? (e.errno ? Math.abs(e.errno) : null) });
    }
    try {
      this.configure(db);
      // A read opens the WAL and the shm, so the guard records them now.
      db.prepare('SELECT count(*) FROM sqlite_master').get();
      if (this.guardOn) this.guard = new Guard(this.dbPath, db, others);
    } catch (e) {
      try {
        db.close();
      } catch {
        // closing a connection that never wrote checkpoints nothing
      }
      if (e instanceof Refusal) throw e;
      if (e.probe) {
        return failedEvent(Object.assign(new Error(`turnsafe ${e.message}`), { code: 'SQLITE_IOERR' }), startedMs,
          { errno: e.errno ? Math.abs(e.errno) : null });
      }
      return failedEvent(e, startedMs, { openCode: true });
    }
    this.db = db;
    this.prepare();
    return null;
  }

  configure(db) {
    db.pragma('foreign_keys = ON');
    this.migrate(db);
    const mode = db.pragma('journal_mode = WAL', { simple: true });
    if (String(mode).toLowerCase() !== 'wal') {
      throw Object.assign(new Error(`could not switch to WAL (journal_mode is ${mode})`), { code: 'SQLITE_CANTOPEN' });
    }
    db.pragma(`synchronous = ${this.synchronous}`);
  }

  migrate(db) {
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

  prepare() {
    const db = this.db;
    this.stmts = {
      begin: db.prepare('BEGIN IMMEDIATE'),
      savepoint: db.prepare('SAVEPOINT batch'),
      release: db.prepare('RELEASE batch'),
      rollbackTo: db.prepare('ROLLBACK TO batch'),
      beginRead: db.prepare('BEGIN'),
      commit: db.prepare('COMMIT'),
      rollback: db.prepare('ROLLBACK'),
      maxSeq: db.prepare('SELECT COALESCE(MAX(seq), 0) + 1 AS s FROM messages WHERE session_id = ?'),
      lease: db.prepare('SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = ?'),
      renew: db.prepare('UPDATE sessions SET lease_expires_ms = ? WHERE id = ?'),
      take: db.prepare('UPDATE sessions SET lease_token = ?, lease_holder = ?, lease_expires_ms = ? WHERE id = ?'),
      newSession: db.prepare('INSERT INTO sessions(id, created_ms, lease_token, lease_holder, lease_expires_ms) VALUES (?, ?, ?, ?, ?)'),
      insert: db.prepare('INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?)'),
      stored: db.prepare('SELECT item FROM messages WHERE session_id = ? AND uid = ?'),
      releaseLease: db.prepare('UPDATE sessions SET lease_token = NULL, lease_holder = NULL, lease_expires_ms = NULL WHERE id = ? AND lease_token = ?'),
      degrade: db.prepare("UPDATE state_meta SET value = '0' WHERE key = 'fts_enabled'"),
    };
  }

  // ---- the flush -----------------------------------------------------------

  /**
   * Flush one batch: `items` (JSON objects, stored exactly as given) with
   * `uids` (null where the caller has none: minted here). Returns
   * `{outcome, text}`: the component's outcome object and its exact JSON.
   */
  append(session, items, uids = null) {
    const [r] = this.appendGroup([{ session, items, uids }]);
    if (r.error) throw r.error;
    return r;
  }

  /** A flush machine started for one batch on the handle's state `base`. */
  member(req, base) {
    const { session, items, uids } = req;
    if (!validSession(session)) throw new Refusal(`invalid session id: ${JSON.stringify(session)}`, { code: 'invalid_session_id' });
    const minted = [];
    const all = items.map((_, i) => {
      const u = uids?.[i];
      if (typeof u === 'string' && u.length > 0) return u;
      const m = mintId();
      minted.push(m);
      return m;
    });
    const start = { session, uids: all, minted_uids: minted, seed: seed() };
    if (this.synchronous === 'NORMAL') start.durability = 'unsynced';
    const hold = this.holdsNow.find((h) => holdsSession(h, session));
    if (hold) start.pending_capture = { path: hold.path, cause: hold.cause };
    const m = { batch: { session, items, uids: all }, startedMs: performance.now(), t0: performance.now() };
    m.answer = flushStep({ state: base, start });
    m.reply = JSON.parse(m.answer);
    if (m.reply.error) throw new Error(`the flush machine refused a step: ${m.reply.error}`);
    return m;
  }

  /**
   * Flush several batches at once, each under its own flush machine and
   * with its own outcome, in order. When every machine asks to write first
   * (the store is open, nothing sticky, no two batches of one session),
   * the batches are committed together in one transaction with one sync,
   * each in its own savepoint: a failure of one batch alone (a uid
   * conflict, a lost lease) fails only it; a failure that ends the
   * transaction is every batch's, and each machine then decides on its
   * own. Otherwise they are flushed one after the other.
   */
  appendGroup(reqs) {
    const before = this.componentMs();
    const t0 = performance.now();
    this.holdsNow = holds(this.home);
    const base = this.state;
    // A batch refused before its flush began (an invalid session id) gets
    // its error; nothing of it was done.
    const members = reqs.map((r) => {
      try {
        return this.member(r, base);
      } catch (error) {
        return { error };
      }
    });
    const sessions = new Set(reqs.map((r) => r.session));
    const together = members.length > 1 && this.db && sessions.size === members.length
      && members.every((m) => !m.error && m.reply.step?.type === 'write');
    let results;
    if (together) {
      const events = this.writeGroup(members.map((m) => ({ batch: m.batch, plan: m.reply.step.plan ?? {} })), t0);
      this.counters.groups += 1;
      for (const ev of events) if (ev.type === 'failed') recordObservation('append_batch', ev);
      results = members.map((m, i) => {
        m.answer = flushStep({ state: m.reply.state, event: events[i] });
        m.reply = JSON.parse(m.answer);
        return this.drive(m);
      });
    } else {
      // One after the other, each machine started on the state the one
      // before it left (the first one's start is already made).
      results = members.map((m, i) => {
        if (m.error) return m;
        try {
          const started = i === 0 ? m : this.member(reqs[i], this.state);
          return this.drive(started);
        } catch (error) {
          // A refusal met on the way (a newer schema at the open) is this
          // batch's answer; the batches before it stand.
          return { error };
        }
      });
    }
    this.counters.flushes += reqs.length;
    this.counters.flushMs += performance.now() - t0;
    this.counters.componentMs += this.componentMs() - before;
    return results;
  }

  /** Perform the steps one machine asks for until it is done; the handle keeps its state. */
  drive(m) {
    const { batch, startedMs } = m;
    for (;;) {
      const reply = m.reply;
      if (reply.error) throw new Error(`the flush machine refused a step: ${reply.error}`);
      this.state = reply.state;
      const step = reply.step;
      let event;
      switch (step.type) {
        case 'done':
          return { outcome: step.outcome, text: outcomeText(m.answer) };
        case 'open':
          event = this.openStore(startedMs) ?? { type: 'opened' };
          break;
        case 'write':
          event = this.writeGroup([{ batch, plan: step.plan ?? {} }], startedMs)[0];
          break;
        case 'wait':
          sleep(step.ms);
          event = { type: 'waited', elapsed_ms: Math.round(performance.now() - startedMs) };
          break;
        case 'resolve':
          event = this.resolve(batch, startedMs);
          break;
        case 'capture':
          event = this.captureStep();
          break;
        case 'divert':
          event = this.divertStep(batch, step.cause);
          break;
        default:
          throw new Error(`unknown step ${step.type}`);
      }
      // The flush machine names a failure by its phase: opening, or writing
      // (a write and the read that resolves a lost COMMIT).
      if (event.type === 'failed') recordObservation(step.type === 'open' ? 'open' : 'append_batch', event);
      m.answer = flushStep({ state: this.state, event });
      m.reply = JSON.parse(m.answer);
    }
  }

  componentMs() {
    return spent.ms;
  }

  /**
   * One attempt for `entries` (`{batch, plan}`, distinct sessions): a single
   * BEGIN IMMEDIATE transaction, the guard checked under the write lock,
   * each batch in a savepoint when there are several, one COMMIT. Returns
   * one event per entry (`committed` or `failed`).
   */
  writeGroup(entries, startedMs) {
    const db = this.db;
    const st = this.stmts;
    if (!db) return entries.map(() => failedEvent(new Error('the store is not open'), startedMs, { openCode: true }));
    this.counters.writes += 1;
    const several = entries.length > 1;
    const own = entries.map(() => null);
    // What each session will know once COMMIT succeeds.
    const pending = entries.map(() => null);
    let group = null;
    const sqlite = (e) => e instanceof Database.SqliteError || (typeof e?.code === 'string' && e.code.startsWith('SQLITE_'));
    try {
      st.begin.run();
      try {
        if (this.guard) {
          let verdict;
          try {
            verdict = this.guard.check();
          } catch (e) {
            throw Object.assign(new Error(`turnsafe ${e.message}`), { code: 'SQLITE_IOERR', probeErrno: e.errno });
          }
          if (verdict) throw Object.assign(new Error(`turnsafe guard: ${verdict.detail}`), { evidence: [verdict.evidence] });
        }
        entries.forEach(({ batch, plan }, k) => {
          if (several) st.savepoint.run();
          const cur = this.cursor(batch.session);
          try {
            pending[k] = this.writeBatch(batch, plan, cur);
            if (several) st.release.run();
          } catch (e) {
            // A batch that fails alone while the transaction lives on.
            if (several && db.inTransaction && (e.leaseLost || (sqlite(e) && !endsTransaction(e)))) {
              st.rollbackTo.run();
              st.release.run();
              own[k] = e;
              if (e.leaseLost) cur.nextSeq = null;
              return;
            }
            throw e;
          }
        });
        st.commit.run();
      } catch (e) {
        if (db.inTransaction) st.rollback.run();
        throw e;
      }
    } catch (e) {
      if (!e.leaseLost && !e.evidence && !sqlite(e)) throw e;
      group = e;
    }
    return entries.map(({ batch }, k) => {
      const e = own[k] ?? group;
      if (!e) {
        const cur = this.cursor(batch.session);
        cur.lease = pending[k].lease;
        cur.nextSeq = pending[k].nextSeq;
        return { type: 'committed' };
      }
      if (e.leaseLost) {
        this.cursor(batch.session).nextSeq = null;
        // The copy names whoever holds the lease.
        return { ...failedEvent(e, startedMs, { evidence: ['turn_lease_lost'] }), ...(e.lease ? { lease: e.lease } : {}) };
      }
      if (e.evidence) return failedEvent(e, startedMs, { evidence: e.evidence });
      return failedEvent(e, startedMs, { errno: e.probeErrno ? Math.abs(e.probeErrno) : null });
    });
  }

  /** One batch's statements inside the transaction: its seqs, the session's lease, its rows. */
  writeBatch(batch, plan, cur) {
    const st = this.stmts;
    const { session, items, uids } = batch;
    // A writer about to take the lease learns which seqs diverted lines
    // already hold, so it never commits over them.
    const promised = cur.lease ? null : divertMaxSeq(this.home, session);
    let seq = st.maxSeq.get(session).s;
    if (cur.nextSeq !== null && cur.nextSeq > seq) seq = cur.nextSeq;
    if (promised !== null && promised + 1 > seq) seq = promised + 1;
    // Where a divert of this batch would put its lines, should it fail.
    if (cur.nextSeq === null) cur.nextSeq = seq;
    if (plan.degrade_fts) st.degrade.run();
    const lease = this.takeLease(session, cur, plan.recreate_session === true);
    const created = Date.now();
    items.forEach((m, i) => {
      try {
        st.insert.run(session, uids[i], seq, typeof m.role === 'string' ? m.role : null, textOf(m.content),
          JSON.stringify(m), created);
        seq += 1;
      } catch (e) {
        // Idempotent resend: a stored row with the same canonical bytes
        // counts as committed; any other bytes are a conflict.
        if (e.code === 'SQLITE_CONSTRAINT_UNIQUE' && /messages\.session_id, messages\.uid/.test(e.message)) {
          const row = st.stored.get(session, uids[i]);
          if (row && sameText(row.item, m)) return;
        }
        throw e;
      }
    });
    return { lease, nextSeq: seq };
  }

  takeLease(session, cur, recreate) {
    const st = this.stmts;
    const now = Date.now();
    const row = st.lease.get(session);
    const mine = cur.lease;
    const ttl = this.leaseTtlMs;
    const lost = (lease) => Object.assign(new Error("the session's turn lease is held by another writer"), { leaseLost: true, lease });
    if (row && mine) {
      if (row.lease_token === mine) {
        if (row.lease_expires_ms === null || row.lease_expires_ms - now < ttl - Math.floor(ttl / 2)) st.renew.run(now + ttl, session);
        return mine;
      }
      // We held the lease and someone else took it: fenced, whatever its
      // expiry or its holder's state.
      throw lost(row.lease_token === null ? null : holderOf(readProof(row.lease_holder), row.lease_expires_ms));
    }
    if (row) {
      // Another holder's lease ends on its expiry, or on the policy's word
      // that its holder is gone (src/lease.js); never on this writer's guess.
      const judged = judge(session, row.lease_holder, row.lease_token === null ? null : row.lease_expires_ms, now);
      if (!judged.take) throw lost(judged.holder);
      const token = mintId();
      st.take.run(token, proofText(this.holder), now + ttl, session);
      return token;
    }
    // A session row that vanished after our first batch is left missing, so
    // the insert fails with a foreign-key error and the policy decides.
    if (mine && !recreate) return mine;
    const token = mine ?? mintId();
    st.newSession.run(session, now, token, proofText(this.holder), now + ttl);
    return token;
  }

  /**
   * Whether a lost COMMIT took effect, on the connection just opened: every
   * uid of the batch stored with its item's canonical bytes. A uid stored
   * with other bytes is not this batch's row, so the batch is written
   * again and meets it as a conflict.
   */
  resolve(batch, startedMs) {
    try {
      const rows = batch.uids.map((u) => this.stmts.stored.get(batch.session, u));
      return { type: 'resolved', all_stored: rows.every((r, i) => r && sameText(r.item, batch.items[i])) };
    } catch (e) {
      return failedEvent(e, startedMs);
    }
  }

  /**
   * Switch off SQLite's checkpoint at close on this connection, the one
   * step that keeps a close from writing a retired generation over the file
   * now at the path (and unlinking the WAL by its path). better-sqlite3 has
   * no sqlite3_db_config, so a small extension does it when it is loaded
   * (native/no_ckpt_on_close.c). If it cannot be, the handle remembers, and
   * close() never closes the connection.
   */
  forbidCloseCheckpoint() {
    if (!this.db || this.ckptForbidden !== null) return;
    try {
      this.db.loadExtension(NO_CKPT_EXTENSION, 'sqlite3_turnsafe_nockpt_init');
      this.ckptForbidden = true;
    } catch (e) {
      this.ckptForbidden = false;
      this.ckptError = e.message;
    }
  }

  captureStep() {
    this.retired = true;
    this.forbidCloseCheckpoint();
    if (this.captured) {
      return this.captured.receipt ? { type: 'captured', receipt: this.captured.receipt }
        : { type: 'capture_failed', ...this.captured.error };
    }
    if (!this.guard) {
      this.captured = { error: { operation: 'read', errno: null,
        error: 'capture of the retired generation failed at read: this handle recorded no generation (its guard is off or its open failed)' } };
    } else {
      let verdict = null;
      try {
        verdict = this.guard.check();
      } catch {
        verdict = null;
      }
      const evidence = verdict ? [verdict.evidence] : [];
      const cause = evidence.includes('db_replaced') ? 'replaced' : evidence.includes('deleted_wal_generation') ? 'deleted_wal' : 'unknown';
      this.captured = capture(this.guard, { trigger: verdict ? `write: ${verdict.detail}` : 'the flush machine asked for a capture',
        cause, evidence }, version());
    }
    return this.captured.receipt ? { type: 'captured', receipt: this.captured.receipt }
      : { type: 'capture_failed', ...this.captured.error };
  }

  divertStep(batch, cause) {
    const cur = this.cursor(batch.session);
    const first = cur.nextSeq;
    this.counters.diverts += 1;
    try {
      const receipt = divert(this.home, batch.session, cause, batch.items.map((message, i) => ({
        uid: batch.uids[i], seq: first === null ? null : first + i, message })));
      if (first !== null) cur.nextSeq = first + batch.items.length;
      return { type: 'diverted', receipt };
    } catch (e) {
      if (!e?.divert) throw e;
      return { type: 'divert_failed', operation: e.operation, errno: e.errno, message: String(e.message ?? e),
        residue: e.residue ?? null };
    }
  }

  /** The machine's sticky cause, as its state says (opaque otherwise: read only for edits). */
  stickyCause() {
    const s = this.state;
    const sticky = s?.handle?.sticky ?? s?.sticky ?? null;
    return typeof sticky === 'string' ? sticky : null;
  }

  // ---- reads and edits -----------------------------------------------------

  /** A sticky handle refuses every edit before it touches anything. */
  refuseIfSticky(edit, session) {
    const sticky = this.stickyCause();
    if (sticky) {
      const n = refused(sticky);
      throw new EditFailure(edit, session, n.cause, n.action, 'the store refuses to touch its database until an operator acts', 0);
    }
  }

  /**
   * Work outside a flush: each attempt opens the store if needed and runs
   * `f(db)` in one BEGIN IMMEDIATE transaction (the guard and the session's
   * lease checked first when `write`); a failure is answered by the policy.
   */
  edit(edit, session, f, { write = true } = {}) {
    this.refuseIfSticky(edit, session);
    const started = performance.now();
    const s = seed();
    let degraded = false;
    for (let attempt = 1; ; attempt++) {
      let ev = this.openStore(started);
      if (!ev) ev = this.editOnce(session, f, write, degraded, started);
      if (ev.type === 'ok') return ev.value;
      const { type: _failed, ...obs } = ev;
      // editNext asks the policy about it as a `replay`: work with nothing to divert.
      recordObservation('replay', { ...obs, attempt, seed: s });
      const next = editNext({ ...obs, attempt, seed: s }, degraded);
      if (next.wait !== undefined) sleep(next.wait);
      else if (next.degradeFts) degraded = true;
      else throw new EditFailure(edit, session, next.cause, next.action, ev.message, attempt);
    }
  }

  editOnce(session, f, write, degraded, started) {
    const db = this.db;
    const st = this.stmts;
    try {
      // A read takes no write lock: a deferred transaction, one snapshot.
      (write ? st.begin : st.beginRead).run();
      try {
        if (write && this.guard) {
          let verdict;
          try {
            verdict = this.guard.check();
          } catch (e) {
            throw Object.assign(new Error(`turnsafe ${e.message}`), { code: 'SQLITE_IOERR' });
          }
          if (verdict) throw Object.assign(new Error(`turnsafe guard: ${verdict.detail}`), { evidence: [verdict.evidence] });
        }
        if (write) {
          const row = st.lease.get(session);
          const ours = this.cursors.get(session)?.lease ?? null;
          // Another holder's lease fences the edit until it expires or the
          // policy finds its holder gone; an edit never takes the lease.
          const judged = row && row.lease_token !== null && row.lease_token !== ours
            ? judge(session, row.lease_holder, row.lease_expires_ms, Date.now()) : null;
          if (judged && !judged.take) {
            throw Object.assign(new Error("the session's turn lease is held by another writer"),
              { evidence: ['turn_lease_lost'], lease: judged.holder });
          }
          if (degraded) st.degrade.run();
        }
        const value = f(db);
        st.commit.run();
        return { type: 'ok', value };
      } catch (e) {
        if (db.inTransaction) st.rollback.run();
        throw e;
      }
    } catch (e) {
      if (e instanceof Refusal || e.userError) throw e;
      if (e.evidence) return { ...failedEvent(e, started, { evidence: e.evidence }), ...(e.lease ? { lease: e.lease } : {}) };
      if (!(e instanceof Database.SqliteError)) throw e;
      return failedEvent(e, started);
    }
  }

  /**
   * Rows of `session` in seq order (the newest `limit`, all when null):
   * `[{uid, seq, item, text}]`, `text` the stored JSON text (what a
   * comparison reads: JSON.parse would round its numbers).
   */
  rows(db, session, limit) {
    return db.prepare(`SELECT uid, seq, item FROM (SELECT id, uid, seq, item FROM messages WHERE session_id = ?
      ORDER BY seq DESC, id DESC LIMIT ?) ORDER BY seq, id`).all(session, limit ?? -1)
      .map((r) => ({ uid: r.uid, seq: r.seq, item: JSON.parse(r.item), text: r.item }));
  }

  /** The stored items, or Incomplete while an unsettled capture holds rows of the session. */
  show(session, limit) {
    if (!validSession(session)) throw new Refusal(`invalid session id: ${JSON.stringify(session)}`, { code: 'invalid_session_id' });
    const rows = this.edit('show', session, (db) => this.rows(db, session, limit), { write: false });
    const held = holds(this.home).filter((h) => holdsSession(h, session));
    if (held.length) throw new Incomplete(session, rows.map((r) => r.item), held.map((h) => holdValue(h, session)));
    return rows.map((r) => r.item);
  }

  /**
   * Take rows of `session` out of the transcript (`uid`, from `fromSeq`
   * on, or all): with schema 4 they move to the archive, stamped with the
   * reason, this writer and the edit's id, as the native host's edits do.
   */
  takeOut(db, session, { uid = null, fromSeq = null }, reason, editId) {
    const filter = 'session_id = ? AND (? IS NULL OR uid = ?) AND (? IS NULL OR seq >= ?)';
    const args = [session, uid, uid, fromSeq, fromSeq];
    if (this.hasArchive(db)) {
      db.prepare(`INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, reason, holder, edit)
        SELECT session_id, uid, seq, role, content, item, created_ms, ?, ?, ?, ? FROM messages WHERE ${filter} ORDER BY seq, id`)
        .run(Date.now(), reason, this.holder, editId, ...args);
    }
    // The schema's messages_fts_unindex trigger keeps the index and its watermark true.
    return db.prepare(`DELETE FROM messages WHERE ${filter}`).run(...args).changes;
  }

  hasArchive(db) {
    return db.prepare("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'archive') AS e").get().e === 1;
  }

  /** Remove and return the newest item (null when none). */
  pop(session) {
    const editId = mintId();
    return this.edit('pop', session, (db) => {
      const last = this.rows(db, session, 1)[0];
      if (!last) return null;
      this.takeOut(db, session, { uid: last.uid }, 'pop', editId);
      return last.item;
    });
  }

  /**
   * Remove every stored item of `session` (to the archive with schema 4,
   * with its pending divert lines) and settle those lines (docs/DIVERT.md,
   * "Cleared"): the session's divert file is taken into settling/ and read
   * first (clear.js), so the lines archived and settled are exactly the
   * lines read; one diverted after that stays pending. A file that cannot
   * be read fails the clear before the database is touched.
   */
  clear(session) {
    if (!validSession(session)) throw new Refusal(`invalid session id: ${JSON.stringify(session)}`, { code: 'invalid_session_id' });
    // A handle that refuses edits takes no file either.
    this.refuseIfSticky('clear', session);
    const editId = mintId();
    const files = takeLines(this.home, session);
    const lines = files.flatMap((f) => f.lines.filter((l) => l.kind === 'message'));
    let n;
    try {
      n = this.edit('clear', session, (db) => this.clearRows(db, session, lines, editId));
    } catch (e) {
      putBack(this.home, files);
      throw e;
    }
    settleLines(this.home, session, files);
    this.cursor(session).nextSeq = null;
    return n;
  }

  /** The clear's transaction: the rows and the lines read to the archive (schema 4), the rows removed. */
  clearRows(db, session, lines, editId) {
    const taken = this.takeOut(db, session, {}, 'clear', editId);
    if (this.hasArchive(db)) {
      const ins = db.prepare(`INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, reason, holder, edit)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'clear', ?, ?)`);
      const now = Date.now();
      for (const l of lines) {
        // The message's text as it was diverted, byte for byte.
        ins.run(session, l.uid, l.seq ?? 0, typeof l.message.role === 'string' ? l.message.role : null, textOf(l.message.content),
          l.text, now, now, this.holder, editId);
      }
    }
    return taken;
  }

  /**
   * `replaceHistoryWithCompaction` and `replace_suffix`: in one
   * transaction, take the stored items from the start of the suffix on
   * out (to the archive with schema 4, reason `compaction`; all of them
   * with `expected` null, else the stored suffix must equal `expected`)
   * and store `replacement` under `uids` from that seq on. Idempotent: when
   * every replacement uid is stored with its item, it was applied already.
   */
  replace(session, expected, replacement, uids, edit = 'replace') {
    const editId = mintId();
    return this.edit(edit, session, (db) => {
      const stored = uids.map((u) => this.stmts.stored.get(session, u));
      if (uids.length > 0 && stored.every(Boolean)) {
        if (stored.every((r, i) => sameText(r.item, replacement[i]))) return { applied: false };
        throw userError('Session history operation was already applied with a different transaction.');
      }
      if (stored.some(Boolean)) throw userError('Session history operation was already applied with a different transaction.');
      const all = this.rows(db, session, null);
      let from = 0;
      if (expected !== null) {
        from = all.length - expected.length;
        if (from < 0 || !all.slice(from).every((r, i) => sameText(r.text, expected[i]))) {
          throw userError('Session history suffix no longer matches the transaction precondition.');
        }
      }
      let seq = from < all.length ? all[from].seq : this.stmts.maxSeq.get(session).s;
      if (from < all.length) this.takeOut(db, session, { fromSeq: seq }, 'compaction', editId);
      if (!this.stmts.lease.get(session)) db.prepare('INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?, ?)').run(session, Date.now());
      const created = Date.now();
      replacement.forEach((m, i) => {
        this.stmts.insert.run(session, uids[i], seq, typeof m.role === 'string' ? m.role : null, textOf(m.content),
          JSON.stringify(m), created);
        seq += 1;
      });
      const cur = this.cursor(session);
      if (cur.nextSeq !== null) cur.nextSeq = Math.max(cur.nextSeq, seq);
      return { applied: true };
    });
  }

  /**
   * How much of a history append by operation id is stored already:
   * `all` (each uid with the same item), `conflict` (a uid with another
   * item), else `none`. Nothing is opened for it on a sticky handle or
   * when the store cannot be opened: the flush then decides.
   */
  storedUids(session, uids, items) {
    if (this.stickyCause()) return 'none';
    try {
      if (this.openStore(performance.now())) return 'none';
      const rows = uids.map((u) => this.stmts.stored.get(session, u));
      if (rows.some((r, i) => r && !sameText(r.item, items[i]))) return 'conflict';
      return rows.length > 0 && rows.every(Boolean) ? 'all' : 'none';
    } catch (e) {
      if (e instanceof Refusal) throw e;
      return 'none';
    }
  }

  /** Give back this handle's lease on `session`. */
  releaseLease(session) {
    const cur = this.cursors.get(session);
    if (!cur?.lease || !this.db || this.stickyCause()) return;
    try {
      this.stmts.releaseLease.run(session, cur.lease);
    } catch {
      // the lease then expires on its own
    }
    cur.lease = null;
  }

  /**
   * Release every lease, check the generation once more, and close. A
   * connection whose generation is retired is never closed: better-sqlite3
   * cannot switch off SQLite's checkpoint at close, which would write the
   * retired frames over whatever file is at the path now.
   */
  close() {
    if (!this.db) return { closed: true };
    for (const s of this.cursors.keys()) this.releaseLease(s);
    let verdict = null;
    try {
      verdict = this.guard ? this.guard.check() : null;
    } catch {
      verdict = { evidence: 'probe_failed', detail: 'a guard probe failed at close' };
    }
    if (verdict || this.retired || this.stickyCause()) {
      this.forbidCloseCheckpoint();
      let captured = null;
      if (verdict && !this.captured && this.guard && verdict.evidence !== 'probe_failed') {
        this.captured = capture(this.guard, { trigger: `close: ${verdict.detail}`,
          cause: verdict.evidence === 'db_replaced' ? 'replaced' : 'deleted_wal', evidence: [verdict.evidence] }, version());
        captured = this.captured;
      }
      const reason = verdict?.detail ?? 'the handle is sticky: its generation is retired';
      if (this.ckptForbidden) {
        // Closed without a checkpoint: the retired frames stay where they were.
        this.db.close();
        this.db = null;
        return { closed: true, checkpoint: false, reason, capture: captured };
      }
      Host.kept.push(this.db);
      this.db = null;
      return { closed: false, reason: `${reason}; the checkpoint at close could not be switched off (${this.ckptError}), `
        + 'so the connection stays open until the process ends', capture: captured };
    }
    this.db.close();
    this.db = null;
    return { closed: true };
  }
}

/** Connections to retired generations, kept open until the process ends. */
Host.kept = [];

/**
 * Whether a failed statement ends the whole transaction rather than one
 * batch's savepoint: an error of a class (busy, full, I/O, corruption,
 * ...) after which nothing more should be written in it.
 */
function endsTransaction(e) {
  const ext = codesOf(e).extended_code;
  if (ext === null) return true;
  // BUSY, LOCKED, NOMEM, READONLY, INTERRUPT, IOERR, CORRUPT, FULL, CANTOPEN, PROTOCOL, NOTADB
  return [5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 26].includes(ext & 0xff);
}

function userError(message) {
  return Object.assign(new Error(message), { userError: true, name: 'UserError' });
}
