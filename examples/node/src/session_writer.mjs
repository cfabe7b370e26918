// A small session writer on better-sqlite3 whose failure handling is the
// turnsafe policy: retry on its plan, divert to JSONL (docs/DIVERT.md) with
// fsync and a receipt, or fail closed, and show its copy.
import Database from 'better-sqlite3';
import { createHash, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

import { codesOf } from './codes.mjs';
import { decide, explain } from './policy.mjs';

const SCHEMA = `CREATE TABLE IF NOT EXISTS messages(
  id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, uid TEXT NOT NULL, seq INTEGER NOT NULL,
  role TEXT NOT NULL, content TEXT NOT NULL, UNIQUE(session_id, uid))`;

export function observation(operation, err, attempt, elapsedMs, seed) {
  return {
    operation,
    ...codesOf(err),
    message: `${err?.name ?? 'Error'}: ${err?.message ?? String(err)}`,
    errno: null,
    evidence: [],
    attempt,
    elapsed_ms: elapsedMs,
    seed,
  };
}

const sleep = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);

export function divert(home, session, cause, batch, firstSeq) {
  if (!session || session.length > 128 || session.includes('/') || session.includes('..') || session.startsWith('.')) {
    throw Object.assign(new Error('invalid session id'), { operation: 'validate', errno: 22 });
  }
  const folder = path.join(home, 'sessions');
  try {
    fs.mkdirSync(folder, { mode: 0o700, recursive: false });
  } catch (e) {
    if (e.code !== 'EEXIST') throw Object.assign(e, { operation: 'mkdir' });
  }
  const file = path.join(folder, `${session}.jsonl`);
  const created = !fs.existsSync(file);
  let fd;
  try {
    const { O_WRONLY, O_APPEND, O_CREAT, O_NOFOLLOW } = fs.constants;
    fd = fs.openSync(file, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, 0o600);
  } catch (e) {
    throw Object.assign(e, { operation: 'open' });
  }
  try {
    // Node has no flock; appends of one write() are atomic for O_APPEND,
    // and the Rust host's flock serialises it against replay's rename.
    const size = fs.fstatSync(fd).size;
    let prefix = '';
    if (size > 0) {
      const last = Buffer.alloc(1);
      const rfd = fs.openSync(file, 'r');
      fs.readSync(rfd, last, 0, 1, size - 1);
      fs.closeSync(rfd);
      if (last[0] !== 0x0a) prefix = '\n';
    }
    const at = new Date().toISOString();
    const id = randomUUID().replaceAll('-', '');
    const body = batch
      .map((m, i) => JSON.stringify({ v: 1, session, uid: m.uid, seq: firstSeq === null ? null : firstSeq + i,
        batch: id, cause, at, message: m }) + '\n')
      .join('');
    try {
      fs.writeSync(fd, prefix + body);
    } catch (e) {
      throw Object.assign(e, { operation: 'write' });
    }
    try {
      fs.fsyncSync(fd);
      if (created) {
        const dfd = fs.openSync(folder, 'r');
        fs.fsyncSync(dfd);
        fs.closeSync(dfd);
      }
    } catch (e) {
      throw Object.assign(e, { operation: 'fsync' });
    }
    const bytes = Buffer.from(body);
    return {
      path: fs.realpathSync(file),
      offset: size + Buffer.byteLength(prefix),
      length: bytes.length,
      count: batch.length,
      sha256: createHash('sha256').update(bytes).digest('hex'),
    };
  } finally {
    fs.closeSync(fd);
  }
}

export class SessionWriter {
  constructor(home, session, { readonly = false, timeout = 0 } = {}) {
    this.home = home;
    this.session = session;
    this.readonly = readonly;
    this.timeout = timeout;
    this.db = null;
    this.nextSeq = null;
  }

  open() {
    if (!this.db) {
      const db = new Database(path.join(this.home, 'state.db'), { readonly: this.readonly, fileMustExist: this.readonly, timeout: this.timeout });
      if (!this.readonly) {
        db.pragma('journal_mode = WAL');
        db.pragma('synchronous = FULL');
        db.exec(SCHEMA);
      }
      this.db = db;
    }
    return this.db;
  }

  append(messages) {
    const batch = messages.map((m) => ({ ...m, uid: m.uid ?? randomUUID().replaceAll('-', '') }));
    const started = Date.now();
    const seed = Math.floor(Math.random() * 2 ** 32);
    for (let attempt = 1; ; attempt++) {
      let operation = this.db ? 'append_batch' : 'open';
      try {
        const db = this.open();
        operation = 'append_batch';
        db.exec('BEGIN IMMEDIATE');
        try {
          const seq = db.prepare('SELECT COALESCE(MAX(seq), 0) + 1 AS s FROM messages WHERE session_id = ?').get(this.session).s;
          if (this.nextSeq === null) this.nextSeq = seq;
          const ins = db.prepare('INSERT INTO messages(session_id, uid, seq, role, content) VALUES (?, ?, ?, ?, ?)');
          batch.forEach((m, i) => ins.run(this.session, m.uid, seq + i, m.role,
            typeof m.content === 'string' ? m.content : JSON.stringify(m.content)));
          db.exec('COMMIT');
          this.nextSeq = seq + batch.length;
        } catch (e) {
          if (db.inTransaction) db.exec('ROLLBACK');
          throw e;
        }
        return this.outcome(true, null, null, attempt, batch.length, 0, 0, null, null, batch);
      } catch (err) {
        // Any failure to open is the store's; after that, only SQLite's own errors.
        const sqlite = err instanceof Database.SqliteError || (typeof err?.code === 'string' && err.code.startsWith('SQLITE_'));
        if (!sqlite && operation !== 'open') throw err;
        const decision = decide(observation(operation, err, attempt, Date.now() - started, seed));
        if (decision.action === 'retry') {
          sleep(decision.delay_ms);
          continue;
        }
        if (decision.action === 'fail_closed') {
          return this.outcome(false, decision.cause, 'fail_closed', attempt, 0, 0, batch.length, null,
            explain(decision.cause, 'handed_back', { session: this.session }), batch);
        }
        return this.divertBatch(decision.cause, attempt, batch);
      }
    }
  }

  divertBatch(cause, attempt, batch) {
    let receipt;
    try {
      receipt = divert(this.home, this.session, cause, batch, this.nextSeq);
    } catch (e) {
      const errno = typeof e.errno === 'number' ? Math.abs(e.errno) : null;
      const copy = explain(cause, 'divert_failed', { session: this.session,
        divert_error: { operation: e.operation ?? 'write', errno } });
      return { ...this.outcome(false, cause, 'divert', attempt, 0, 0, batch.length, null, copy, batch),
        divert_error: { operation: e.operation ?? 'write', errno } };
    }
    if (this.nextSeq !== null) this.nextSeq += batch.length;
    const copy = explain(cause, 'diverted', { session: this.session, receipt_path: receipt.path });
    return this.outcome(false, cause, 'divert', attempt, 0, batch.length, 0, receipt, copy, batch);
  }

  outcome(persisted, cause, action, attempts, committed, diverted, handedBack, receipt, copy, batch) {
    return { persisted, cause, action, attempts, committed, diverted, handed_back: handedBack, receipt, copy,
      error: persisted ? null : `session_persistence_failed:${cause}`, uids: batch.map((m) => m.uid) };
  }
}
