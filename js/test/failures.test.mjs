// Real failures under a live TurnsafeSession, each caused for real: a
// directory where state.db goes, an immutable state.db (chattr +i), file
// descriptors exhausted (ulimit -n in a child process), the write lock held
// by another process past the policy's patience, and the WAL and shm
// deleted under the session. Every message ends committed, diverted with a
// receipt that holds, or handed back with an outcome that says so.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { TurnsafeSession } from '../src/index.js';
import { WorkerPoint, child, holdLock, isRoot, need, receiptHolds, tmp, turnsafe } from './helpers.mjs';

// The store's worker can be held at a point a test releases (test/worker_hooks.mjs).
process.env.TURNSAFE_JS_TEST_HOOKS = '1';

const user = (content) => ({ role: 'user', content });

async function notPersisted(promise) {
  let err;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, 'the batch was stored');
  assert.equal(err.name, 'TurnNotPersisted', err.stack);
  assert.equal(err.outcome.persisted, false);
  assert.equal(JSON.stringify(err.outcome), err.outcomeText);
  return err.outcome;
}

function divertLines(receipt) {
  return fs.readFileSync(receipt.path).subarray(receipt.offset, receipt.offset + receipt.length).toString('utf8')
    .split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

test('a directory where state.db goes: disk, diverted with a receipt the copy names', async () => {
  const home = tmp();
  fs.mkdirSync(path.join(home, 'state.db'));
  const s = new TurnsafeSession('s1', home);
  const items = [user('kept'), { type: 'function_call', callId: 'c', name: 'f', arguments: '{}' }];
  const out = await notPersisted(s.addItems(items));
  assert.deepEqual([out.cause, out.action, out.operation, out.diverted, out.handed_back], ['disk', 'divert', 'open', 2, 0]);
  assert.ok(receiptHolds(out.receipt));
  assert.equal(out.receipt.path, path.join(home, 'sessions', 's1.jsonl'));
  assert.equal(out.copy.code, 'disk.diverted');
  assert.ok(out.copy.body.includes(out.receipt.path));
  const lines = divertLines(out.receipt);
  assert.deepEqual(lines.map((l) => l.message), items);
  assert.deepEqual(lines.map((l) => l.uid), out.uids);
  for (const l of lines) {
    assert.deepEqual(Object.keys(l).sort(), ['at', 'batch', 'cause', 'message', 'seq', 'session', 'uid', 'v']);
    assert.equal(l.v, 2);
    assert.equal(l.cause, 'disk');
  }
  assert.equal(fs.statSync(out.receipt.path).mode & 0o777, 0o600);
  assert.equal(fs.statSync(path.join(home, 'sessions')).mode & 0o777, 0o700);
  await s.close();
});

test('an immutable state.db (chattr +i): the write is refused, the batch diverted', async (t) => {
  if (!need(t, isRoot() && spawnSync('chattr', ['--version']).status !== null, 'root and chattr')) return;
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  await s.addItems([user('first')]);
  await s.close();
  const db = path.join(home, 'state.db');
  // Checkpointed and sidecars gone, so the immutable main file is all there is.
  fs.rmSync(`${db}-wal`, { force: true });
  fs.rmSync(`${db}-shm`, { force: true });
  const r = spawnSync('chattr', ['+i', db], { encoding: 'utf8' });
  if (!need(t, r.status === 0, `chattr +i works here (${r.stderr.trim()})`)) return;
  try {
    const again = new TurnsafeSession('s1', home);
    const out = await notPersisted(again.addItems([user('second')]));
    assert.equal(out.cause, 'disk');
    assert.equal(out.action, 'divert');
    assert.ok(receiptHolds(out.receipt));
    assert.equal(out.copy.outcome, 'diverted');
    await again.close();
  } finally {
    spawnSync('chattr', ['-i', db]);
  }
  assert.deepEqual(turnsafe(['show', '--home', home, '--session', 's1', '--json']).lines
    .filter((l) => l.type === 'message').map((l) => l.data.message.content), ['first']);
});

// Exhausts descriptors with `ulimit -n` lowered in the child's shell, then
// adds a batch: the open fails (CANTOPEN from EMFILE), the divert cannot
// open its file either, so the batch is handed back and nothing claims a
// copy. Once descriptors are free again, the resend stores it under the
// same uids.
const EMFILE_CHILD = `
import fs from 'node:fs';
import { TurnsafeSession } from 'turnsafe-store';
const s = new TurnsafeSession('s1', process.env.HOME_DIR);
await s.store.call('ping');
const held = [];
try { for (;;) held.push(fs.openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
const items = [{ role: 'user', content: 'no descriptors' }];
let first = null;
try { await s.addItems(items); } catch (e) { first = { name: e.name, outcome: e.outcome }; }
for (const fd of held) fs.closeSync(fd);
let resent = null;
try { await s.addItems(items); resent = 'stored'; } catch (e) { resent = e.name + ': ' + e.message; }
await s.close();
process.stdout.write(JSON.stringify({ first, resent }));
`;

test('descriptors exhausted (ulimit -n): handed back, nothing claimed, the resend keeps its uids', () => {
  const home = tmp();
  const r = child(EMFILE_CHILD, { env: { HOME_DIR: home }, prefix: 'ulimit -n 64' });
  assert.equal(r.status, 0, r.stderr);
  const { first, resent } = r.json;
  assert.equal(first.name, 'TurnNotPersisted');
  const out = first.outcome;
  assert.equal(out.cause, 'disk');
  assert.equal(out.receipt, null);
  assert.equal(out.handed_back, 1);
  assert.equal(out.diverted, 0);
  assert.equal(out.divert_error.errno, 24);
  assert.equal(out.copy.outcome, 'divert_failed');
  assert.ok(!/a copy was kept/i.test(JSON.stringify(out.copy)));
  assert.equal(resent, 'stored');
  const shown = turnsafe(['show', '--home', home, '--session', 's1', '--json']).lines.filter((l) => l.type === 'message');
  assert.deepEqual(shown.map((l) => l.data.uid), out.uids);
});

test('the write lock held by another process past the patience: locked, diverted, the event loop never waits', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  await s.addItems([user('before')]);
  // From here on, each failed write attempt in the worker waits until this
  // thread's event loop answers it: the flush goes on only while the loop turns.
  const gate = new WorkerPoint();
  assert.equal(await s.store.call('gateFailedWrites', { signal: gate.signal }), 'gated');
  // The lock is held until the batch's outcome is known, however long the
  // worker took to give up.
  const holder = await holdLock(path.join(home, 'state.db'));
  let out;
  let answered = 0;
  try {
    const flush = notPersisted(s.addItems([user('during')]));
    for (;;) {
      const next = await Promise.race([gate.reached(answered + 1).then(() => 'attempt'), flush.then(() => 'done')]);
      if (next === 'done') break;
      answered += 1;
      gate.release();
    }
    out = await flush;
  } finally {
    gate.stop();
    await holder.release();
  }
  assert.equal(out.cause, 'locked');
  assert.equal(out.action, 'divert');
  assert.ok(out.attempts > 1, `attempts ${out.attempts}`);
  // Every attempt the policy counted failed, waited for this thread, and
  // was let go by it while the batch was still in flight.
  assert.equal(answered, out.attempts);
  assert.ok(receiptHolds(out.receipt));
  assert.equal(divertLines(out.receipt)[0].seq, 2);
  await s.close();
});

test('the same wait in the calling thread (thread: false) stalls the event loop: why the worker', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home, { thread: false });
  await s.addItems([user('before')]);
  const holder = await holdLock(path.join(home, 'state.db'));
  let out;
  let ticks = 0;
  try {
    const timer = setInterval(() => {
      ticks += 1;
    }, 1);
    // The whole flush, every wait of its retry plan included, runs before
    // this thread can take up another event: no timer fires until it ends.
    out = await notPersisted(s.addItems([user('during')]));
    clearInterval(timer);
  } finally {
    await holder.release();
  }
  assert.equal(out.cause, 'locked');
  assert.ok(out.attempts > 1, `attempts ${out.attempts}`);
  assert.equal(ticks, 0, `${ticks} timers fired while the calling thread flushed`);
  await s.close();
});

const OTHER_PROCESS = `
import { TurnsafeSession } from 'turnsafe-store';
const home = process.env.HOME_DIR;
const s1 = new TurnsafeSession('s1', home);
const s2 = new TurnsafeSession('s2', home);
const result = {};
try { await s1.getItems(); result.read = 'complete'; } catch (e) { result.read = { name: e.name, captures: e.captures }; }
try { await s1.addItems([{ role: 'user', content: 'five' }]); result.held = 'stored'; } catch (e) { result.held = { name: e.name, outcome: e.outcome }; }
try { await s2.addItems([{ role: 'user', content: 'elsewhere' }]); result.free = 'stored'; } catch (e) { result.free = e.name + ': ' + e.message; }
await s1.close(); await s2.close();
process.stdout.write(JSON.stringify(result));
`;

test('the WAL and shm deleted under a live session: deleted_wal, captured, diverted, sticky; reads stop', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  await s.addItems([user('one'), user('two')]);
  fs.rmSync(path.join(home, 'state.db-wal'));
  fs.rmSync(path.join(home, 'state.db-shm'));
  const out = await notPersisted(s.addItems([user('three')]));
  assert.equal(out.cause, 'deleted_wal');
  assert.equal(out.action, 'divert');
  assert.ok(receiptHolds(out.receipt));
  assert.ok(out.capture?.path, JSON.stringify(out.capture));
  assert.match(path.basename(out.capture.path), /^state\.db\.retired-\d{8}T\d{6}Z-\d+$/);
  const manifest = JSON.parse(fs.readFileSync(path.join(out.capture.path, 'manifest.json'), 'utf8'));
  assert.equal(manifest.cause, 'deleted_wal');
  assert.deepEqual(manifest.missing_rows, { s1: 2 });
  assert.deepEqual(out.capture.files.map((f) => f.name).sort(), ['state.db', 'state.db-shm', 'state.db-wal']);
  for (const f of out.capture.files) assert.equal(fs.statSync(path.join(out.capture.path, f.name)).size, f.size);
  assert.match(out.copy.body, /captured/);
  assert.ok(out.copy.body.includes(out.capture.path));
  // Sticky: the next batch is diverted without touching the database.
  const next = await notPersisted(s.addItems([user('four')]));
  assert.equal(next.cause, 'deleted_wal');
  assert.equal(next.attempts, 0);
  assert.ok(receiptHolds(next.receipt));
  // This handle refuses to read through its retired generation.
  await assert.rejects(s.getItems(), (e) => e.name === 'TurnsafeError' && e.cause === 'deleted_wal');
  // Another process on the home: the pending capture stops this
  // session's reads and writes, not another session's.
  const r = child(OTHER_PROCESS, { env: { HOME_DIR: home } });
  assert.equal(r.status, 0, r.stderr);
  const { read, held, free } = r.json;
  assert.equal(read.name, 'HistoryIncomplete');
  assert.deepEqual(read.captures, [{ path: out.capture.path, cause: 'deleted_wal', rows: 2 }]);
  assert.equal(held.name, 'TurnNotPersisted');
  assert.deepEqual(held.outcome.pending_capture, { path: out.capture.path, cause: 'deleted_wal' });
  assert.equal(held.outcome.attempts, 0);
  assert.ok(receiptHolds(held.outcome.receipt));
  assert.equal(free, 'stored');
  const show = turnsafe(['show', '--home', home, '--session', 's1', '--json']);
  assert.equal(show.status, 7, show.stderr);
  assert.equal(turnsafe(['doctor', '--home', home, '--json']).status, 6);
  await s.close();
});

const RETIRED_EXIT = `
import fs from 'node:fs';
import path from 'node:path';
import { TurnsafeSession } from 'turnsafe-store';
const home = process.env.HOME_DIR;
const s = new TurnsafeSession('s1', home);
await s.addItems([{ role: 'user', content: 'one' }, { role: 'user', content: 'two' }]);
fs.rmSync(path.join(home, 'state.db-wal'));
fs.rmSync(path.join(home, 'state.db-shm'));
let outcome = null;
try { await s.addItems([{ role: 'user', content: 'three' }]); } catch (e) { outcome = e.outcome; }
await s.close();
process.stdout.write(JSON.stringify(outcome));
`;

test('a retired generation is never checkpointed at close: the operator settles the capture, replay brings the rest', async () => {
  const home = tmp();
  const r = child(RETIRED_EXIT, { env: { HOME_DIR: home } });
  assert.equal(r.status, 0, r.stderr);
  const out = r.json;
  assert.equal(out.cause, 'deleted_wal');
  assert.ok(out.capture?.path);
  // The process ended, and its connection with it: the retired frames were
  // not written into the state.db at the path.
  const show = turnsafe(['show', '--home', home, '--session', 's1', '--json']);
  assert.equal(show.status, 7);
  assert.deepEqual(show.lines.filter((l) => l.type === 'message'), []);
  assert.ok(!fs.existsSync(path.join(home, 'state.db-wal')) || fs.statSync(path.join(home, 'state.db-wal')).size === 0);
  // The operator installs a database rebuilt from the capture, then replays the divert.
  const rebuilt = path.join(tmp(), 'rebuilt.db');
  const install = turnsafe(['recover', '--source', out.capture.path, '--output', rebuilt, '--install', '--home', home, '--json']);
  assert.equal(install.status, 0, install.stdout + install.stderr);
  const replay = turnsafe(['replay', '--home', home, '--json']);
  assert.equal(replay.status, 0, replay.stdout + replay.stderr);
  const after = turnsafe(['show', '--home', home, '--session', 's1', '--json']);
  assert.equal(after.status, 0, after.stderr);
  assert.deepEqual(after.lines.filter((l) => l.type === 'message').map((l) => l.data.message.content), ['one', 'two', 'three']);
});
