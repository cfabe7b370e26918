// What the suites share: temporary homes, the native `turnsafe` binary,
// capabilities that only some machines have, and a process that holds the
// write lock of a database.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const JS = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
export const ROOT = path.dirname(JS);

export const tmp = (prefix = 'turnsafe-js-') => fs.mkdtempSync(path.join(os.tmpdir(), prefix));

/**
 * The native turnsafe binary: $TURNSAFE_RELEASE_BIN (scripts/test-all builds
 * it), $TURNSAFE_BIN, or the workspace's target/release or target/debug
 * one. None is a failure, never a skip.
 */
export function turnsafeBin() {
  const target = process.env.CARGO_TARGET_DIR ?? path.join(ROOT, 'target');
  for (const c of [process.env.TURNSAFE_RELEASE_BIN, process.env.TURNSAFE_BIN]) if (c && fs.existsSync(c)) return c;
  // The newer of the workspace's builds.
  const built = ['release', 'debug'].map((p) => path.join(target, p, 'turnsafe')).filter((p) => fs.existsSync(p))
    .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
  if (built.length) return built[0];
  throw new Error('no turnsafe binary: set TURNSAFE_RELEASE_BIN or build it (cargo build -p turnsafe-host --bin turnsafe)');
}

/** Run the native CLI: `{status, stdout, stderr, lines}` (stdout's JSON lines parsed). */
export function turnsafe(args, input) {
  const r = spawnSync(turnsafeBin(), args, { input, encoding: 'utf8' });
  if (r.error) throw r.error;
  const lines = r.stdout.split('\n').filter(Boolean).map((l) => {
    try {
      return JSON.parse(l);
    } catch {
      return l;
    }
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, lines };
}

const inCi = () => ['true', '1'].includes((process.env.CI ?? '').toLowerCase());

/**
 * A capability the test needs (root, chattr): a failure under CI=true, a
 * skip elsewhere that scripts/skip-reporter.mjs counts. Returns whether the test may go on.
 */
export function need(t, ok, why) {
  if (ok) return true;
  if (inCi()) throw new Error(`missing capability under CI: ${why}`);
  t.skip(`missing capability: ${why}`);
  return false;
}

export const isRoot = () => process.getuid?.() === 0;

// Another process holds BEGIN IMMEDIATE on the db after it says `held`:
// for HOLD_MS, or, without it, until its stdin ends (the test's word).
const HOLDER = `
import Database from 'better-sqlite3';
const db = new Database(process.env.HOLD_DB);
db.pragma('journal_mode = WAL');
db.exec('BEGIN IMMEDIATE');
process.stdout.write('held\\n');
const release = () => { db.exec('ROLLBACK'); db.close(); process.exit(0); };
if (process.env.HOLD_MS) setTimeout(release, Number(process.env.HOLD_MS));
else process.stdin.on('end', release).resume();
`;

/**
 * Start a process that holds the write lock of `db`; resolves once it holds
 * it. With `holdMs` it lets go after that long; without, it holds the lock
 * until the test calls `await holder.release()`, which resolves once the
 * process has ended (and the lock is free).
 */
export async function holdLock(db, holdMs) {
  const timed = holdMs !== undefined;
  const child = spawn(process.execPath, ['--input-type=module', '-e', HOLDER], {
    cwd: JS, env: { ...process.env, HOLD_DB: db, HOLD_MS: timed ? String(holdMs) : '' },
    stdio: [timed ? 'ignore' : 'pipe', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit');
  child.release = async () => {
    child.stdin?.end();
    await exited;
  };
  let out = '';
  child.stdout.on('data', (d) => {
    out += d;
  });
  while (!out.includes('held')) {
    const [code] = await Promise.race([once(child.stdout, 'data'), exited]);
    if (typeof code === 'number') throw new Error(`the lock holder exited ${code}`);
  }
  return child;
}

/**
 * One point in a store's worker (test/worker_hooks.mjs): `reached(n)`
 * resolves once the worker has arrived there `n` times (each time it then
 * blocks), `release()` lets it go on once. A test file that uses one sets
 * TURNSAFE_JS_TEST_HOOKS=1 before its first store starts.
 */
export class WorkerPoint {
  constructor() {
    this.signal = new SharedArrayBuffer(8);
    this.cells = new Int32Array(this.signal);
  }

  get arrivals() {
    return Atomics.load(this.cells, 0);
  }

  /**
   * Resolves with the count once the worker has arrived `n` times, or
   * with the count as it is once `stop()` was called.
   */
  async reached(n) {
    for (;;) {
      const seen = Atomics.load(this.cells, 0);
      if (seen >= n || this.stopped) return seen;
      const w = Atomics.waitAsync(this.cells, 0, seen);
      if (w.async) await w.value;
    }
  }

  release() {
    Atomics.add(this.cells, 1, 1);
    Atomics.notify(this.cells, 1);
  }

  /** Nothing more will be awaited: a pending `reached` resolves. */
  stop() {
    this.stopped = true;
    Atomics.notify(this.cells, 0);
  }
}

/**
 * Run `send` (which hands requests to `store`'s worker and returns a
 * promise of their answers) while the worker is held: every request it
 * sent is waiting in the worker's port when the worker goes on, so they
 * are drained together. Resolves with `send`'s answers.
 */
export async function whileHeld(store, send) {
  const point = new WorkerPoint();
  const held = store.call('hold', { signal: point.signal });
  // A worker without the hooks answers at once (an unknown operation).
  await Promise.race([point.reached(1), held.then((v) => assert.fail(`the worker did not stop: ${v}`))]);
  const answers = send();
  point.release();
  assert.equal(await held, 'released');
  return answers;
}

/** The bytes a receipt vouches for match its sha256 and its line count. */
export function receiptHolds(receipt) {
  const bytes = fs.readFileSync(receipt.path).subarray(receipt.offset, receipt.offset + receipt.length);
  const sha = createHashHex(bytes);
  return sha === receipt.sha256 && bytes.toString('utf8').split('\n').length - 1 === receipt.count;
}

import { createHash } from 'node:crypto';

const createHashHex = (b) => createHash('sha256').update(b).digest('hex');

/**
 * Run `code` (an ES module that may import `turnsafe-store`, meaning this
 * package) in a child Node process, under `bash -c` with `prefix` (e.g.
 * `ulimit -n 64`); returns `{status, stdout, stderr, json}`.
 */
export function child(code, { env = {}, prefix = 'true' } = {}) {
  const dir = tmp('turnsafe-js-child-');
  const file = path.join(dir, 'child.mjs');
  const index = new URL('../src/index.js', import.meta.url).href;
  fs.writeFileSync(file, code.replaceAll("'turnsafe-store'", `'${index}'`));
  const r = spawnSync('bash', ['-c', `${prefix} && exec "$NODE" "$FILE"`],
    { cwd: JS, env: { ...process.env, ...env, NODE: process.execPath, FILE: file }, encoding: 'utf8' });
  let json = null;
  try {
    json = JSON.parse(r.stdout);
  } catch {
    json = null;
  }
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, json };
}
