// The synchronous path: a session opened with `thread: false` runs its
// store in the calling thread, and its `...Sync` methods return (or throw)
// as better-sqlite3's calls do. They make the same requests as the
// asynchronous methods and read the answers the same way, so a batch ends
// the same: committed, or diverted with its receipt, or handed back, with
// the same outcome and copy.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { TurnsafeSession } from '../src/index.js';
import { receiptHolds, tmp } from './helpers.mjs';

const user = (content) => ({ role: 'user', content });

test('the synchronous methods store, read, pop, clear and replace as the asynchronous ones do', async () => {
  const run = async (sync) => {
    const s = new TurnsafeSession('s1', tmp(), { thread: false });
    const call = (name, ...args) => (sync ? s[`${name}Sync`](...args) : s[name](...args));
    const seen = [];
    await call('addItems', [user('a'), user('b')]);
    await call('addItems', [user('c')]);
    seen.push(await call('getItems'), await call('getItems', 2), await call('popItem'));
    await call('applyHistoryTransaction', { operationId: 'op-1', transaction: { type: 'append_items', items: [user('d')] } });
    await call('applyHistoryTransaction', { operationId: 'op-1', transaction: { type: 'append_items', items: [user('d')] } });
    await call('applyHistoryTransaction', { operationId: 'op-2',
      transaction: { type: 'replace_suffix', expectedSuffix: [user('d')], replacement: [user('e')] } });
    seen.push(await call('getItems'));
    await call('replaceHistoryWithCompaction', [{ type: 'compaction', encrypted_content: 'x' }, user('e')]);
    seen.push(await call('getItems'));
    await call('clearSession');
    seen.push(await call('getItems'), await call('popItem'));
    if (sync) s.closeSync();
    else await s.close();
    assert.equal(s.store.closed, true);
    return seen;
  };
  const sync = await run(true);
  assert.deepEqual(sync, await run(false));
  assert.deepEqual(sync[0], [user('a'), user('b'), user('c')]);
  assert.deepEqual(sync[3], [user('a'), user('b'), user('e')]);
});

/** What a copy says, with the home it names written as HOME. */
const said = (outcome, home) => JSON.parse(JSON.stringify({
  persisted: outcome.persisted, cause: outcome.cause, action: outcome.action, committed: outcome.committed,
  diverted: outcome.diverted, handed_back: outcome.handed_back, copy: outcome.copy,
}).replaceAll(home, 'HOME'));

async function fenced(sync) {
  // Another holder of this process, alive, holds the session's turn lease.
  const home = tmp();
  const theirs = new TurnsafeSession('s1', home, { holder: 'theirs', thread: false });
  theirs.addItemsSync([user('theirs')]);
  const ours = new TurnsafeSession('s1', home, { holder: 'ours', thread: false });
  let error = null;
  try {
    if (sync) ours.addItemsSync([user('ours')]);
    else await ours.addItems([user('ours')]);
  } catch (e) {
    error = e;
  }
  ours.closeSync();
  theirs.closeSync();
  return { home, error };
}

test('a fenced batch is handed back with the same outcome and copy either way, and the sync call throws it', async () => {
  const [sync, async_] = [await fenced(true), await fenced(false)];
  for (const { error } of [sync, async_]) {
    assert.equal(error?.name, 'TurnNotPersisted', String(error));
    assert.equal(error.outcome.cause, 'turn_lease');
    assert.equal(error.outcome.handed_back, 1);
    assert.equal(error.outcome.receipt, null);
    assert.ok(!/a copy was kept/i.test(JSON.stringify(error.outcome.copy)));
  }
  // The fencing lease's expiry is the other writer's clock: the same words around it.
  const strip = (r) => JSON.parse(JSON.stringify(said(r.error.outcome, r.home))
    .replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ/g, 'T').replace(/\d\d:\d\d:\d\d UTC/g, 'T'));
  assert.deepEqual(strip(sync), strip(async_));
  assert.equal(sync.error.outcomeText, JSON.stringify(sync.error.outcome));
});

test('a batch the open cannot take is handed back or diverted alike either way; the sync resend keeps its uids', async () => {
  const run = async (sync) => {
    const home = tmp();
    // A folder where state.db goes: every open fails.
    fs.mkdirSync(path.join(home, 'state.db'));
    const s = new TurnsafeSession('s1', home, { thread: false });
    let error = null;
    try {
      if (sync) s.addItemsSync([user('kept')]);
      else await s.addItems([user('kept')]);
    } catch (e) {
      error = e;
    }
    assert.equal(error?.name, 'TurnNotPersisted');
    fs.rmdirSync(path.join(home, 'state.db'));
    if (sync) s.addItemsSync([user('kept')]);
    else await s.addItems([user('kept')]);
    const stored = s.getItemsSync();
    s.closeSync();
    return { home, outcome: error.outcome, stored };
  };
  const [sync, async_] = [await run(true), await run(false)];
  assert.deepEqual(said(sync.outcome, sync.home), said(async_.outcome, async_.home));
  assert.deepEqual(sync.stored, [user('kept')]);
});

test('a synchronous call on a session whose store runs in a worker is refused, and nothing is written', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  assert.throws(() => s.addItemsSync([user('a')]), { name: 'TypeError', message: /thread: false/ });
  assert.throws(() => s.getItemsSync(), TypeError);
  assert.deepEqual(await s.getItems(), []);
  await s.close();
});
