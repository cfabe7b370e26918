// Where a TurnsafeSession batch's time goes, in µs per batch, on the same
// batches as benches/overhead (10 messages of about 230 B, WAL,
// synchronous=FULL), one session, closed loop:
//
// - the synchronous path (`thread: false`, addItemsSync), each part timed
//   by wrapping the Host's own methods and statements: the captures watch,
//   the machine's start (uids minted, the component's first step), the
//   guard's probes, each SQL statement, the component's answer to the
//   commit, and what is left (the session's side, the wrappers);
// - the asynchronous path (the worker): the crossing each way (from the
//   post to its arrival, timestamps of one clock), the flush in the
//   worker, and the CPU each thread spent (from /proc/self/task);
// - the component alone, one commit-road flush in a loop: typed (start,
//   poll, handle, poll) against flush-step-json (two calls).
//
//   node bench/breakdown.mjs [DIR]     # env BATCHES (3000), WARMUP (300)
import fs from 'node:fs';
import path from 'node:path';

import { TurnsafeSession } from '../src/index.js';
import { flushStep, typedEvent, typedHandle, typedPoll, typedStart } from '../src/policy.js';

const DIR = process.argv[2] ?? '/dev/shm';
const N = Number(process.env.BATCHES ?? 3000);
const WARMUP = Number(process.env.WARMUP ?? 300);

const batch = (b) => Array.from({ length: 10 }, (_, i) => ({
  role: i % 2 ? 'assistant' : 'user',
  content: `client 0 batch ${b} message ${i} ${'x'.repeat(200)}`,
}));
const us = (ms) => (ms / N * 1000).toFixed(1).padStart(7);

function threads() {
  const out = {};
  for (const t of fs.readdirSync('/proc/self/task')) {
    try {
      const st = fs.readFileSync(`/proc/self/task/${t}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      out[t] = Number(f[11]) + Number(f[12]);
    } catch {
      // ended
    }
  }
  return out;
}

async function syncPath() {
  const home = fs.mkdtempSync(path.join(DIR, 'breakdown-'));
  const s = new TurnsafeSession('c0', home, { thread: false });
  s.addItemsSync(batch(-1));
  const host = s.store.ops.host;
  const T = {};
  const wrap = (obj, name, label) => {
    const f = obj[name].bind(obj);
    obj[name] = (...a) => {
      const t = performance.now();
      try {
        return f(...a);
      } finally {
        T[label] = (T[label] ?? 0) + performance.now() - t;
      }
    };
  };
  for (const k of ['begin', 'commit', 'insert', 'renew', 'take', 'newSession']) wrap(host.stmts[k], 'run', `sql ${k}`);
  for (const k of ['maxSeq', 'lease']) wrap(host.stmts[k], 'get', `sql ${k}`);
  wrap(host.guard, 'check', 'guard probes');
  wrap(host.holdsWatch, 'holds', 'captures watch');
  wrap(host, 'member', 'start: uids, component');
  wrap(host, 'feed', 'component: the commit answered');
  for (let b = 0; b < WARMUP; b++) s.addItemsSync(batch(b));
  for (const k of Object.keys(T)) T[k] = 0;
  const t0 = performance.now();
  for (let b = 0; b < N; b++) s.addItemsSync(batch(b));
  const total = performance.now() - t0;
  const stats = s.store.ops.stats();
  s.closeSync();
  fs.rmSync(home, { recursive: true, force: true });
  console.log(`synchronous path (thread: false), ${DIR}: ${us(total).trim()} µs a batch, ${stats.typed} of ${stats.flushes} flushes typed`);
  const parts = Object.entries(T).filter(([, v]) => v > 0);
  for (const [k, v] of parts) console.log(`  ${us(v)}  ${k}`);
  console.log(`  ${us(total - parts.reduce((a, [, v]) => a + v, 0))}  the rest (the session's side, JSON texts, the wrappers)`);
}

async function asyncPath() {
  const home = fs.mkdtempSync(path.join(DIR, 'breakdown-'));
  const s = new TurnsafeSession('c0', home);
  for (let b = 0; b < WARMUP; b++) await s.addItems(batch(b));
  await s.store.call('resetStats');
  const store = s.store;
  // Each request is stamped when posted; the worker's flush time comes from its counters.
  let toWorker = 0;
  let back = 0;
  const post = store.post.bind(store);
  let posted = 0;
  store.post = () => {
    posted = performance.timeOrigin + performance.now();
    post();
  };
  const settle = store.settle.bind(store);
  store.settle = (a) => {
    back += performance.timeOrigin + performance.now() - posted;
    settle(a);
  };
  const before = threads();
  const t0 = performance.now();
  for (let b = 0; b < N; b++) await s.addItems(batch(b));
  const total = performance.now() - t0;
  const after = threads();
  const stats = await s.store.call('stats');
  await s.close();
  fs.rmSync(home, { recursive: true, force: true });
  toWorker = back - stats.flushMs;
  console.log(`asynchronous path (the worker), ${DIR}: ${us(total).trim()} µs a batch`);
  console.log(`  ${us(stats.flushMs)}  the flush in the worker (of which ${us(stats.componentMs).trim()} in the component)`);
  console.log(`  ${us(toWorker)}  the crossing, both ways, and the worker's loop (post to answer, less the flush)`);
  console.log(`  ${us(total - back)}  the calling thread's side (texts, the outcome read, promises)`);
  const tick = 1000 / 100; // ms a clock tick (USER_HZ 100)
  const cpu = Object.keys(after).map((t) => [t, (after[t] - (before[t] ?? 0)) * tick]).filter(([, v]) => v > 0)
    .sort((a, b) => b[1] - a[1]);
  console.log(`  CPU by thread (µs a batch): ${cpu.map(([t, v]) => `${t === String(process.pid) ? 'main' : t} ${us(v).trim()}`).join(', ')}`);
}

function component() {
  const uids = Array.from({ length: N + 1 }, (_, i) => Array.from({ length: 10 }, (_, j) => `${i.toString(16).padStart(16, '0')}${j.toString(16).padStart(16, '0')}`));
  const start = (i) => ({ session: 'c0', uids: uids[i], minted_uids: uids[i], seed: i });
  let a = JSON.parse(flushStep({ state: null, start: start(N) }));
  a = JSON.parse(flushStep({ state: a.state, event: { type: 'opened' } }));
  a = JSON.parse(flushStep({ state: a.state, event: { type: 'committed' } }));
  const clean = a.state;
  const json = () => {
    const t = performance.now();
    for (let i = 0; i < N; i++) {
      const r = JSON.parse(flushStep({ state: clean, start: start(i) }));
      JSON.parse(flushStep({ state: r.state, event: { type: 'committed' } }));
    }
    return performance.now() - t;
  };
  const handle = typedHandle();
  const typed = () => {
    const t = performance.now();
    for (let i = 0; i < N; i++) {
      const f = typedStart(handle, start(i));
      if (typedPoll(f).tag === 'open') {
        typedEvent(f, { tag: 'opened' });
        typedPoll(f);
      }
      typedEvent(f, { tag: 'committed' });
      JSON.parse(typedPoll(f).val);
      f[Symbol.dispose]();
    }
    return performance.now() - t;
  };
  const rounds = [];
  for (let r = 0; r < 5; r++) rounds.push([typed(), json()]);
  const med = (i) => rounds.map((x) => x[i]).sort((x, y) => x - y)[2];
  console.log(`the component alone, one commit-road flush (median of 5 rounds of ${N}):`);
  console.log(`  ${us(med(0))}  typed: start, poll, handle, poll (the outcome's text parsed)`);
  console.log(`  ${us(med(1))}  flush-step-json: two calls (state and outcome parsed)`);
}

await syncPath();
await asyncPath();
component();
