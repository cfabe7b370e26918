// The WAL-generation guard with what Node can see. In WAL mode SQLite
// reports no error when state.db, -wal or -shm is deleted, moved or
// replaced under a live connection; committed frames are then lost
// silently. At open the guard records the identity (dev, ino) of the three
// files, the descriptors of this process that hold them (found once in
// /proc/self/fd) and the generation in the header (application_id, bytes
// 68-71, read through the held descriptor). Before every write, under the
// write lock, and before close it reads the held descriptors' links and the
// header; only when a link no longer names its file does it compare the
// paths (stat) and the held descriptors (fstat: identity and link count) to
// tell what changed. A commit never stats the WAL (see linkIs).
//
// Unlike the native guard it cannot ask SQLite for SQLITE_FCNTL_HAS_MOVED
// (better-sqlite3 has no file control); the path and descriptor checks,
// which the native guard runs first, answer every case that one does.
import fs from 'node:fs';

export const PARTS = ['', '-wal', '-shm'];

const idOf = (st) => ({ dev: st.dev, ino: st.ino });
const same = (a, b) => a.dev === b.dev && a.ino === b.ino;

function statId(p) {
  try {
    return idOf(fs.statSync(p, { bigint: true }));
  } catch (e) {
    if (e.code === 'ENOENT') return null;
    throw probeError('stat', e);
  }
}

function probeError(probe, e) {
  return Object.assign(new Error(`guard probe \`${probe}\` failed: ${e.message}`), { probe, errno: e.errno, cause: e });
}

/**
 * The descriptors of this process whose link is `p` (or `p (deleted)`) and
 * whose identity is `id`, those not in `others` first: other connections
 * of this process (another store on the same home) hold descriptors of the
 * same files, and the guard must watch its own connection's.
 */
function findFd(p, id, others = new Set()) {
  const all = fdsOf(p, id);
  return all.find((fd) => !others.has(fd)) ?? all[0] ?? null;
}

/** Every descriptor of this process open on path `p` (with identity `id`, when given). */
export function fdsOf(p, id = null) {
  let names;
  try {
    names = fs.readdirSync('/proc/self/fd');
  } catch (e) {
    throw probeError('scan /proc/self/fd', e);
  }
  const out = [];
  for (const name of names) {
    const fd = Number(name);
    if (!Number.isInteger(fd)) continue;
    let target;
    try {
      target = fs.readlinkSync(`/proc/self/fd/${name}`);
    } catch {
      continue;
    }
    if (target.endsWith(' (deleted)')) target = target.slice(0, -' (deleted)'.length);
    if (target !== p) continue;
    if (id === null) {
      out.push(fd);
      continue;
    }
    try {
      if (same(idOf(fs.fstatSync(fd, { bigint: true })), id)) out.push(fd);
    } catch {
      // closed meanwhile
    }
  }
  return out;
}

/**
 * Whether descriptor `fd` still holds the file named `p`, told by its link
 * alone. A link that reads exactly `p` means the name resolves to the file
 * the descriptor holds: a file deleted, renamed away or replaced at its
 * name reads `p (deleted)` or another name, and a number reused for
 * another file reads that file's name. Unlike a stat, reading a link asks
 * for no time stamp: on filesystems with multigrain timestamps (ext4 since
 * Linux 6.13) a stat of the WAL marks its times as read, so every later
 * write stamps a new fine-grained mtime and each commit's sync writes the
 * inode out too.
 */
function linkIs(fd, p) {
  try {
    return fs.readlinkSync(`/proc/self/fd/${fd}`) === p;
  } catch {
    return false;
  }
}

function headerGeneration(fd) {
  const buf = Buffer.alloc(4);
  const n = fs.readSync(fd, buf, 0, 4, 68);
  if (n !== 4) throw new Error('short header read');
  return buf.readInt32BE(0);
}

export class Guard {
  /**
   * Record the files as they are now; `dbPath` is made absolute and
   * resolved. `others` are descriptors of these files this process held
   * before the connection opened (another connection's), watched only when
   * no other descriptor holds the file.
   */
  constructor(dbPath, db, others = new Set()) {
    this.others = others;
    try {
      this.dbPath = fs.realpathSync(dbPath);
    } catch (e) {
      throw probeError('canonicalize', e);
    }
    this.files = [null, null, null];
    for (let i = 0; i < 3; i++) this.recordPart(i);
    const main = this.files[0];
    if (main?.fd != null) {
      try {
        this.generation = headerGeneration(main.fd);
      } catch (e) {
        throw probeError('pread header', e);
      }
    } else {
      this.generation = db.pragma('application_id', { simple: true });
    }
  }

  path(i) {
    return this.dbPath + PARTS[i];
  }

  recordPart(i) {
    const id = statId(this.path(i));
    if (id) this.files[i] = { id, fd: findFd(this.path(i), id, this.others) };
  }

  /**
   * fstat of the descriptor that holds part `i`. A descriptor that is gone
   * (EBADF) or now holds another file was another connection's of this
   * process, which closed it: the one that holds the recorded file is
   * looked up again. null when no descriptor of this process holds it.
   */
  heldStat(i, probe) {
    const held = this.files[i];
    try {
      const st = fs.fstatSync(held.fd, { bigint: true });
      if (same(idOf(st), held.id)) return st;
    } catch (e) {
      if (e.code !== 'EBADF') throw probeError(probe, e);
    }
    const fd = findFd(this.path(i), held.id, this.others);
    if (fd === null) return null;
    held.fd = fd;
    try {
      return fs.fstatSync(fd, { bigint: true });
    } catch (e) {
      throw probeError(probe, e);
    }
  }

  /** `null` when intact, else `{evidence, detail}`; throws an error with `probe` when a probe fails. */
  check() {
    const replaced = (detail) => ({ evidence: 'db_replaced', detail });
    const deleted = (detail) => ({ evidence: 'deleted_wal_generation', detail });
    const main = this.files[0];
    if (!main) return replaced('state.db was not there when the handle opened');
    // The quiet path: each held descriptor's link names its file, and the
    // header is the one recorded. Anything else is told apart below.
    if (main.fd != null && linkIs(main.fd, this.dbPath)
      && [1, 2].every((i) => this.files[i]?.fd != null && linkIs(this.files[i].fd, this.path(i)))) {
      let g;
      try {
        g = headerGeneration(main.fd);
      } catch (e) {
        throw probeError('pread header', e);
      }
      if (g !== this.generation) return replaced("the header's generation changed (the file was overwritten)");
      return null;
    }
    const now = statId(this.dbPath);
    if (!now) return replaced('state.db is gone from its path');
    if (!same(now, main.id)) return replaced(`state.db at the path is inode ${now.ino} not ${main.id.ino}`);
    if (main.fd != null) {
      const st = this.heldStat(0, 'fstat state.db');
      if (!st) return replaced(`no descriptor of this process holds the state.db it opened (inode ${main.id.ino})`);
      if (st.nlink === 0n) return replaced('the held state.db has no links left');
      let g;
      try {
        g = headerGeneration(main.fd);
      } catch (e) {
        throw probeError('pread header', e);
      }
      if (g !== this.generation) return replaced("the header's generation changed (the file was overwritten)");
    }
    for (const i of [1, 2]) {
      const held = this.files[i];
      const at = statId(this.path(i));
      if (!held && !at) continue;
      if (!held) {
        // A sidecar appeared since open: record it now.
        this.recordPart(i);
        continue;
      }
      if (!at) return deleted(`state.db${PARTS[i]} is gone from its path (held inode ${held.id.ino})`);
      if (!same(at, held.id)) return deleted(`state.db${PARTS[i]} at the path is inode ${at.ino} not ${held.id.ino}`);
      if (held.fd != null) {
        const st = this.heldStat(i, 'fstat sidecar');
        if (!st || st.nlink === 0n) return deleted(`the held state.db${PARTS[i]} was unlinked`);
      }
    }
    return null;
  }
}
