// Opening a store: the home's parent synced once, state.db created 0600,
// the connection configured (foreign keys, the schema migrated, WAL, the
// synchronous level), the guard recording the generation, and the
// statements every room prepares once. A room of Host (host.js).
import fs from 'node:fs';
import path from 'node:path';

import Database from 'better-sqlite3';

import { fsyncDir } from './divert.js';
import { Refusal } from './errors.js';
import { failedEvent } from './failure.js';
import { Guard, fdsOf } from './guard.js';
import { checkSchema, migrate } from './schema.js';

/** Host's methods for opening. */
export const opening = {
  /** Open the store; returns null or the `failed` event. Throws a Refusal for a newer schema. */
  openStore(startedMs) {
    if (this.db) return null;
    this.counters.opens += 1;
    checkSchema(this.dbPath);
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
  },

  configure(db) {
    db.pragma('foreign_keys = ON');
    migrate(db);
    const mode = db.pragma('journal_mode = WAL', { simple: true });
    if (String(mode).toLowerCase() !== 'wal') {
      throw Object.assign(new Error(`could not switch to WAL (journal_mode is ${mode})`), { code: 'SQLITE_CANTOPEN' });
    }
    db.pragma(`synchronous = ${this.synchronous}`);
  },

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
  },
};
