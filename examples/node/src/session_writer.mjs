// A small session writer on better-sqlite3 whose flush protocol is the
// turnsafe policy component's flush machine. The writer holds no decision
// of its own: it performs the steps the machine asks for (open, write,
// wait, capture, divert to JSONL per docs/DIVERT.md: every byte written,
// the file and its folders fsynced, then a receipt; a failed divert is cut
// back, or its residue reported), feeds back what happened, and returns
// the outcome the component built (`outcomeText` is its exact JSON).
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

/** A divert step that failed; `errno` is positive, or null. */
function failed(operation, e, message) {
  const err = e instanceof Error ? e : new Error(message ?? String(e));
  const errno = typeof err.errno === 'number' ? Math.abs(err.errno) : null;
  return Object.assign(err, { operation, errno, residue: null });
}

// docs/DIVERT.md: 1 to 128 bytes of ASCII letters, digits, `-`, `_`, `.`,
// `:`; no leading `.`, no `..`.
const validSession = (s) => typeof s === 'string' && /^[A-Za-z0-9_.:-]{1,128}$/.test(s)
  && !s.startsWith('.') && !s.includes('..');

function fsyncDir(dir) {
  const dfd = fs.openSync(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
  try {
    fs.fsyncSync(dfd);
  } finally {
    fs.closeSync(dfd);
  }
}

// A write may store fewer bytes than asked (a file size limit, a full
// disk): go on from where it stopped until every byte is written or a call
// fails. The failure of a later call is the one reported.
function writeAll(fd, bytes) {
  let done = 0;
  while (done < bytes.length) {
    let n;
    try {
      n = fs.writeSync(fd, bytes, done, bytes.length - done);
    } catch (e) {
      throw failed('write', e);
    }
    if (!(n > 0)) throw failed('write', null, 'the write stored no bytes');
    done += n;
  }
}

/** Truncate the file back to `size` and make that durable. */
function cutBack(fd, size) {
  try {
    fs.ftruncateSync(fd, size);
    fs.fsyncSync(fd);
    return true;
  } catch {
    return false;
  }
}

/**
 * Append one line per message, fsync, and only then return the receipt.
 *
 * Folder durability does not depend on which call created the file or the
 * folder: every divert fsyncs `sessions/` and the home before its receipt.
 * A divert that created the file (or the folder) and then failed before the
 * folder's fsync leaves an entry that may not survive a power cut, and the
 * next divert, which finds the file already there, must not vouch for it
 * unsynced. Diverts are rare (the database already failed), so two
 * directory fsyncs each cost less than a durable marker would.
 *
 * On a failure after the write began, the file is cut back to the size it
 * had and fsynced, so it holds exactly what it held before; if that fails
 * too, the error carries the residue (absolute path, and the offset where
 * this batch's lines began), as the native host does.
 */
export function divert(home, session, cause, batch, firstSeq) {
  if (!validSession(session)) {
    throw failed('validate', null, 'invalid session id');
  }
  const folder = path.join(home, 'sessions');
  try {
    fs.mkdirSync(folder, { mode: 0o700, recursive: false });
  } catch (e) {
    if (e.code !== 'EEXIST') throw failed('mkdir', e);
  }
  const file = path.join(folder, `${session}.jsonl`);
  let fd;
  try {
    // Read and append: the torn-line check reads the last byte.
    const { O_RDWR, O_APPEND, O_CREAT, O_NOFOLLOW } = fs.constants;
    fd = fs.openSync(file, O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW, 0o600);
  } catch (e) {
    throw failed('open', e);
  }
  try {
    // Node has no flock; appends of one write() are atomic for O_APPEND,
    // and the Rust host's flock serialises it against replay's rename.
    let size;
    try {
      size = fs.fstatSync(fd).size;
    } catch (e) {
      throw failed('stat', e);
    }
    let prefix = Buffer.alloc(0);
    if (size > 0) {
      // A torn last line from an earlier crash stays detectable: start ours
      // on a fresh line (an unreadable last byte counts as torn).
      const last = Buffer.alloc(1);
      let got = 0;
      try {
        got = fs.readSync(fd, last, 0, 1, size - 1);
      } catch {
        got = 0;
      }
      if (got !== 1 || last[0] !== 0x0a) prefix = Buffer.from('\n');
    }
    const at = new Date().toISOString();
    const id = randomUUID().replaceAll('-', '');
    let body;
    try {
      body = Buffer.from(batch
        .map((m, i) => JSON.stringify({ v: 1, session, uid: m.uid, seq: firstSeq === null ? null : firstSeq + i,
          batch: id, cause, at, message: m }) + '\n')
        .join(''));
    } catch (e) {
      throw failed('encode', e);
    }
    const offset = size + prefix.length;
    try {
      writeAll(fd, Buffer.concat([prefix, body]));
      try {
        fs.fsyncSync(fd);
      } catch (e) {
        throw failed('fsync', e);
      }
      try {
        fsyncDir(folder);
        fsyncDir(home);
      } catch (e) {
        throw failed('fsync_dir', e);
      }
    } catch (e) {
      // Bytes of this batch may be in the file with no receipt to vouch
      // for them.
      if (!cutBack(fd, size)) e.residue = { path: path.resolve(file), offset };
      throw e;
    }
    let abs;
    try {
      abs = fs.realpathSync(file);
    } catch {
      abs = path.resolve(file);
    }
    return {
      path: abs,
      offset,
      length: body.length,
      count: batch.length,
      sha256: createHash('sha256').update(body).digest('hex'),
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
      if (!e?.operation) throw e;
      return { type: 'divert_failed', operation: e.operation, errno: e.errno, message: String(e.message ?? e),
        residue: e.residue ?? null };
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
