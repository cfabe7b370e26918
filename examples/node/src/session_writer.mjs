// A small session writer on better-sqlite3 whose flush protocol is the
// turnsafe policy component's flush machine. The writer holds no decision
// of its own: it performs the steps the machine asks for (open, write,
// wait, capture, divert to JSONL per docs/DIVERT.md with fsync and a
// receipt), feeds back what happened, and returns the outcome the
// component built (`outcomeText` is its exact JSON).
import Database from 'better-sqlite3';
import { createHash, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

import { codesOf } from './codes.mjs';
import { flushStep } from './policy.mjs';

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

/** A failed open or write, as the flush machine takes it. */
export function failure(err, elapsedMs) {
  const obs = observation('append_batch', err, 1, elapsedMs, 0);
  return { type: 'failed', code: obs.code, extended_code: obs.extended_code, message: obs.message,
    errno: obs.errno, evidence: [], elapsed_ms: elapsedMs };
}

/** The outcome object of a `done` answer, byte for byte as the component wrote it. */
export function outcomeText(answer) {
  const head = '"step":{"outcome":';
  const tail = ',"type":"done"}}';
  return answer.slice(answer.indexOf(head) + head.length, answer.lastIndexOf(tail));
}

export class SessionWriter {
  constructor(home, session, { readonly = false, timeout = 0 } = {}) {
    this.home = home;
    this.session = session;
    this.readonly = readonly;
    this.timeout = timeout;
    this.db = null;
    this.nextSeq = null;
    // The machine's handle (open, sticky, capture), opaque to this host.
    this.state = null;
    this.outcomeText = null;
  }

  // The effects. Each one does what its step says and reports what happened.

  open(started) {
    try {
      const db = new Database(path.join(this.home, 'state.db'), { readonly: this.readonly, fileMustExist: this.readonly, timeout: this.timeout });
      try {
        if (!this.readonly) {
          db.pragma('journal_mode = WAL');
          db.pragma('synchronous = FULL');
          db.exec(SCHEMA);
        }
      } catch (e) {
        db.close();
        throw e;
      }
      this.db = db;
      return { type: 'opened' };
    } catch (err) {
      // better-sqlite3 throws a codeless TypeError for a missing folder:
      // every failure to open is the store's.
      return failure(err, Date.now() - started);
    }
  }

  write(batch, started) {
    // This schema has no search index and no session rows, so the plan's
    // `degrade_fts` and `recreate_session` have nothing to change.
    const db = this.db;
    try {
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
      return { type: 'committed' };
    } catch (err) {
      const sqlite = err instanceof Database.SqliteError || (typeof err?.code === 'string' && err.code.startsWith('SQLITE_'));
      if (!sqlite) throw err;
      return failure(err, Date.now() - started);
    }
  }

  divertBatch(cause, batch) {
    try {
      const receipt = divert(this.home, this.session, cause, batch, this.nextSeq);
      if (this.nextSeq !== null) this.nextSeq += batch.length;
      return { type: 'diverted', receipt };
    } catch (e) {
      const errno = typeof e.errno === 'number' ? Math.abs(e.errno) : null;
      return { type: 'divert_failed', operation: e.operation ?? 'write', errno, message: String(e.message ?? e),
        residue: null };
    }
  }

  append(messages) {
    const minted = [];
    const batch = messages.map((m) => {
      if (m.uid) return { ...m };
      const uid = randomUUID().replaceAll('-', '');
      minted.push(uid);
      return { ...m, uid };
    });
    const started = Date.now();
    const start = { session: this.session, uids: batch.map((m) => m.uid), minted_uids: minted,
      seed: Math.floor(Math.random() * 2 ** 32) };
    let answer = flushStep({ state: this.state, start });
    for (;;) {
      const reply = JSON.parse(answer);
      if (reply.error) throw new Error(`the flush machine refused a step: ${reply.error}`);
      this.state = reply.state;
      const step = reply.step;
      let event;
      switch (step.type) {
        case 'done':
          this.outcomeText = outcomeText(answer);
          return step.outcome;
        case 'open':
          event = this.open(started);
          break;
        case 'write':
          event = this.write(batch, started);
          break;
        case 'wait':
          sleep(step.ms);
          event = { type: 'waited', elapsed_ms: Date.now() - started };
          break;
        case 'capture':
          event = { type: 'capture_failed', operation: 'read', errno: null,
            error: 'this host keeps no record of the generation it wrote, so it cannot capture it' };
          break;
        case 'divert':
          event = this.divertBatch(step.cause, batch);
          break;
        default:
          throw new Error(`unknown step ${step.type}`);
      }
      answer = flushStep({ state: this.state, event });
    }
  }
}
