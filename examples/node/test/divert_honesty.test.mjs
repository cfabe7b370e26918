// The divert is as honest as the native host's, shown with real failures:
// a short write (a file size limit on a child process, a full tmpfs), a
// cut-back the file system refuses (`chattr +a`: appends allowed,
// truncation not, even for root), and the folder fsyncs seen by strace.
// Each divert follows a database that cannot be opened (a folder at the
// `state.db` path: cause `disk`, action `divert`).
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { SessionWriter } from '../src/session_writer.mjs';
import { need } from './native.mjs';

const EFBIG = os.constants.errno.EFBIG;
const ENOSPC = os.constants.errno.ENOSPC;
const NODE_DIR = fileURLToPath(new URL('..', import.meta.url));

const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0;

// One append in another process. With `fsize`, it runs under RLIMIT_FSIZE
// (prlimit; Node ignores SIGXFSZ): a write that crosses the limit stores
// what fits and returns that count, and the next one fails with EFBIG.
const CHILD = `
import { SessionWriter } from './src/session_writer.mjs';
const a = JSON.parse(process.env.TURNSAFE_CHILD);
const out = new SessionWriter(a.home, a.session).append(a.messages);
process.stdout.write(JSON.stringify(out) + '\\n');
`;

function childArgv(home, messages, fsize) {
  const node = [process.execPath, '--input-type=module', '-e', CHILD];
  const argv = fsize === undefined ? node : ['prlimit', `--fsize=${fsize}:unlimited`, ...node];
  const env = { ...process.env, TURNSAFE_CHILD: JSON.stringify({ home, session: 's1', messages }) };
  return { argv, env };
}

function appendInChild(home, messages, fsize) {
  const { argv, env } = childArgv(home, messages, fsize);
  const proc = spawnSync(argv[0], argv.slice(1), { cwd: NODE_DIR, env, encoding: 'utf8' });
  assert.equal(proc.status, 0, `${proc.stderr} (signal ${proc.signal})`);
  return JSON.parse(proc.stdout);
}

/** A home whose database cannot be opened, so every batch is diverted. */
function divertingHome(base) {
  const home = path.join(base, 'home');
  fs.mkdirSync(home, { mode: 0o700 });
  fs.mkdirSync(path.join(home, 'state.db'));
  return home;
}

const batch = (tag, n = 3, size = 300) =>
  Array.from({ length: n }, (_, i) => ({ role: 'user', content: `${tag}-${i}-${'x'.repeat(size)}`, uid: `${tag}-${i}` }));

const divertFile = (home) => path.join(home, 'sessions', 's1.jsonl');

/** The lines in the receipt's byte range, read from the file; sha256 and count must match. */
function receiptLines(r) {
  const data = fs.readFileSync(r.path);
  assert.ok(r.offset + r.length <= data.length, 'the receipt names bytes the file does not hold');
  const chunk = data.subarray(r.offset, r.offset + r.length);
  assert.equal(createHash('sha256').update(chunk).digest('hex'), r.sha256);
  const text = chunk.toString('utf8');
  assert.ok(text.endsWith('\n'));
  const lines = text.slice(0, -1).split('\n');
  assert.equal(lines.length, r.count);
  return lines.map((l) => JSON.parse(l));
}

function claimsNothing(out) {
  assert.equal(out.persisted, false);
  assert.equal(out.receipt, null);
  assert.ok(!JSON.stringify(out.copy).toLowerCase().includes('a copy was kept'));
}

function firstDivert(home) {
  const out = new SessionWriter(home, 's1').append(batch('first'));
  assert.equal(out.copy.outcome, 'diverted', JSON.stringify(out));
  assert.deepEqual(receiptLines(out.receipt).map((l) => l.uid), ['first-0', 'first-1', 'first-2']);
}

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'turnsafe-node-divert-'));

test('a short write is continued, and a failed divert is cut back', (t) => {
  if (!need(t, has('prlimit'), 'prlimit is not installed')) return;
  const home = divertingHome(tmp());
  firstDivert(home);
  const file = divertFile(home);
  const before = fs.readFileSync(file);
  // Room for 100 bytes of the next batch: the first write stores them,
  // mid-line; only a later write, for the rest, fails.
  const out = appendInChild(home, batch('cut'), before.length + 100);
  assert.equal(out.copy.outcome, 'divert_failed', JSON.stringify(out));
  // EFBIG comes only from a write after the short one: the host went on.
  assert.deepEqual([out.divert_error.operation, out.divert_error.errno], ['write', EFBIG]);
  assert.equal(out.divert_residue, null);
  assert.deepEqual(out.uids, ['cut-0', 'cut-1', 'cut-2']);
  claimsNothing(out);
  assert.equal(out.copy.code, 'disk.divert_failed');
  assert.equal(fs.statSync(file).size, before.length);
  assert.ok(fs.readFileSync(file).equals(before));
  const again = new SessionWriter(home, 's1').append(batch('again'));
  assert.equal(again.copy.outcome, 'diverted', JSON.stringify(again));
  const r = again.receipt;
  assert.equal(r.offset, before.length);
  assert.equal(r.offset + r.length, fs.statSync(file).size);
  assert.deepEqual(receiptLines(r).map((l) => l.uid), ['again-0', 'again-1', 'again-2']);
  assert.ok(!fs.readFileSync(file, 'utf8').includes('cut-0'));
});

test('a disk that fills mid-line is cut back', (t) => {
  if (!need(t, process.getuid() === 0, 'mounting a tmpfs needs root')) return;
  const mnt = path.join(tmp(), 'small');
  fs.mkdirSync(mnt);
  const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=64k,mode=0700', 'tmpfs', mnt], { encoding: 'utf8' });
  if (!need(t, mounted.status === 0, `mount -t tmpfs: ${(mounted.stderr ?? mounted.error ?? '').toString().trim()}`)) return;
  try {
    const home = divertingHome(mnt);
    fs.mkdirSync(path.join(home, 'sessions'), { mode: 0o700 });
    const filler = path.join(home, 'filler');
    const fd = fs.openSync(filler, 'w');
    let err;
    try {
      for (;;) fs.writeSync(fd, Buffer.alloc(4096));
    } catch (e) {
      err = e;
    }
    assert.equal(err.code, 'ENOSPC');
    // One page free: the batch (about 10 KB) fits only in part.
    fs.ftruncateSync(fd, fs.fstatSync(fd).size - 4096);
    fs.closeSync(fd);
    const out = new SessionWriter(home, 's1').append(batch('full', 3, 3500));
    assert.equal(out.copy.outcome, 'divert_failed', JSON.stringify(out));
    assert.deepEqual([out.divert_error.operation, out.divert_error.errno], ['write', ENOSPC]);
    assert.equal(out.divert_residue, null);
    claimsNothing(out);
    assert.equal(fs.statSync(divertFile(home)).size, 0);
    fs.unlinkSync(filler);
    const again = new SessionWriter(home, 's1').append(batch('full', 3, 3500));
    assert.equal(again.copy.outcome, 'diverted', JSON.stringify(again));
    assert.equal(again.receipt.offset, 0);
    assert.deepEqual(receiptLines(again.receipt).map((l) => l.uid), ['full-0', 'full-1', 'full-2']);
    assert.equal(fs.statSync(divertFile(home)).size, again.receipt.length);
  } finally {
    spawnSync('umount', ['-l', mnt]);
  }
});

test('a divert that cannot be cut back reports its residue, worded as the native host words it', (t) => {
  if (!need(t, has('prlimit'), 'prlimit is not installed')) return;
  if (!need(t, has('chattr'), 'chattr is not installed')) return;
  const home = divertingHome(tmp());
  firstDivert(home);
  const file = divertFile(home);
  const before = fs.readFileSync(file);
  // `chattr +a`: appends still work, truncation fails (EPERM), even as root.
  const attr = spawnSync('chattr', ['+a', file], { encoding: 'utf8' });
  if (!need(t, attr.status === 0, `chattr +a ${file}: ${(attr.stderr ?? '').trim()}`)) return;
  let out;
  let after;
  try {
    out = appendInChild(home, batch('stuck'), before.length + 100);
    after = fs.readFileSync(file);
  } finally {
    execFileSync('chattr', ['-a', file]);
  }
  assert.equal(out.copy.outcome, 'divert_failed', JSON.stringify(out));
  assert.deepEqual([out.divert_error.operation, out.divert_error.errno], ['write', EFBIG]);
  assert.deepEqual(out.divert_residue, { path: file, offset: before.length });
  assert.ok(after.subarray(0, before.length).equals(before));
  assert.equal(after.length, before.length + 100);
  assert.ok(after.subarray(before.length).toString().startsWith('{"v":1,"session":"s1","uid":"stuck-0"'));
  claimsNothing(out);
  const text = JSON.stringify(out.copy).toLowerCase();
  assert.ok(!text.includes('not stored anywhere'));
  assert.ok(!text.includes(file.toLowerCase()) && !text.includes('s1.jsonl'));
  assert.equal(out.copy.details.divert_residue, 'possible');
  const bin = process.env.TURNSAFE_BIN;
  assert.ok(bin, 'TURNSAFE_BIN is not set: run through examples/run-all');
  const envelope = JSON.parse(execFileSync(bin, ['explain', '--cause', 'disk', '--outcome', 'divert_failed', '--json',
    '--divert-error', 'write: EFBIG', '--divert-residue', file, '--session', 's1'], { encoding: 'utf8' }));
  assert.equal(envelope.type, 'copy');
  assert.deepEqual(out.copy, envelope.data);
});

test('every divert fsyncs its folders before the receipt, whoever created the file', (t) => {
  if (!need(t, has('strace'), 'strace is not installed')) return;
  const base = tmp();
  const home = divertingHome(base);
  // What a divert that created the folder and the file, then failed before
  // fsyncing them (or crashed), leaves: both exist, neither entry synced.
  fs.mkdirSync(path.join(home, 'sessions'), { mode: 0o700 });
  const file = divertFile(home);
  fs.closeSync(fs.openSync(file, 'w', 0o600));
  const log = path.join(base, 'strace.log');
  const { argv, env } = childArgv(home, batch('seen'));
  const proc = spawnSync('strace', ['-f', '-qq', '-o', log, '-e', 'trace=openat,fsync,write', ...argv],
    { cwd: NODE_DIR, env, encoding: 'utf8' });
  if (!need(t, !(proc.status !== 0 && proc.stderr.includes('ptrace')), `strace cannot trace here: ${proc.stderr}`)) return;
  assert.equal(proc.status, 0, proc.stderr);
  assert.equal(JSON.parse(proc.stdout).copy.outcome, 'diverted');
  const fds = new Map();
  const events = [];
  for (const line of fs.readFileSync(log, 'utf8').split('\n')) {
    let m = line.match(/openat\(AT_FDCWD, "([^"]+)", [^)]*\) = (\d+)$/);
    if (m) {
      fds.set(m[2], m[1]);
      events.push(['open', m[1]]);
      continue;
    }
    m = line.match(/fsync\((\d+)\) += 0$/);
    if (m) {
      events.push(['fsync', fds.get(m[1]) ?? '?']);
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
