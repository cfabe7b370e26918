// The durable divert (docs/DIVERT.md), as the native host writes it: one
// version-2 line per message in <home>/sessions/<session>.jsonl, opened
// O_APPEND|O_CREAT|O_NOFOLLOW|O_CLOEXEC with mode 0600 in a 0700 folder,
// held under an exclusive flock while appending; every byte written (a
// short write goes on from where it stopped), the file fsynced, then
// sessions/ and the home; only then the receipt. A failure after the first
// byte cuts the file back to where the batch began and fsyncs it; when that
// fails too, the residue (path, offset) is reported.
import { spawnSync } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** docs/DIVERT.md: 1 to 128 bytes of ASCII letters, digits, `-`, `_`, `.`, `:`; no leading `.`, no `..`. */
export const validSession = (s) => typeof s === 'string' && /^[A-Za-z0-9_.:-]{1,128}$/.test(s)
  && !s.startsWith('.') && !s.includes('..');

const { EINVAL, ELOOP, ENOTDIR, EPERM } = os.constants.errno;

/**
 * The longest divert line, newline included (docs/STORAGE.md, "Limits";
 * host/src/lines.rs MAX_DIVERT_LINE): replay reads no longer one, so a
 * batch holding one is handed back rather than copied.
 */
export const MAX_DIVERT_LINE = (32 << 20) + (64 << 10);

/** A failed divert step; `errno` is positive, or null. */
export function failed(operation, e, message) {
  const err = e instanceof Error ? e : new Error(message ?? String(e));
  const errno = typeof err.errno === 'number' ? Math.abs(err.errno) : null;
  return Object.assign(err, { operation, errno, residue: null, divert: true });
}

export function fsyncDir(dir) {
  const dfd = fs.openSync(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
  try {
    fs.fsyncSync(dfd);
  } finally {
    fs.closeSync(dfd);
  }
}

/**
 * Take an exclusive flock on the open file description behind `fd`. Node
 * has no flock(2); util-linux `flock` is given a duplicate of the
 * descriptor (its fd 3) and locks the shared open file description, so the
 * lock stays ours, held by `fd`, after it exits, and goes when `fd` is closed.
 * The same lock replay takes before it renames a divert file.
 */
export function flockExclusive(fd) {
  const r = spawnSync('flock', ['--exclusive', '3'], { stdio: ['ignore', 'ignore', 'pipe', fd] });
  if (r.error) {
    const e = r.error;
    throw Object.assign(new Error(`flock: ${e.message}`), { errno: e.errno, code: e.code });
  }
  if (r.status !== 0) {
    throw new Error(`flock exited ${r.status}: ${String(r.stderr ?? '').trim()}`);
  }
}

// A write may store fewer bytes than asked (a file size limit, a full
// disk): go on from where it stopped until every byte is written or a call fails.
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

function cutBack(fd, size) {
  try {
    fs.ftruncateSync(fd, size);
    fs.fsyncSync(fd);
    return true;
  } catch {
    return false;
  }
}

/** UTC now, RFC 3339 with milliseconds. */
export const rfc3339 = () => new Date().toISOString();

/**
 * Append `lines` ({uid, seq, message}) for `session` under `home/sessions`,
 * labelled with `cause`; return the receipt, or throw an error with
 * `operation`, `errno` and `residue`.
 */
export function divert(home, session, cause, lines) {
  if (!validSession(session)) {
    throw Object.assign(failed('validate', null, 'invalid session id'), { errno: EINVAL });
  }
  const at = rfc3339();
  const batch = randomUUID().replaceAll('-', '');
  let body;
  try {
    body = Buffer.from(lines
      .map((l) => JSON.stringify({ v: 2, session, uid: l.uid, seq: l.seq, batch, cause, at, message: l.message }) + '\n')
      .join(''));
  } catch (e) {
    throw failed('encode', e);
  }
  for (let start = 0; start < body.length;) {
    const end = body.indexOf(0x0a, start) + 1;
    if (end - start > MAX_DIVERT_LINE) {
      throw failed('encode', null, `a divert line of ${end - start} bytes is longer than the limit of ${MAX_DIVERT_LINE} bytes`);
    }
    start = end;
  }
  return appendBytes(home, session, body, lines.length);
}

/**
 * Open `<session>.jsonl` for appending and take its flock. A clear or a
 * replay may take the file (rename it into settling/) between the open
 * and the lock: then the descriptor is not the file at the path any more,
 * and lines appended through it would land in a file already read. So the
 * lock only counts once the locked file is still the one at the path.
 */
function openLocked(file, folderOwner) {
  const { O_RDWR, O_APPEND, O_CREAT, O_NOFOLLOW, O_NONBLOCK } = fs.constants;
  for (let attempt = 0; ; attempt++) {
    let fd;
    try {
      // Node opens every file O_CLOEXEC; O_NONBLOCK: a FIFO is never waited on.
      fd = fs.openSync(file, O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK, 0o600);
    } catch (e) {
      throw failed('open', e);
    }
    let same = false;
    try {
      refuseForeign(fd, file, folderOwner);
      try {
        flockExclusive(fd);
      } catch (e) {
        throw failed('lock', e);
      }
      const held = fs.fstatSync(fd, { bigint: true });
      let now = null;
      try {
        now = fs.lstatSync(file, { bigint: true });
      } catch {
        now = null;
      }
      same = now !== null && now.ino === held.ino && now.dev === held.dev;
      if (!same && attempt >= 100) throw failed('lock', null, 'the divert file kept being taken away while it was being locked');
    } catch (e) {
      fs.closeSync(fd);
      throw e.divert ? e : failed('stat', e);
    }
    if (same) return fd;
    fs.closeSync(fd);
  }
}

/**
 * Only a regular file of this user's (or the folder owner's) holds a copy:
 * a FIFO would take the lines into a pipe (and block a large write), and
 * another user could read every copy put in a file of theirs.
 */
function refuseForeign(fd, file, folderOwner) {
  let st;
  try {
    st = fs.fstatSync(fd);
  } catch (e) {
    throw failed('stat', e);
  }
  if (!st.isFile()) {
    const what = st.isFIFO() ? 'a FIFO' : st.isDirectory() ? 'a folder' : st.isSocket() ? 'a socket' : 'a device';
    throw failed('open', null, `${file} is ${what}, not a regular file`);
  }
  const me = process.geteuid();
  if (st.uid !== me && st.uid !== folderOwner) {
    throw Object.assign(failed('open', null,
      `${file} belongs to uid ${st.uid}, not to this process's user (uid ${me}) or the folder's owner`), { errno: EPERM });
  }
}

/** `sessions/` must be a real folder, never a symlink to somewhere else; its owner. */
function realFolder(folder) {
  let st;
  try {
    st = fs.lstatSync(folder);
  } catch (e) {
    throw failed('stat', e);
  }
  if (st.isDirectory()) return st.uid;
  const link = st.isSymbolicLink();
  throw Object.assign(failed('open', null,
    `${folder} is ${link ? 'a symbolic link' : 'not a folder'}: divert files are written only into a real folder`),
  { errno: link ? ELOOP : ENOTDIR });
}

/**
 * Append `body` (whole lines, `count` of them) to `home/sessions/<session>.jsonl`
 * under its flock: every byte written, the file fsynced, then sessions/
 * and the home; the receipt. On failure the file is cut back to where
 * the lines began.
 */
export function appendBytes(home, session, body, count) {
  if (!validSession(session)) {
    throw Object.assign(failed('validate', null, 'invalid session id'), { errno: EINVAL });
  }
  const folder = path.join(home, 'sessions');
  try {
    fs.mkdirSync(folder, { mode: 0o700 });
  } catch (e) {
    if (e.code !== 'EEXIST') throw failed('mkdir', e);
  }
  const owner = realFolder(folder);
  const file = path.join(folder, `${session}.jsonl`);
  const fd = openLocked(file, owner);
  try {
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
      // Bytes of this batch may be in the file with no receipt to vouch for them.
      if (!cutBack(fd, size)) e.residue = { path: path.resolve(file), offset };
      throw e;
    }
    return {
      path: path.resolve(file),
      offset,
      length: body.length,
      count,
      sha256: createHash('sha256').update(body).digest('hex'),
    };
  } finally {
    try {
      fs.closeSync(fd);
    } catch {
      // the descriptor is gone either way
    }
  }
}

/** The highest seq already promised to diverted lines of `session` (pending or being replayed). */
export function divertMaxSeq(home, session) {
  const folder = path.join(home, 'sessions');
  const files = [path.join(folder, `${session}.jsonl`)];
  try {
    for (const name of fs.readdirSync(path.join(folder, 'settling'))) {
      const at = name.indexOf('@');
      if (at > 0 && name.slice(0, at) === session && name.endsWith('.jsonl')) files.push(path.join(folder, 'settling', name));
    }
  } catch {
    // no settling folder
  }
  let max = null;
  for (const f of files) {
    let text;
    try {
      text = fs.readFileSync(f, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n')) {
      if (!line) continue;
      try {
        const seq = JSON.parse(line).seq;
        if (Number.isInteger(seq) && (max === null || seq > max)) max = seq;
      } catch {
        // a torn line holds no promise
      }
    }
  }
  return max;
}

/** Host's divert step of a flush: the batch's lines written at the seqs it would have had (host.js). */
export const diverting = {
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
  },
};
