// TurnsafeSession against a plain better-sqlite3 session written the way
// the Agents SDK's docs show a custom session (a class with the five
// Session methods, here over one SQLite table), on the same messages (10
// per batch, about 230 B each, WAL, synchronous=FULL), with 1 and 16
// sessions adding batches at once (closed loop: each session sends its next
// batch once the last one was stored). Prints msg/s, p50 and p99 batch
// latency, the event loop's worst delay while it ran, the ratios, and the
// policy component's share of each TurnsafeSession flush (time inside the
// component over the flush's time in the store's worker).
//
//   node bench/bench.mjs          # env BATCHES (300, one session), PER_CLIENT (60), ROUNDS (3), KS (1,16)
import Database from 'better-sqlite3';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { TurnsafeSession } from '../src/index.js';

const BATCHES = Number(process.env.BATCHES ?? 300);
const PER_CLIENT = Number(process.env.PER_CLIENT ?? 60);
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const KS = (process.env.KS ?? '1,16').split(',').map(Number);

/** A custom Session as the SDK's docs show one, over better-sqlite3. */
class SqliteSession {
  constructor(sessionId, db) {
    this.sessionId = sessionId;
    this.db = db;
    this.insert = db.prepare('INSERT INTO items(session_id, item) VALUES (?, ?)');
    this.add = db.transaction((items) => {
      for (const item of items) this.insert.run(this.sessionId, JSON.stringify(item));
    });
  }

  static open(file) {
    const db = new Database(file);
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
    db.exec('CREATE TABLE IF NOT EXISTS items(id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, item TEXT NOT NULL)');
    db.exec('CREATE INDEX IF NOT EXISTS items_by_session ON items(session_id, id)');
    return db;
  }

  async getSessionId() {
    return this.sessionId;
  }

  async getItems(limit) {
    const rows = limit === undefined
      ? this.db.prepare('SELECT item FROM items WHERE session_id = ? ORDER BY id').all(this.sessionId)
      : this.db.prepare('SELECT item FROM (SELECT id, item FROM items WHERE session_id = ? ORDER BY id DESC LIMIT ?) ORDER BY id')
        .all(this.sessionId, limit);
    return rows.map((r) => JSON.parse(r.item));
  }

  async addItems(items) {
    this.add(items);
  }

  async popItem() {
    const row = this.db.prepare('SELECT id, item FROM items WHERE session_id = ? ORDER BY id DESC LIMIT 1').get(this.sessionId);
    if (!row) return undefined;
    this.db.prepare('DELETE FROM items WHERE id = ?').run(row.id);
    return JSON.parse(row.item);
  }

  async clearSession() {
    this.db.prepare('DELETE FROM items WHERE session_id = ?').run(this.sessionId);
  }
}

const filler = 'The quick brown fox jumps over the lazy dog while the agent looks the order up. ';
function batch(k, b) {
  return Array.from({ length: 10 }, (_, i) => ({
    role: i % 2 ? 'assistant' : 'user',
    content: `${k}/${b}/${i} ${filler}${filler}`.slice(0, 200),
  }));
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const median = (xs) => pct(xs, 50);

async function drive(sessions, perClient) {
  const lat = [];
  // The event loop's worst stall: the longest gap between ticks of a 1 ms
  // timer while the sessions add their batches (a Session that blocks the
  // thread stalls every timer, socket and stream of the agent meanwhile).
  let last = performance.now();
  let worst = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    worst = Math.max(worst, now - last);
    last = now;
  }, 1);
  const t0 = performance.now();
  await Promise.all(sessions.map(async (s, k) => {
    for (let b = 0; b < perClient; b++) {
      const t = performance.now();
      await s.addItems(batch(k, b));
      lat.push(performance.now() - t);
    }
  }));
  const secs = (performance.now() - t0) / 1000;
  await new Promise((r) => setTimeout(r, 2));
  clearInterval(timer);
  worst = Math.max(worst, performance.now() - last);
  return { msgs: (sessions.length * perClient * 10) / secs, p50: pct(lat, 50), p99: pct(lat, 99), loopMaxMs: worst };
}

async function plain(k, perClient) {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-plain-'));
  const db = SqliteSession.open(path.join(home, 'items.db'));
  const sessions = Array.from({ length: k }, (_, i) => new SqliteSession(`s${i}`, db));
  const r = await drive(sessions, perClient);
  db.close();
  fs.rmSync(home, { recursive: true, force: true });
  return r;
}

async function turnsafe(k, perClient, thread) {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-turnsafe-'));
  const sessions = Array.from({ length: k }, (_, i) => new TurnsafeSession(`s${i}`, home, { thread }));
  await sessions[0].getItems();
  await sessions[0].store.call('resetStats');
  const r = await drive(sessions, perClient);
  const stats = await sessions[0].store.call('stats');
  for (const s of sessions) await s.close();
  fs.rmSync(home, { recursive: true, force: true });
  return { ...r, share: stats.componentMs / stats.flushMs, componentUsPerFlush: (stats.componentMs * 1000) / (k * perClient),
    flushUs: (stats.flushMs * 1000) / (k * perClient), perCommit: stats.flushes / stats.writes };
}

const fmt = (n, d = 0) => n.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });

console.log(`node ${process.version}, ${os.cpus().length} cores; 10 messages per batch, about 230 B each; WAL, synchronous=FULL; median of ${ROUNDS}`);
for (const k of KS) {
  const per = k === 1 ? BATCHES : PER_CLIENT;
  const runs = { plain: [], worker: [], inline: [] };
  for (let r = 0; r < ROUNDS; r++) {
    runs.plain.push(await plain(k, per));
    runs.worker.push(await turnsafe(k, per, true));
    runs.inline.push(await turnsafe(k, per, false));
  }
  const pick = (xs) => {
    const m = median(xs.map((x) => x.msgs));
    return xs.find((x) => x.msgs === m);
  };
  const p = pick(runs.plain);
  const w = pick(runs.worker);
  const i = pick(runs.inline);
  console.log(`\n${k} session${k > 1 ? 's' : ''} at once, ${per} batches each`);
  console.log('| store | msg/s | p50 ms | p99 ms | worst event-loop stall ms | vs plain | batches per commit | component share of a flush |');
  console.log('|---|---|---|---|---|---|---|---|');
  console.log(`| plain better-sqlite3 Session | ${fmt(p.msgs)} | ${fmt(p.p50, 2)} | ${fmt(p.p99, 2)} | ${fmt(p.loopMaxMs, 1)} | 1.00x | 1 | - |`);
  console.log(`| TurnsafeSession (worker) | ${fmt(w.msgs)} | ${fmt(w.p50, 2)} | ${fmt(w.p99, 2)} | ${fmt(w.loopMaxMs, 1)} | ${fmt(w.msgs / p.msgs, 2)}x | ${fmt(w.perCommit, 1)} | ${fmt(100 * w.share, 1)}% (${fmt(w.componentUsPerFlush)} of ${fmt(w.flushUs)} µs) |`);
  console.log(`| TurnsafeSession (thread: false) | ${fmt(i.msgs)} | ${fmt(i.p50, 2)} | ${fmt(i.p99, 2)} | ${fmt(i.loopMaxMs, 1)} | ${fmt(i.msgs / p.msgs, 2)}x | ${fmt(i.perCommit, 1)} | ${fmt(100 * i.share, 1)}% (${fmt(i.componentUsPerFlush)} of ${fmt(i.flushUs)} µs) |`);
}
