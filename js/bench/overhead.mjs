// One side of one round of benches/overhead: K sessions adding batches at
// once (closed loop, each session sends its next batch once the last was
// stored) into a fresh folder under DIR, after one untimed batch each.
// Prints one JSON line: {"wall": seconds, "batches": n, "loop_max_ms": ms}.
//
//   node bench/overhead.mjs turnsafe|plain DIR K BATCHES
//
// `turnsafe` is TurnsafeSession (its worker, as by default); `plain` is the
// Session the Agents SDK's docs show, over better-sqlite3 on a three-column
// table (WAL, synchronous=FULL, one transaction a batch).
import Database from 'better-sqlite3';
import fs from 'node:fs';
import path from 'node:path';

import { TurnsafeSession } from '../src/index.js';

const [side, dir, kText, perText] = process.argv.slice(2);
const k = Number(kText);
const per = Number(perText);
if (!['turnsafe', 'plain'].includes(side) || !dir || !(k > 0) || !(per > 0)) {
  console.error('usage: node bench/overhead.mjs turnsafe|plain DIR K BATCHES');
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

const home = fs.mkdtempSync(path.join(dir, `js-${side}-`));
let sessions;
let close;
if (side === 'plain') {
  const db = new Database(path.join(home, 'items.db'));
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.exec('CREATE TABLE items(id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, item TEXT NOT NULL)');
  db.exec('CREATE INDEX items_by_session ON items(session_id, id)');
  sessions = Array.from({ length: k }, (_, c) => new PlainSession(`c${c}`, db));
  close = async () => db.close();
} else {
  sessions = Array.from({ length: k }, (_, c) => new TurnsafeSession(`c${c}`, home));
  close = async () => {
    for (const s of sessions) await s.close();
  };
}

await Promise.all(sessions.map((s, c) => s.addItems(batch(c, -1))));
let last = performance.now();
let worst = 0;
const timer = setInterval(() => {
  const now = performance.now();
  worst = Math.max(worst, now - last);
  last = now;
}, 1);
const t0 = performance.now();
await Promise.all(
  sessions.map(async (s, c) => {
    for (let b = 0; b < per; b++) await s.addItems(batch(c, b));
  }),
);
const wall = (performance.now() - t0) / 1000;
clearInterval(timer);
await close();
fs.rmSync(home, { recursive: true, force: true });
console.log(JSON.stringify({ wall, batches: k * per, loop_max_ms: worst }));
