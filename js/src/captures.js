// Captures of retired generations under a home (state.db.retired-*/), and
// the pending-capture rule: an unsettled capture whose manifest says it
// holds rows of a session that the database lacks (`missing_rows`; a
// manifest without it, or unreadable, holds every session) stops that
// session's writes (the flush machine diverts them with the capture's
// cause) and its reads (HistoryIncomplete). As host/src/captures.rs.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import Database from 'better-sqlite3';

import { fsyncDir } from './divert.js';
import { version } from './policy.js';

export const PREFIX = 'state.db.retired-';
export const MARKER = 'SETTLED';

const CAUSES = new Set(['locked', 'disk', 'disk_full', 'replaced', 'deleted_wal', 'corrupt', 'fts_index', 'turn_lease',
  'compression', 'compression_closed', 'session_row_missing', 'uid_conflict', 'unavailable', 'read_only',
  'outcome_unknown', 'unknown']);

/** A marker is proof only when it reads as one (host/src/captures.rs `Settled`). */
function settled(dir) {
  let m;
  try {
    m = JSON.parse(fs.readFileSync(path.join(dir, MARKER), 'utf8'));
  } catch {
    return false;
  }
  return m !== null && typeof m === 'object' && Number.isInteger(m.format) && m.format >= 0
    && typeof m.settled_at === 'string' && (m.how === 'installed' || m.how === 'dismissed')
    && Number.isInteger(m.carried_over) && m.carried_over >= 0 && Number.isInteger(m.pid) && m.pid >= 0
    && typeof m.turnsafe === 'string';
}

/** The unsettled captures under `home` that hold rows of some session: `{path, cause, sessions}`. */
export function holds(home) {
  let entries;
  try {
    entries = fs.readdirSync(home, { withFileTypes: true });
  } catch (e) {
    if (e.code === 'ENOENT') return [];
    // The open that follows meets whatever keeps the home from being read.
    return [];
  }
  const out = [];
  for (const e of entries.filter((d) => d.name.startsWith(PREFIX) && d.isDirectory()).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const dir = path.resolve(home, e.name);
    if (settled(dir)) continue;
    let cause = 'unknown';
    let sessions = null;
    try {
      const m = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'));
      if (typeof m.cause === 'string' && CAUSES.has(m.cause)) cause = m.cause;
      if (m.missing_rows && typeof m.missing_rows === 'object') {
        sessions = Object.fromEntries(Object.entries(m.missing_rows).filter(([, n]) => n > 0));
      }
    } catch {
      // unreadable: it holds every session
    }
    if (sessions === null || Object.keys(sessions).length > 0) out.push({ path: dir, cause, sessions });
  }
  return out;
}

/**
 * How old a change stamp must be, when read, to prove that a later change
 * moves it, on a filesystem not listed below: above the coarsest timestamp
 * granularity of a local or network filesystem (FAT's two seconds). On the
 * local filesystems that stamp from the kernel's clock (a tick of at most
 * 10 ms), 50 ms. As host/src/stamps.rs `RACY`, `RACY_LOCAL`, `racy_for`.
 */
export const RACY_MS = 3000;
export const RACY_LOCAL_MS = 50;
// statfs magic numbers: ext2/3/4, XFS, Btrfs, F2FS, tmpfs.
const LOCAL = new Set([0xef53, 0x58465342, 0x9123683e, 0xf2f52010, 0x01021994]);

/** The racy window (ms) for stamps of files on the filesystem that holds `p`. */
export function racyFor(p) {
  try {
    return LOCAL.has(Number(fs.statfsSync(p).type)) ? RACY_LOCAL_MS : RACY_MS;
  } catch {
    return RACY_MS;
  }
}

/** A file's identity, link count and change times (ns), not following a final link; null when nothing is there. */
function stampAt(p) {
  try {
    const st = fs.lstatSync(p, { bigint: true });
    return { dev: st.dev, ino: st.ino, nlink: st.nlink, mtime: st.mtimeNs, ctime: st.ctimeNs };
  } catch (e) {
    if (e.code === 'ENOENT' || e.code === 'ENOTDIR') return null;
    throw e;
  }
}

const sameStamp = (a, b) => a !== null && b !== null && a.dev === b.dev && a.ino === b.ino && a.nlink === b.nlink
  && a.mtime === b.mtime && a.ctime === b.ctime;

/**
 * `holds(home)`, read again only when the home or one of its capture folders
 * changed since the last read. A capture appears in, or leaves, the home by
 * a new folder or a rename, and its manifest and marker each arrive by a
 * rename into its folder: each moves a stamp watched here. A stamp read
 * while it was young proves nothing (a change in the same tick of a coarse
 * clock leaves it as it was), so it is trusted only once `racyMs` old.
 * As host/src/captures.rs `HoldsWatch`.
 */
export class HoldsWatch {
  /** `racyMs`: the window to trust a stamp after; by default the home's filesystem's (racyFor). */
  constructor(racyMs = null) {
    this.racyNs = racyMs === null ? null : BigInt(racyMs) * 1000000n;
    this.seen = null;
    this.reads = 0;
  }

  holds(home) {
    const readAt = BigInt(Date.now()) * 1000000n;
    let homeStamp;
    try {
      homeStamp = stampAt(home);
    } catch {
      this.seen = null;
      return holds(home);
    }
    if (homeStamp === null) {
      this.seen = null;
      return [];
    }
    const still = ([p, s]) => {
      try {
        return sameStamp(stampAt(p), s);
      } catch {
        return false;
      }
    };
    if (this.seen && sameStamp(this.seen.home, homeStamp) && this.seen.folders.every(still)) return this.seen.holds;
    this.seen = null;
    this.reads += 1;
    // Each stamp is read before what it stands for, so a change made during
    // the read moves a stamp the next look compares.
    const folders = [];
    try {
      for (const e of fs.readdirSync(home, { withFileTypes: true })) {
        if (!e.name.startsWith(PREFIX) || !e.isDirectory()) continue;
        const p = path.join(home, e.name);
        const s = stampAt(p);
        if (s) folders.push([p, s]);
      }
    } catch {
      return holds(home);
    }
    const found = holds(home);
    this.racyNs ??= BigInt(racyFor(home)) * 1000000n;
    const old = (s) => readAt - (s.mtime > s.ctime ? s.mtime : s.ctime) > this.racyNs;
    if (old(homeStamp) && folders.every(([, s]) => old(s))) this.seen = { home: homeStamp, folders, holds: found };
    return found;
  }
}

export const holdsSession = (h, session) => h.sessions === null || (h.sessions[session] ?? 0) > 0;

/** The hold as reads report it: `{path, cause, rows}`. */
export const holdValue = (h, session) => ({ path: h.path, cause: h.cause,
  rows: h.sessions === null ? null : (h.sessions[session] ?? 0) });

/** `yyyymmddThhmmssZ`. */
const stamp = () => new Date().toISOString().replace(/\.\d+Z$/, 'Z').replaceAll('-', '').replaceAll(':', '');

function startTime(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const n = Number(stat.slice(stat.lastIndexOf(')') + 1).trim().split(/\s+/)[19]);
    return Number.isFinite(n) ? n : null;
  } catch {
    return null;
  }
}

function captureError(operation, file, e) {
  const err = e instanceof Error ? e : new Error(String(e));
  return {
    operation,
    errno: typeof err.errno === 'number' ? Math.abs(err.errno) : null,
    error: `capture of the retired generation failed at ${operation}${file ? ` ${file}` : ''}: ${err.message}`,
  };
}

function writeDurably(dir, name, data) {
  const tmp = path.join(dir, `.${name}.tmp`);
  let fd;
  const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
  try {
    fd = fs.openSync(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
  } catch (e) {
    throw captureError('create', name, e);
  }
  try {
    let done = 0;
    while (done < data.length) {
      let n;
      try {
        n = fs.writeSync(fd, data, done, data.length - done);
      } catch (e) {
        throw captureError('write', name, e);
      }
      if (!(n > 0)) throw captureError('write', name, new Error('the write stored no bytes'));
      done += n;
    }
    try {
      fs.fsyncSync(fd);
    } catch (e) {
      throw captureError('fsync', name, e);
    }
  } finally {
    fs.closeSync(fd);
  }
  try {
    fs.renameSync(tmp, path.join(dir, name));
  } catch (e) {
    throw captureError('rename', name, e);
  }
}

/** Read a whole file through a held descriptor; a short read is an error. */
function readThrough(fd) {
  const size = Number(fs.fstatSync(fd).size);
  const buf = Buffer.alloc(size);
  let done = 0;
  while (done < size) {
    const n = fs.readSync(fd, buf, done, size - done, done);
    if (n === 0) throw new Error(`short read: ${done} of ${size} bytes through fd ${fd}`);
    done += n;
  }
  return buf;
}

function rowsOf(db) {
  const conn = new Database(db, { fileMustExist: true });
  try {
    const has = conn.prepare("SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name = 'messages'").get().n;
    if (!has) return new Set();
    return new Set(conn.prepare('SELECT session_id, uid FROM messages').raw().all().map(([s, u]) => JSON.stringify([s, u])));
  } finally {
    conn.close();
  }
}

/** Rows of the captured generation that the database now at `current` lacks, by session. */
function missingRows(captureDir, current) {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'turnsafe-capture-'));
  try {
    const copy = (from, name, required) => {
      try {
        fs.copyFileSync(from, path.join(work, name));
      } catch (e) {
        if (required || e.code !== 'ENOENT') throw e;
      }
    };
    copy(path.join(captureDir, 'state.db'), 'cap.db', true);
    copy(path.join(captureDir, 'state.db-wal'), 'cap.db-wal', false);
    const captured = rowsOf(path.join(work, 'cap.db'));
    let now = new Set();
    if (fs.existsSync(current)) {
      copy(current, 'cur.db', true);
      copy(`${current}-wal`, 'cur.db-wal', false);
      now = rowsOf(path.join(work, 'cur.db'));
    }
    const missing = {};
    for (const row of captured) {
      if (now.has(row)) continue;
      const [s] = JSON.parse(row);
      missing[s] = (missing[s] ?? 0) + 1;
    }
    return { missing_rows: Object.fromEntries(Object.entries(missing).sort()), missing_rows_error: null };
  } catch (e) {
    return { missing_rows: null, missing_rows_error: `the captured generation cannot be read: ${e.message}` };
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

/**
 * Copy the files the guard recorded, through the descriptors this process
 * holds (chosen by identity, never by path), into
 * `<home>/state.db.retired-<UTC>-<pid>/`: each to a temporary name, fsynced
 * and renamed, then the manifest, then the folder and the home fsynced.
 * Returns `{receipt}` or `{error: {operation, errno, error}}`.
 */
export function capture(guard, why, version) {
  const files = [];
  for (let i = 0; i < 3; i++) {
    const held = guard.files[i];
    if (!held) continue;
    const name = `state.db${['', '-wal', '-shm'][i]}`;
    if (held.fd == null) {
      // Node found no descriptor of this process holding it: nothing to
      // read through, and a copy by path would be the wrong file.
      if (i === 0) continue;
      return { error: { operation: 'read', errno: null,
        error: `capture of the retired generation failed at read ${name}: this process holds no descriptor of it (nothing found in /proc/self/fd)` } };
    }
    try {
      files.push({ name, data: readThrough(held.fd), id: held.id, fd: held.fd });
    } catch (e) {
      return { error: captureError('read', name, e) };
    }
  }
  if (files.length === 0) {
    return { error: { operation: 'read', errno: null,
      error: 'capture of the retired generation failed at read: this process holds no descriptor of the files' } };
  }
  const parent = path.dirname(guard.dbPath);
  let dir = null;
  for (let n = 1; n <= 64 && dir === null; n++) {
    const s = stamp();
    const candidate = path.join(parent, n === 1 ? `${PREFIX}${s}-${process.pid}` : `${PREFIX}${s}.${n}-${process.pid}`);
    try {
      fs.mkdirSync(candidate, { mode: 0o700 });
      dir = candidate;
    } catch (e) {
      if (e.code !== 'EEXIST' || n === 64) return { error: captureError('mkdir', null, e) };
    }
  }
  try {
    const manifestFiles = [];
    for (const f of files) {
      writeDurably(dir, f.name, f.data);
      manifestFiles.push({ name: f.name, dev: Number(f.id.dev), ino: Number(f.id.ino), fd: f.fd, size: f.data.length,
        sha256: createHash('sha256').update(f.data).digest('hex') });
    }
    const missing = missingRows(dir, guard.dbPath);
    const manifest = {
      format: 1,
      trigger: why.trigger,
      cause: why.cause,
      evidence: why.evidence,
      source: guard.dbPath,
      generation: guard.generation,
      pid: process.pid,
      pid_start: startTime(process.pid),
      captured_by: process.pid,
      ...missing,
      captured_at: new Date().toISOString(),
      files: manifestFiles,
      versions: { turnsafe: version, sqlite: 'better-sqlite3', host: 'turnsafe-store (node)' },
    };
    const text = Buffer.from(JSON.stringify(manifest, null, 2));
    writeDurably(dir, 'manifest.json', text);
    try {
      fsyncDir(dir);
      fsyncDir(parent);
    } catch (e) {
      throw captureError('fsync_dir', null, e);
    }
    return { receipt: { path: dir, files: files.map((f) => ({ name: f.name, size: f.data.length })),
      manifest_sha256: createHash('sha256').update(text).digest('hex') } };
  } catch (e) {
    return { error: e.operation ? e : captureError('write', null, e) };
  }
}

/** Host's capture step of a flush: the retired generation copied once per handle (host.js). */
export const capturing = {
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
  },
};
