// What a commit probes before it writes, and what it no longer reads once
// nothing moved: the home's listing of captures (HoldsWatch, read again
// only when a stamp moved) and the WAL's times (the guard reads its
// descriptors' links, never a stat of the WAL). Watched from outside with
// strace where it is the syscalls that matter.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import test from 'node:test';

import { HoldsWatch, MARKER, PREFIX, RACY_LOCAL_MS, RACY_MS, racyFor } from '../src/captures.js';
import { JS, need, tmp } from './helpers.mjs';

const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Past a coarse clock's tick and the shortened racy window below.
const age = () => sleep(120);

/** A pending capture of `rows` rows of s1, its manifest renamed in as a capture writes it. */
function pendingCapture(home, name, rows) {
  const dir = path.join(home, `${PREFIX}${name}`);
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, 'manifest.json.tmp'), JSON.stringify({ trigger: 'test', missing_rows: { s1: rows } }));
  fs.renameSync(path.join(dir, 'manifest.json.tmp'), path.join(dir, 'manifest.json'));
  return dir;
}

function settle(dir) {
  const marker = { format: 1, settled_at: new Date().toISOString(), how: 'dismissed', carried_over: 0, pid: process.pid,
    turnsafe: 'test' };
  fs.writeFileSync(path.join(dir, `${MARKER}.tmp`), JSON.stringify(marker));
  fs.renameSync(path.join(dir, `${MARKER}.tmp`), path.join(dir, MARKER));
}

test('the watch reads the home again only when it or a capture in it changed', async () => {
  const home = tmp();
  const watch = new HoldsWatch(50);
  await age();
  assert.deepEqual(watch.holds(home), []);
  assert.deepEqual(watch.holds(home), []);
  assert.equal(watch.reads, 1, 'an unchanged home is not read again');
  fs.writeFileSync(path.join(home, 'unrelated'), '');
  assert.deepEqual(watch.holds(home), []);
  assert.equal(watch.reads, 2);

  // A capture appears: seen at once, while its stamps are young.
  const cap = pendingCapture(home, '20250101T000000Z-1', 3);
  const held = watch.holds(home);
  assert.equal(held.length, 1);
  assert.deepEqual(held[0].sessions, { s1: 3 });
  assert.deepEqual(watch.holds(home), held);
  assert.equal(watch.reads, 4, 'young stamps prove nothing: read each time');
  await age();
  assert.deepEqual(watch.holds(home), held);
  assert.deepEqual(watch.holds(home), held);
  assert.equal(watch.reads, 5);

  // Settled by a marker renamed into its folder; pending again without it.
  settle(cap);
  assert.deepEqual(watch.holds(home), []);
  await age();
  assert.deepEqual(watch.holds(home), []);
  const reads = watch.reads;
  fs.unlinkSync(path.join(cap, MARKER));
  assert.deepEqual(watch.holds(home), held);
  assert.equal(watch.reads, reads + 1);
});

test('the racy window is short only on a filesystem known to stamp from the kernel clock', () => {
  const kind = Number(fs.statfsSync(tmp()).type);
  const local = [0xef53, 0x58465342, 0x9123683e, 0xf2f52010, 0x01021994].includes(kind);
  assert.equal(racyFor(tmp()), local ? RACY_LOCAL_MS : RACY_MS);
  if (fs.existsSync('/dev/shm') && Number(fs.statfsSync('/dev/shm').type) === 0x01021994) {
    assert.equal(racyFor('/dev/shm'), RACY_LOCAL_MS);
  }
  assert.equal(racyFor(path.join(tmp(), 'absent')), RACY_MS, 'what cannot be told is the long window');
  assert.equal(racyFor('/proc/self'), RACY_MS);
});

test('a capture made in the same tick as a look is seen by the next one', () => {
  const home = tmp();
  const watch = new HoldsWatch();
  for (let k = 0; k < 20; k++) {
    assert.equal(watch.holds(home).length, k);
    pendingCapture(home, `20250101T0000${String(k).padStart(2, '0')}Z-1`, 1);
  }
  assert.equal(watch.holds(home).length, 20);
});

test('a home that is gone, or another folder moved to its path, is read again', async () => {
  const parent = tmp();
  const home = path.join(parent, 'home');
  fs.mkdirSync(home);
  const watch = new HoldsWatch(50);
  await age();
  assert.deepEqual(watch.holds(home), []);
  fs.rmdirSync(home);
  assert.deepEqual(watch.holds(home), []);
  const other = path.join(parent, 'other');
  fs.mkdirSync(other);
  pendingCapture(other, '20250101T000000Z-1', 2);
  await age();
  fs.renameSync(other, home);
  assert.equal(watch.holds(home).length, 1);
});

// Adds one batch, waits past the racy window, adds one more (what it last
// read was young), marks the trace with a stat of a path that is never
// there, then adds BATCHES more, each alone, and marks their end.
const CHILD = `
import fs from 'node:fs';
import { TurnsafeSession } from 'turnsafe-store';
const { home, pauseMs, batches } = JSON.parse(process.env.PROBE_CHILD);
const s = new TurnsafeSession('s1', home, { thread: false });
const batch = (b) => [{ role: 'user', content: 'batch ' + b }];
await s.addItems(batch(0));
await new Promise((r) => setTimeout(r, pauseMs));
await s.addItems(batch(1));
try { fs.statSync('/turnsafe-probe-marker'); } catch {}
for (let b = 2; b < 2 + batches; b++) await s.addItems(batch(b));
try { fs.statSync('/turnsafe-probe-end'); } catch {}
const items = await s.getItems();
await s.close();
process.stdout.write(String(items.length));
`;

test('once nothing moved, a commit lists no home and never stats the WAL', (t) => {
  if (!need(t, has('strace'), 'strace is not installed')) return;
  const base = tmp();
  const home = path.join(base, 'home');
  const file = path.join(base, 'child.mjs');
  fs.writeFileSync(file, CHILD.replace("'turnsafe-store'", `'${new URL('../src/index.js', import.meta.url).href}'`));
  const log = path.join(base, 'strace.log');
  const BATCHES = 20;
  const proc = spawnSync('strace', ['-f', '-qq', '-y', '-o', log, '-e', 'trace=statx,newfstatat,getdents64',
    process.execPath, file], {
    cwd: JS,
    env: { ...process.env, PROBE_CHILD: JSON.stringify({ home, pauseMs: racyFor(base) + 300, batches: BATCHES }) },
    encoding: 'utf8',
  });
  if (!need(t, !(proc.status !== 0 && proc.stderr.includes('ptrace')), `strace cannot trace here: ${proc.stderr}`)) return;
  assert.equal(proc.status, 0, proc.stderr);
  assert.equal(proc.stdout, String(BATCHES + 2));
  const lines = fs.readFileSync(log, 'utf8').split('\n');
  const mark = lines.findIndex((l) => l.includes('/turnsafe-probe-marker'));
  const end = lines.findIndex((l) => l.includes('/turnsafe-probe-end'));
  assert.ok(mark > 0 && end > mark, 'the trace has both marks');
  const realHome = fs.realpathSync(home);
  const wal = path.join(realHome, 'state.db-wal');
  const before = lines.slice(0, mark);
  const quiet = lines.slice(mark, end);
  const lists = (l) => l.includes('getdents64(') && l.includes(`<${realHome}>`);
  const statsWal = (l) => /statx|newfstatat/.test(l) && (l.includes(`"${wal}"`) || l.includes(`<${wal}>`));
  // What the trace would show without the watch and the link probes.
  assert.ok(before.some(lists), 'the home is listed while it is young');
  assert.ok(before.some(statsWal), 'the WAL is stat-ed when the guard records it');
  assert.deepEqual(quiet.filter(lists), [], 'no listing of the home once it was still');
  assert.deepEqual(quiet.filter(statsWal), [], 'no stat of the WAL at a commit');
});
