// One side of one round of benches/overhead: K sessions adding batches at
// once (closed loop, each session sends its next batch once the last was
// stored) into a fresh folder under DIR, after untimed batches (WARMUP, 100
// in all by default, split over the sessions, at least one each): V8 runs
// a function and the component's WebAssembly on its baseline tier until it
// is hot, so the first batches of a process measure the compiler, not the
// store, on every side alike.
// Prints one JSON line: {"wall": seconds, "cpu": seconds, "batches": n,
// "loop_max_ms": ms}, `cpu` being the process's CPU time (every thread,
// user and system) in the timed part, and `loop_max_ms` the longest the
// event loop went without turning while it ran (a 1 ms interval timer's
// largest gap).
//
//   node bench/overhead.mjs SIDE DIR K BATCHES
//
// SIDE:
// - `turnsafe`: TurnsafeSession as by default (its worker thread, the
//   typed flush machine on the commit road);
// - `turnsafe-json`: the same, every flush step through flush-step-json
//   (`typedFlush: false`), to weigh the two ways into the component;
// - `turnsafe-sync`: TurnsafeSession with `thread: false` and addItemsSync,
//   the store in the calling thread;
// - `floor`: the statements turnsafe runs for a batch, with nothing else,
//   through better-sqlite3 in the calling thread on turnsafe's own schema
//   (BEGIN IMMEDIATE, the session's next seq and its lease, the session
//   row at its first batch, one INSERT a message with a fresh uid, COMMIT;
//   foreign keys on);
// - `plain`: the Session the Agents SDK's docs show, over better-sqlite3 on
//   a three-column table (one transaction a batch).
// All WAL, synchronous=FULL.
import Database from 'better-sqlite3';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

import { TurnsafeSession } from '../src/index.js';
import { textOf } from '../src/projection.js';
import { migrate } from '../src/schema.js';

const SIDES = ['turnsafe', 'turnsafe-json', 'turnsafe-sync', 'floor', 'plain'];
const [side, dir, kText, perText] = process.argv.slice(2);
const k = Number(kText);
const per = Number(perText);
if (!SIDES.includes(side) || !dir || !(k > 0) || !(per > 0)) {
  console.error(`usage: node bench/overhead.mjs ${SIDES.join('|')} DIR K BATCHES`);
  process.exit(2);
}

function batch(c, b) {
  return Array.from({ length: 10 }, (_, i) => ({
    role: i % 2 ? 'assistant' : 'user',
    content: `client ${c} batch ${b} message ${i} ${'x'.repeat(200)}`,
  }));
}

class PlainSession {
  constructor(sessionId, db) {
    this.sessionId = sessionId;
    const insert = db.prepare('INSERT INTO items(session_id, item) VALUES (?, ?)');
    this.add = db.transaction((items) => {
      for (const item of items) insert.run(sessionId, JSON.stringify(item));
    });
  }

  async addItems(items) {
    this.add(items);
  }
}

/** The floor: what a TurnsafeSession's write runs in SQLite for a batch, and nothing else. */
class FloorSession {
  constructor(sessionId, db) {
    this.sessionId = sessionId;
    this.db = db;
    this.st = db.floor ??= {
      begin: db.prepare('BEGIN IMMEDIATE'),
      commit: db.prepare('COMMIT'),
      maxSeq: db.prepare('SELECT COALESCE(MAX(seq), 0) + 1 AS s FROM messages WHERE session_id = ?'),
      lease: db.prepare('SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = ?'),
      newSession: db.prepare('INSERT INTO sessions(id, created_ms, lease_token, lease_holder, lease_expires_ms) VALUES (?, ?, ?, ?, ?)'),
      insert: db.prepare('INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?)'),
    };
  }

  async addItems(items) {
    const { st } = this;
    const now = Date.now();
    st.begin.run();
    try {
      let seq = st.maxSeq.get(this.sessionId).s;
      if (!st.lease.get(this.sessionId)) st.newSession.run(this.sessionId, now, randomUUID().replaceAll('-', ''), 'floor', now + 30_000);
      for (const m of items) {
        st.insert.run(this.sessionId, randomUUID().replaceAll('-', ''), seq, m.role, textOf(m.content), JSON.stringify(m), now);
        seq += 1;
      }
      st.commit.run();
    } catch (e) {
      if (this.db.inTransaction) this.db.exec('ROLLBACK');
      throw e;
    }
  }
}

const home = fs.mkdtempSync(path.join(dir, `js-${side}-`));
let sessions;
let close;
if (side === 'plain' || side === 'floor') {
  const db = new Database(path.join(home, side === 'plain' ? 'items.db' : 'state.db'));
  if (side === 'plain') {
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
    db.exec('CREATE TABLE items(id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, item TEXT NOT NULL)');
    db.exec('CREATE INDEX items_by_session ON items(session_id, id)');
    sessions = Array.from({ length: k }, (_, c) => new PlainSession(`c${c}`, db));
  } else {
    db.pragma('foreign_keys = ON');
    migrate(db);
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
    sessions = Array.from({ length: k }, (_, c) => new FloorSession(`c${c}`, db));
  }
  close = async () => db.close();
} else {
  const options = { 'turnsafe-json': { typedFlush: false }, 'turnsafe-sync': { thread: false } }[side] ?? {};
  sessions = Array.from({ length: k }, (_, c) => new TurnsafeSession(`c${c}`, home, options));
  if (side === 'turnsafe-sync') {
    for (const s of sessions) s.addItems = async (items) => s.addItemsSync(items);
  }
  close = async () => {
    for (const s of sessions) await s.close();
  };
}

const warm = Math.max(1, Math.ceil(Number(process.env.WARMUP ?? 100) / k));
await Promise.all(sessions.map(async (s, c) => {
  for (let b = -warm; b < 0; b++) await s.addItems(batch(c, b));
}));
let last = performance.now();
let worst = 0;
const timer = setInterval(() => {
  const now = performance.now();
  worst = Math.max(worst, now - last);
  last = now;
}, 1);
const c0 = process.cpuUsage();
const t0 = performance.now();
await Promise.all(
  sessions.map(async (s, c) => {
    for (let b = 0; b < per; b++) await s.addItems(batch(c, b));
  }),
);
const wall = (performance.now() - t0) / 1000;
const used = process.cpuUsage(c0);
clearInterval(timer);
worst = Math.max(worst, performance.now() - last);
await close();
fs.rmSync(home, { recursive: true, force: true });
console.log(JSON.stringify({ wall, cpu: (used.user + used.system) / 1e6, batches: k * per, loop_max_ms: worst }));
