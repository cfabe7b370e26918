// Clear's divert lines (docs/DIVERT.md, "Cleared"): a session's pending
// lines are taken before the clear reads them, and settled afterwards
// exactly as they were read.
//
// Taking first is what makes "exactly": the session's divert file is
// renamed into sessions/settling/ under its flock, after being read under
// that same lock, so a line diverted once the clear has read the file
// goes to a new sessions/<id>.jsonl and stays pending. Every line read is
// settled: a message line as `cleared` (and archived with the rows), a
// line that cannot be read as `quarantined` with the reason replay would
// give, a LangGraph line of a thread that shares the id written back to
// the pending file. A file that cannot be read fails the clear before
// anything is changed in the database.
import fs from 'node:fs';
import path from 'node:path';

import { appendBytes, flockExclusive, fsyncDir, validSession } from './divert.js';
import { ownsLines, readLine, splitLines } from './divert_lines.js';
import { Refusal, TurnsafeError } from './errors.js';
import { mintId } from './ids.js';
import { textOf } from './projection.js';

const LEDGER = 'ledger.jsonl';

/** A clear that could not take, read or settle the session's divert lines: nothing more was done. */
function clearFailure(session, operation, where, e) {
  const errno = typeof e?.errno === 'number' ? Math.abs(e.errno) : null;
  return new TurnsafeError(`clear of session ${session} failed: its divert lines could not be settled: ${operation} ${where}: `
    + `${e?.message ?? String(e)}`, { edit: 'clear', session, operation, errno, path: where });
}

/** Run `f`; a failure of it fails the clear, named by `operation` and `where`. */
function step(session, operation, where, f) {
  try {
    return f();
  } catch (e) {
    if (e instanceof TurnsafeError) throw e;
    throw clearFailure(session, operation, where, e);
  }
}

/** A folder made if missing (mode 0700), its entry made durable in its parent when made here. */
function ensureDir(dir) {
  try {
    fs.mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if (e.code === 'EEXIST') return;
    throw e;
  }
  fsyncDir(path.dirname(dir));
}

/**
 * The largest divert file a clear reads whole (docs/STORAGE.md, "Limits";
 * host/src/lines.rs MAX_WHOLE_FILE). Replay streams a file of any size.
 */
export const MAX_WHOLE_FILE = 256 << 20;

function tooLarge(file) {
  return Object.assign(new Error(`${file} is longer than the ${MAX_WHOLE_FILE} bytes read whole; run \`turnsafe replay\` first, which streams it`),
    { code: 'EFBIG' });
}

/** Read all of an open file, refusing one past MAX_WHOLE_FILE without holding more. */
function readAll(fd, file) {
  const chunks = [];
  const buf = Buffer.alloc(1 << 16);
  for (let pos = 0; ;) {
    const n = fs.readSync(fd, buf, 0, buf.length, pos);
    if (n === 0) return Buffer.concat(chunks);
    if (pos + n > MAX_WHOLE_FILE) throw tooLarge(file);
    chunks.push(Buffer.from(buf.subarray(0, n)));
    pos += n;
  }
}

/**
 * Take `session`'s divert file into settling/ (read under its flock first;
 * a foreign file is never touched) and read every file of the session in
 * settling/. Returns `[{name, file, data, lines, from}]`, `lines` as
 * divert_lines.js `readLine` reads them with their line number and
 * offset, `from` the name in sessions/ of the file this clear took.
 */
export function takeLines(home, session) {
  const sessions = path.join(home, 'sessions');
  const settling = path.join(sessions, 'settling');
  const file = path.join(sessions, `${session}.jsonl`);
  const taken = new Map();
  let fd = null;
  try {
    const { O_RDONLY, O_NOFOLLOW, O_NONBLOCK } = fs.constants;
    // Never through a symlink, and never blocking on a FIFO put there.
    fd = fs.openSync(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
  } catch (e) {
    // No file, or a symlink (foreign): nothing to take. Anything else is a
    // file this clear cannot read, and fails it.
    if (!['ENOENT', 'ENOTDIR', 'ELOOP'].includes(e.code)) throw clearFailure(session, 'open', file, e);
  }
  if (fd !== null) {
    try {
      const regular = step(session, 'stat', file, () => fs.fstatSync(fd).isFile());
      if (regular) {
        step(session, 'lock', file, () => flockExclusive(fd));
        // Under the lock no divert appends: these bytes are the whole file.
        const data = step(session, 'read', file, () => readAll(fd, file));
        if (ownsLines(data, session)) {
          step(session, 'mkdir', settling, () => {
            ensureDir(settling);
            ensureDir(path.join(sessions, 'settled'));
          });
          const name = freshName(settling, session);
          step(session, 'rename', file, () => fs.renameSync(file, path.join(settling, name)));
          taken.set(name, data);
        }
      }
    } finally {
      fs.closeSync(fd);
    }
    if (taken.size) {
      step(session, 'fsync', settling, () => {
        fsyncDir(settling);
        fsyncDir(sessions);
      });
    }
  }
  // The session's files an earlier clear or replay left in settling/.
  let names = [];
  try {
    names = fs.readdirSync(settling);
  } catch (e) {
    if (e.code !== 'ENOENT') throw clearFailure(session, 'list', settling, e);
  }
  const out = [];
  for (const name of names.sort()) {
    if (name.slice(0, name.indexOf('@')) !== session) continue;
    const at = path.join(settling, name);
    let data = taken.get(name);
    if (!data) {
      const st = step(session, 'stat', at, () => fs.lstatSync(at));
      if (!st.isFile()) continue;
      data = step(session, 'read', at, () => {
        if (st.size > MAX_WHOLE_FILE) throw tooLarge(at);
        return fs.readFileSync(at, { flag: fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK });
      });
    }
    const lines = splitLines(data).filter((l) => !l.blank).map((l) => ({ ...l, ...readLine(l.bytes, session) }));
    out.push({ name, file: at, data, lines, from: taken.has(name) ? file : null });
  }
  return out;
}

/**
 * The clear's edit failed: the file it took goes back to its name, unless
 * a writer has made a new file there since (it then stays in settling/,
 * where replay finds it). Pending either way, so nothing here can fail
 * the clear a second time.
 */
export function putBack(home, files) {
  const sessions = path.join(home, 'sessions');
  for (const f of files) {
    if (!f.from) continue;
    try {
      // A link never replaces a file at the name (Node has no renameat2).
      fs.linkSync(f.file, f.from);
      fs.unlinkSync(f.file);
    } catch {
      // stays in settling/, pending
    }
  }
  for (const dir of [path.join(sessions, 'settling'), sessions]) {
    try {
      fsyncDir(dir);
    } catch {
      // the names are pending in either place
    }
  }
}

/** A settling/ name no file has: `<session>@<ms>-<pid>.jsonl`. */
function freshName(settling, session) {
  const stamp = `${Date.now()}-${process.pid}`;
  for (let n = 0; ; n++) {
    const name = `${session}@${stamp}${n ? `-${n}` : ''}.jsonl`;
    try {
      fs.lstatSync(path.join(settling, name));
    } catch {
      return name;
    }
  }
}

/**
 * Settle the files `takeLines` read: the LangGraph lines written back to
 * the pending file, one ledger line per other line read (`cleared`, or
 * `quarantined` with its reason), and the file moved to settled/. Bytes a
 * writer appended to a taken file after it was read (one that opened it
 * before the take) are written back to the pending file too, never
 * settled unread. Returns how many lines were settled.
 */
export function settleLines(home, session, files) {
  const sessions = path.join(home, 'sessions');
  const settledDir = path.join(sessions, 'settled');
  const ledgerPath = path.join(sessions, LEDGER);
  let count = 0;
  if (files.length) step(session, 'mkdir', settledDir, () => ensureDir(settledDir));
  for (const f of files) {
    const graph = f.lines.filter((l) => l.kind === 'graph');
    if (graph.length) {
      // Written back (and fsynced) before the file is settled: a cut in
      // between leaves them twice, which replay stores once.
      const body = Buffer.concat(graph.map((l) => (l.bytes.at(-1) === 0x0a ? l.bytes : Buffer.concat([l.bytes, Buffer.from('\n')]))));
      step(session, 'keep the LangGraph lines of', f.name, () => appendBytes(home, session, body, graph.length));
    }
    const now = Date.now();
    const entries = f.lines.filter((l) => l.kind !== 'graph').map((l) => JSON.stringify({
      file: f.name, line: l.line, offset: l.offset, session, uid: l.uid,
      state: l.kind === 'message' ? 'cleared' : 'quarantined',
      reason: l.kind === 'message' ? 'the session was cleared' : l.reason, at_ms: now,
    }));
    if (entries.length) {
      step(session, 'write', ledgerPath, () => {
        const lfd = fs.openSync(ledgerPath, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT
          | fs.constants.O_NOFOLLOW, 0o600);
        try {
          const bytes = Buffer.from(`${entries.join('\n')}\n`);
          let done = 0;
          while (done < bytes.length) {
            const n = fs.writeSync(lfd, bytes, done, bytes.length - done);
            if (!(n > 0)) throw new Error('the write stored no bytes');
            done += n;
          }
          fs.fsyncSync(lfd);
        } finally {
          fs.closeSync(lfd);
        }
        // A ledger this clear created is only there once its entry is.
        fsyncDir(sessions);
      });
    }
    count += entries.length;
    step(session, 'settle', f.name, () => {
      const fd = fs.openSync(f.file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
      try {
        flockExclusive(fd);
        const size = fs.fstatSync(fd).size;
        if (size > f.data.length) {
          const extra = Buffer.alloc(size - f.data.length);
          let done = 0;
          while (done < extra.length) {
            const n = fs.readSync(fd, extra, done, extra.length - done, f.data.length + done);
            if (n === 0) throw new Error(`short read of ${f.name}`);
            done += n;
          }
          const lines = splitLines(extra).filter((l) => !l.blank);
          const body = Buffer.concat(lines.map((l) => (l.bytes.at(-1) === 0x0a ? l.bytes : Buffer.concat([l.bytes, Buffer.from('\n')]))));
          if (lines.length) appendBytes(home, session, body, lines.length);
        }
        // Renamed while still locked: nothing is appended to it in between.
        fs.renameSync(f.file, path.join(settledDir, f.name));
      } finally {
        fs.closeSync(fd);
      }
      fsyncDir(settledDir);
    });
  }
  if (files.length) step(session, 'fsync', 'settling/', () => fsyncDir(path.join(sessions, 'settling')));
  return count;
}

/** Host's clear: the rows and the lines read, archived together, then the lines settled (host.js). */
export const clearing = {
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
  },

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
  },
};
