// The divert is as honest as the native host's, shown with real failures
// under a live TurnsafeSession whose database cannot be opened (a folder
// at the state.db path: cause `disk`, action `divert`): a short write (a
// file size limit on the process), a cut-back the file system refuses
// (`chattr +a`: appends allowed, truncation not, even for root), and the
// file and folder fsyncs before the receipt, seen by strace.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { TurnsafeSession } from '../src/index.js';
import { JS, need, tmp, turnsafe } from './helpers.mjs';

const EFBIG = os.constants.errno.EFBIG;
const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0;

// One addItems in another process, under RLIMIT_FSIZE when `fsize` is set
// (prlimit; Node ignores SIGXFSZ): a write that crosses the limit stores
// what fits and returns that count, and the next one fails with EFBIG.
const CHILD = `
import { TurnsafeSession } from 'turnsafe-store';
const a = JSON.parse(process.env.TURNSAFE_CHILD);
const s = new TurnsafeSession('s1', a.home);
let out = null;
try { await s.addItems(a.items); } catch (e) { out = e.outcome ?? { error: String(e) }; }
await s.close();
process.stdout.write(JSON.stringify(out) + '\\n');
`;

function childArgv(home, items, fsize, dir) {
  const file = path.join(dir, 'child.mjs');
  fs.writeFileSync(file, CHILD.replace("'turnsafe-store'", `'${new URL('../src/index.js', import.meta.url).href}'`));
  const node = [process.execPath, file];
  const argv = fsize === undefined ? node : ['prlimit', `--fsize=${fsize}:unlimited`, ...node];
  return { argv, env: { ...process.env, TURNSAFE_CHILD: JSON.stringify({ home, items }) } };
}

function addInChild(home, items, fsize) {
  const { argv, env } = childArgv(home, items, fsize, tmp());
  const proc = spawnSync(argv[0], argv.slice(1), { cwd: JS, env, encoding: 'utf8' });
  assert.equal(proc.status, 0, `${proc.stderr} (signal ${proc.signal})`);
  return JSON.parse(proc.stdout);
}

function divertingHome() {
  const home = path.join(tmp(), 'home');
  fs.mkdirSync(home, { mode: 0o700 });
  fs.mkdirSync(path.join(home, 'state.db'));
  return home;
}

const batch = (tag, n = 3, size = 300) => Array.from({ length: n }, (_, i) => ({ role: 'user', content: `${tag}-${i}-${'x'.repeat(size)}` }));
const divertFile = (home) => path.join(home, 'sessions', 's1.jsonl');

/** The lines in the receipt's byte range, read from the file; sha256 and count must match. */
function receiptLines(r) {
  const data = fs.readFileSync(r.path);
  assert.ok(r.offset + r.length <= data.length, 'the receipt names bytes the file does not hold');
  const chunk = data.subarray(r.offset, r.offset + r.length);
  assert.equal(createHash('sha256').update(chunk).digest('hex'), r.sha256);
  const lines = chunk.toString('utf8').split('\n');
  assert.equal(lines.pop(), '');
  assert.equal(lines.length, r.count);
  return lines.map((l) => JSON.parse(l));
}

function claimsNothing(out) {
  assert.equal(out.persisted, false);
  assert.equal(out.receipt, null);
  assert.ok(!JSON.stringify(out.copy).toLowerCase().includes('a copy was kept'));
}

async function firstDivert(home) {
  const s = new TurnsafeSession('s1', home);
  let out;
  await s.addItems(batch('first')).catch((e) => {
    out = e.outcome;
  });
  await s.close();
  assert.equal(out.copy.outcome, 'diverted', JSON.stringify(out));
  assert.deepEqual(receiptLines(out.receipt).map((l) => l.message.content.slice(0, 7)), ['first-0', 'first-1', 'first-2']);
}

test('a short write is continued, and a failed divert is cut back', async (t) => {
  if (!need(t, has('prlimit'), 'prlimit is not installed')) return;
  const home = divertingHome();
  await firstDivert(home);
  const file = divertFile(home);
  const before = fs.readFileSync(file);
  // Room for 100 bytes of the next batch: the first write stores them,
  // mid-line; only a later write, for the rest, fails.
  const out = addInChild(home, batch('cut'), before.length + 100);
  assert.equal(out.copy.outcome, 'divert_failed', JSON.stringify(out));
  // EFBIG comes only from a write after the short one: the host went on.
  assert.deepEqual([out.divert_error.operation, out.divert_error.errno], ['write', EFBIG]);
  assert.equal(out.divert_residue, null);
  assert.equal(out.handed_back, 3);
  claimsNothing(out);
  assert.ok(fs.readFileSync(file).equals(before));
  const again = addInChild(home, batch('again'));
  assert.equal(again.copy.outcome, 'diverted', JSON.stringify(again));
  assert.equal(again.receipt.offset, before.length);
  assert.equal(again.receipt.offset + again.receipt.length, fs.statSync(file).size);
  assert.ok(!fs.readFileSync(file, 'utf8').includes('cut-0'));
});

test('a divert that cannot be cut back reports its residue, worded as the native host words it', async (t) => {
  if (!need(t, has('prlimit'), 'prlimit is not installed')) return;
  if (!need(t, has('chattr'), 'chattr is not installed')) return;
  const home = divertingHome();
  await firstDivert(home);
  const file = divertFile(home);
  const before = fs.readFileSync(file);
  const attr = spawnSync('chattr', ['+a', file], { encoding: 'utf8' });
  if (!need(t, attr.status === 0, `chattr +a ${file}: ${(attr.stderr ?? '').trim()}`)) return;
  let out;
  let after;
  try {
    out = addInChild(home, batch('stuck'), before.length + 100);
    after = fs.readFileSync(file);
  } finally {
    execFileSync('chattr', ['-a', file]);
  }
  assert.equal(out.copy.outcome, 'divert_failed', JSON.stringify(out));
  assert.deepEqual([out.divert_error.operation, out.divert_error.errno], ['write', EFBIG]);
  assert.deepEqual(out.divert_residue, { path: file, offset: before.length });
  assert.ok(after.subarray(0, before.length).equals(before));
  assert.equal(after.length, before.length + 100);
  assert.ok(after.subarray(before.length).toString().startsWith('{"v":2,"session":"s1","uid":'));
  claimsNothing(out);
  const text = JSON.stringify(out.copy).toLowerCase();
  assert.ok(!text.includes('not stored anywhere'));
  assert.ok(!text.includes(file.toLowerCase()) && !text.includes('s1.jsonl'));
  const envelope = turnsafe(['explain', '--cause', 'disk', '--outcome', 'divert_failed', '--json',
    '--divert-error', 'write: EFBIG', '--divert-residue', file, '--session', 's1']);
  assert.equal(envelope.status, 0, envelope.stderr);
  assert.deepEqual(out.copy, envelope.lines[0].data);
});

test('every divert fsyncs the file and its folders before the receipt, whoever created them', (t) => {
  if (!need(t, has('strace'), 'strace is not installed')) return;
  const base = tmp();
  const home = divertingHome();
  // What a divert that created the folder and the file, then failed before
  // fsyncing them (or crashed), leaves: both exist, neither entry synced.
  fs.mkdirSync(path.join(home, 'sessions'), { mode: 0o700 });
  const file = divertFile(home);
  fs.closeSync(fs.openSync(file, 'w', 0o600));
  const log = path.join(base, 'strace.log');
  const { argv, env } = childArgv(home, batch('seen'), undefined, base);
  const proc = spawnSync('strace', ['-f', '-qq', '-o', log, '-e', 'trace=openat,fsync,write', ...argv],
    { cwd: JS, env, encoding: 'utf8' });
  if (!need(t, !(proc.status !== 0 && proc.stderr.includes('ptrace')), `strace cannot trace here: ${proc.stderr}`)) return;
  assert.equal(proc.status, 0, proc.stderr);
  assert.equal(JSON.parse(proc.stdout).copy.outcome, 'diverted');
  const fds = new Map();
  const events = [];
  for (const line of fs.readFileSync(log, 'utf8').split('\n')) {
    let m = line.match(/^(\d+) +openat\(AT_FDCWD, "([^"]+)", [^)]*\) = (\d+)$/);
    if (m) {
      fds.set(`${m[1]}:${m[3]}`, m[2]);
      fds.set(m[3], m[2]);
      events.push(['open', m[2]]);
      continue;
    }
    m = line.match(/^(\d+) +fsync\((\d+)\) += 0$/);
    if (m) {
      events.push(['fsync', fds.get(m[2]) ?? '?']);
      continue;
    }
    if (/write\(1, "\{/.test(line)) events.push(['stdout', '']);
  }
  const opened = events.findIndex(([k, p]) => k === 'open' && p === file);
  const told = events.findIndex(([k]) => k === 'stdout');
  assert.ok(opened >= 0 && told > opened, JSON.stringify(events));
  const synced = events.slice(opened, told).filter(([k]) => k === 'fsync').map(([, p]) => p);
  assert.ok(synced.includes(file), JSON.stringify(synced));
  assert.ok(synced.includes(path.join(home, 'sessions')), JSON.stringify(synced));
  assert.ok(synced.includes(home), JSON.stringify(synced));
});
