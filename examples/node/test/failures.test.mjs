// Real failures in better-sqlite3. Each gets the cause and action the Rust
// host gets for the same failure, and copy that matches what happened.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { CODES } from '../src/codes.mjs';
import { decide } from '../src/policy.mjs';
import { SessionWriter, observation } from '../src/session_writer.mjs';
import { native } from './native.mjs';

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'turnsafe-node-'));

function sameAsRustHost(obs, cause, action) {
  const ours = decide(obs);
  const theirs = JSON.parse(native('classify', [JSON.stringify(obs)])[0]);
  assert.deepEqual([ours.cause, ours.action], [cause, action]);
  assert.deepEqual([theirs.cause, theirs.action], [cause, action]);
}

test('the code table knows the names better-sqlite3 reports', () => {
  assert.equal(CODES.SQLITE_CANTOPEN, 14);
  assert.equal(CODES.SQLITE_BUSY_SNAPSHOT, 517);
});

test('a missing directory is disk, and the failed divert claims nothing', () => {
  const home = path.join(tmp(), 'no', 'such');
  let err;
  try {
    new Database(path.join(home, 'state.db'));
  } catch (e) {
    err = e;
  }
  // better-sqlite3 checks the folder itself: a TypeError with no SQLite
  // code, so the policy reads the message, and still says what Rust says.
  assert.equal(err.code, undefined);
  sameAsRustHost(observation('open', err, 1, 0, 1), 'disk', 'divert');
  const out = new SessionWriter(home, 's1').append([{ role: 'user', content: 'hi' }]);
  assert.equal(out.cause, 'disk');
  assert.equal(out.receipt, null);
  assert.equal(out.handed_back, 1);
  assert.equal(out.copy.code, 'disk.divert_failed');
  assert.ok(!JSON.stringify(out.copy).toLowerCase().includes('a copy was kept'));
});

test('a read-only open is disk and the batch is diverted with a receipt', () => {
  const home = tmp();
  const w = new SessionWriter(home, 's1');
  assert.equal(w.append([{ role: 'user', content: 'first' }]).persisted, true);
  w.db.close();
  const ro = new SessionWriter(home, 's1', { readonly: true });
  const out = ro.append([{ role: 'user', content: 'second', uid: 'u2' }]);
  assert.deepEqual([out.cause, out.action, out.diverted], ['disk', 'divert', 1]);
  const { path: p, offset, length, sha256 } = out.receipt;
  const bytes = fs.readFileSync(p).subarray(offset, offset + length);
  assert.equal(createHash('sha256').update(bytes).digest('hex'), sha256);
  assert.ok(out.copy.body.includes(p));
  let err;
  try {
    new Database(path.join(home, 'state.db'), { readonly: true })
      .prepare("INSERT INTO messages(session_id, uid, seq, role, content) VALUES ('s','u',1,'r','c')").run();
  } catch (e) {
    err = e;
  }
  assert.match(err.code, /^SQLITE_READONLY/);
  sameAsRustHost(observation('append_batch', err, 1, 0, 1), 'disk', 'divert');
});

// Another process holds BEGIN IMMEDIATE on the db until `holdMs` after it
// says `held`; resolves once it holds the lock.
const HOLDER = `
import Database from 'better-sqlite3';
const db = new Database(process.env.TURNSAFE_HOLD_DB);
db.exec('BEGIN IMMEDIATE');
process.stdout.write('held\\n');
setTimeout(() => { db.exec('COMMIT'); db.close(); }, Number(process.env.TURNSAFE_HOLD_MS));
`;

function holdLockInAnotherProcess(db, holdMs) {
  const child = spawn(process.execPath, ['--input-type=module', '-e', HOLDER], {
    cwd: fileURLToPath(new URL('..', import.meta.url)),
    env: { ...process.env, TURNSAFE_HOLD_DB: db, TURNSAFE_HOLD_MS: String(holdMs) },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit');
  const held = new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      if (out.includes('held\n')) resolve();
    });
    exited.then(([code]) => reject(new Error(`the lock holder exited (${code}) before holding the lock`)));
  });
  return { held, exited };
}

test('BUSY from another process is locked, retried, and committed once the lock is released', async () => {
  const home = tmp();
  const db = path.join(home, 'state.db');
  const w = new SessionWriter(home, 's1');
  assert.equal(w.append([{ role: 'user', content: 'first' }]).persisted, true);
  const holder = holdLockInAnotherProcess(db, 500);
  await holder.held;
  let err;
  try {
    new Database(db, { timeout: 0 }).exec('BEGIN IMMEDIATE');
  } catch (e) {
    err = e;
  }
  assert.equal(err?.code, 'SQLITE_BUSY');
  sameAsRustHost(observation('append_batch', err, 1, 0, 1), 'locked', 'retry');
  // The writer blocks this process while it retries; the holder, in its
  // own process, lets go after about 500 ms.
  const started = Date.now();
  const out = w.append([{ role: 'user', content: 'second' }]);
  const waited = Date.now() - started;
  assert.equal(out.persisted, true, JSON.stringify(out));
  assert.ok(out.attempts > 1, `committed at attempt ${out.attempts}: the lock was never met`);
  assert.ok(waited >= 300, `waited only ${waited} ms for a lock held about 500 ms`);
  const [code] = await holder.exited;
  assert.equal(code, 0);
  const rows = new Database(db, { readonly: true }).prepare('SELECT content FROM messages ORDER BY seq').all();
  assert.deepEqual(rows.map((r) => r.content), ['first', 'second']);
});
