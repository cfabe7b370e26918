// A hostile home, from JavaScript: session ids that could leave
// sessions/ or are too long, a sessions/ folder that is a symlink, a
// FIFO or another user's file at a divert file's path, and the longest
// divert line at the limit and one byte past it (docs/STORAGE.md,
// "Limits"). Each answer says what was wrong; nothing is acknowledged
// that was not stored or copied with a receipt.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { TurnsafeSession } from '../src/index.js';
import { MAX_DIVERT_LINE, divert } from '../src/divert.js';
import { Store } from '../src/store.js';
import { isRoot, need, tmp } from './helpers.mjs';

const { ELOOP, EPERM } = os.constants.errno;

function divertingHome() {
  const home = path.join(tmp(), 'home');
  fs.mkdirSync(home, { mode: 0o700 });
  fs.mkdirSync(path.join(home, 'state.db'));
  return home;
}

/** addItems' outcome on a home that cannot store: it rejects with it. */
async function failedAdd(home, items) {
  const s = new TurnsafeSession('s1', home);
  let out = null;
  await s.addItems(items).catch((e) => {
    out = e.outcome ?? { error: String(e) };
  });
  await s.close();
  assert.ok(out, 'addItems resolved on a home that cannot store');
  return out;
}

function handedBack(out, n) {
  assert.equal(out.persisted, false, JSON.stringify(out));
  assert.equal(out.receipt, null, JSON.stringify(out));
  assert.equal(out.handed_back, n, JSON.stringify(out));
  assert.equal(out.copy.outcome, 'divert_failed', JSON.stringify(out));
}

const everything = (dir) => fs.readdirSync(dir, { recursive: true });

test('a hostile session id is refused by the store, and mapped to a safe one by TurnsafeSession', async () => {
  const home = path.join(tmp(), 'home');
  const store = Store.for(home);
  try {
    for (const bad of ['../x', '..', 'a/b', 'a\0b', 'a'.repeat(300), 'a'.repeat(129), '']) {
      await assert.rejects(
        store.call('append', { session: bad, items: [{ role: 'user', content: 'hi' }], uids: null }),
        (e) => e.code === 'invalid_session_id' && /invalid session id/.test(e.message),
        JSON.stringify(bad),
      );
    }
    // The longest id is taken.
    const { outcome } = await store.call('append', { session: 'a'.repeat(128), items: [{ role: 'user', content: 'hi' }], uids: null });
    assert.equal(outcome.persisted, true);
  } finally {
    store.users -= 1;
    await store.close?.();
  }
  assert.ok(!fs.existsSync(path.join(home, 'sessions')));
  assert.ok(!fs.existsSync(path.join(path.dirname(home), 'x.jsonl')));

  // TurnsafeSession stores any SDK id under a safe one, inside the home,
  // and a divert of it lands inside sessions/.
  const diverting = divertingHome();
  for (const sdk of ['../x', 'a\0b', 'a'.repeat(300)]) {
    const s = new TurnsafeSession(sdk, diverting);
    assert.match(s.turnsafeId, /^[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,127}$/);
    let out = null;
    await s.addItems([{ role: 'user', content: 'hi' }]).catch((e) => {
      out = e.outcome;
    });
    await s.close();
    assert.equal(out.copy.outcome, 'diverted', JSON.stringify(out));
    assert.equal(path.dirname(out.receipt.path), path.join(diverting, 'sessions'));
  }
  assert.deepEqual(fs.readdirSync(path.dirname(diverting)).sort(), ['home']);
});

test('a sessions folder that is a symlink is not written through', async () => {
  const home = divertingHome();
  const elsewhere = tmp();
  fs.symlinkSync(elsewhere, path.join(home, 'sessions'));
  const out = await failedAdd(home, [{ role: 'user', content: 'hi' }]);
  handedBack(out, 1);
  assert.deepEqual([out.divert_error.operation, out.divert_error.errno], ['open', ELOOP]);
  assert.deepEqual(everything(elsewhere), []);
});

test('a divert file that is a FIFO hangs nothing and holds nothing', async () => {
  const home = divertingHome();
  fs.mkdirSync(path.join(home, 'sessions'), { mode: 0o700 });
  const fifo = path.join(home, 'sessions', 's1.jsonl');
  assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
  // More than a pipe holds (64 KiB): a write into it would block for ever.
  const out = await failedAdd(home, [{ role: 'user', content: 'x'.repeat(200_000) }]);
  handedBack(out, 1);
  assert.equal(out.divert_error.operation, 'open', JSON.stringify(out));
  assert.match(JSON.stringify(out.divert_error), /a FIFO, not a regular file/);
  assert.ok(fs.lstatSync(fifo).isFIFO());
});

test("another user's divert file is never appended to", async (t) => {
  if (!need(t, isRoot(), 'chown to another user needs root')) return;
  const home = divertingHome();
  fs.mkdirSync(path.join(home, 'sessions'), { mode: 0o700 });
  const file = path.join(home, 'sessions', 's1.jsonl');
  fs.writeFileSync(file, '');
  fs.chownSync(file, 65534, 65534);
  const out = await failedAdd(home, [{ role: 'user', content: 'mine' }]);
  handedBack(out, 1);
  assert.deepEqual([out.divert_error.operation, out.divert_error.errno], ['open', EPERM]);
  assert.equal(fs.statSync(file).size, 0);
});

test('a divert line at the limit is written, and one byte more is refused before any byte', () => {
  const home = path.join(tmp(), 'home');
  fs.mkdirSync(home, { mode: 0o700 });
  // The envelope's size, from an empty message (fixed-width batch id and time).
  const probe = divert(home, 's0', 'disk', [{ uid: 'u0', seq: 1, message: { role: 'user', content: '' } }]);
  const line = (len) => [{ uid: 'u0', seq: 1, message: { role: 'user', content: 'y'.repeat(len - probe.length) } }];
  const r = divert(home, 's1', 'disk', line(MAX_DIVERT_LINE));
  assert.equal(r.length, MAX_DIVERT_LINE);
  assert.throws(() => divert(home, 's2', 'disk', line(MAX_DIVERT_LINE + 1)), (e) => e.operation === 'encode'
    && e.message === `a divert line of ${MAX_DIVERT_LINE + 1} bytes is longer than the limit of ${MAX_DIVERT_LINE} bytes`);
  assert.ok(!fs.existsSync(path.join(home, 'sessions', 's2.jsonl')));
  // The same bound as the native reader's (host/src/lines.rs).
  assert.equal(MAX_DIVERT_LINE, 32 * 1024 * 1024 + 64 * 1024);
});

test('a clear reads a divert file whole up to the limit, and refuses one byte more', async () => {
  const { MAX_WHOLE_FILE } = await import('../src/clear.js');
  assert.equal(MAX_WHOLE_FILE, 256 * 1024 * 1024);
  const line = (uid) => `${JSON.stringify({ v: 2, session: 's1', uid, seq: null, batch: 'b', cause: 'disk',
    at: '2026-01-01T00:00:00.000Z', message: { role: 'user', content: 'pending' } })}\n`;
  for (const size of [MAX_WHOLE_FILE, MAX_WHOLE_FILE + 1]) {
    const home = path.join(tmp(), 'home');
    const s = new TurnsafeSession('s1', home);
    await s.addItems([{ role: 'user', content: 'stored' }]);
    const file = path.join(home, 'sessions', 's1.jsonl');
    fs.mkdirSync(path.dirname(file), { mode: 0o700 });
    fs.writeFileSync(file, line('p1'), { mode: 0o600 });
    fs.truncateSync(file, size); // a hole after the line: no disk used
    let error = null;
    await s.clearSession().catch((e) => {
      error = e;
    });
    await s.close();
    if (size === MAX_WHOLE_FILE) {
      assert.equal(error, null, String(error));
      assert.ok(!fs.existsSync(file), 'the clear took the file');
    } else {
      assert.ok(error, 'a clear past the limit went through');
      assert.match(error.message, /s1\.jsonl is longer than the 268435456 bytes read whole; run `turnsafe replay` first/);
      assert.equal(fs.statSync(file).size, size, 'the file stays where it was, whole');
    }
  }
});

test('a uid at the limit is stored, and one byte more is refused before anything is written', async () => {
  const home = path.join(tmp(), 'home');
  const store = Store.for(home);
  try {
    const at = 'u'.repeat(256);
    const { outcome } = await store.call('append', { session: 's1', items: [{ role: 'user', content: 'x' }], uids: [at] });
    assert.equal(outcome.persisted, true);
    assert.deepEqual(outcome.uids, [at]);
    await assert.rejects(
      store.call('append', { session: 's1', items: [{ role: 'user', content: 'y' }], uids: ['v'.repeat(257)] }),
      (e) => e.code === 'invalid_uid' && e.message === 'uids[0] must be a non-empty string of at most 256 bytes',
    );
    // Counted in bytes, as the native reader counts them.
    await assert.rejects(
      store.call('append', { session: 's1', items: [{ role: 'user', content: 'y' }], uids: ['é'.repeat(129)] }),
      (e) => e.code === 'invalid_uid',
    );
    const rows = await store.call('show', { session: 's1', limit: null });
    assert.deepEqual(rows.map((r) => r.content), ['x']);
  } finally {
    store.users -= 1;
    await store.close?.();
  }
});
