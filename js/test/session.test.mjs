// TurnsafeSession as the Agents SDK uses it: the Session methods, the
// history-transaction hooks (atomic, idempotent by operation id), uids
// reused on a resend, the schema refusals, close() giving the lease back.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { isSessionHistoryTransactionAwareSession } from '@openai/agents';

import { SCHEMA_VERSION, TurnsafeSession, safeSessionId } from '../src/index.js';
import { tmp, whileHeld } from './helpers.mjs';

// The store's worker can be held at a point a test releases (test/worker_hooks.mjs).
process.env.TURNSAFE_JS_TEST_HOOKS = '1';

const user = (content) => ({ role: 'user', content });
const call = (id) => ({ type: 'function_call', callId: id, name: 'lookup', arguments: '{"q":"x"}', status: 'completed' });

test('items come back exactly as added, newest `limit` in order', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  assert.equal(await s.getSessionId(), 's1');
  assert.deepEqual(await s.getItems(), []);
  const items = [user('one'), call('c1'), { type: 'function_call_result', callId: 'c1', name: 'lookup', status: 'completed',
    output: { type: 'text', text: 'found' } }, { role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'done' }] }];
  await s.addItems(items.slice(0, 2));
  await s.addItems(items.slice(2));
  assert.deepEqual(await s.getItems(), items);
  assert.deepEqual(await s.getItems(2), items.slice(2));
  assert.deepEqual(await s.getItems(0), []);
  assert.deepEqual(await s.popItem(), items[3]);
  assert.deepEqual(await s.getItems(), items.slice(0, 3));
  await s.clearSession();
  assert.deepEqual(await s.getItems(), []);
  assert.equal(await s.popItem(), undefined);
  await s.close();
});

test('rows are the native schema: version, session row, uid and seq, item verbatim, owner-only WAL files, lease released at close', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home, { holder: 'js-test' });
  await s.addItems([user('a'), call('c1')]);
  const db = new Database(path.join(home, 'state.db'), { readonly: true });
  assert.equal(db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
  assert.notEqual(db.pragma('application_id', { simple: true }), 0);
  const gen = db.prepare("SELECT value FROM state_meta WHERE key = 'generation'").get().value;
  assert.equal(Number(gen), db.pragma('application_id', { simple: true }));
  const rows = db.prepare('SELECT uid, seq, role, content, item FROM messages WHERE session_id = ? ORDER BY seq').all('s1');
  assert.deepEqual(rows.map((r) => r.seq), [1, 2]);
  assert.equal(rows[0].role, 'user');
  assert.equal(rows[0].content, 'a');
  assert.equal(rows[1].role, null);
  assert.equal(rows[1].item, JSON.stringify(call('c1')));
  assert.equal(new Set(rows.map((r) => r.uid)).size, 2);
  let lease = db.prepare('SELECT lease_token, lease_holder FROM sessions WHERE id = ?').get('s1');
  // The holder's name and the proof of its process (src/lease.js), as the native host writes it.
  const proof = JSON.parse(lease.lease_holder);
  assert.deepEqual(Object.keys(proof), ['name', 'boot', 'pidns', 'pid', 'start']);
  assert.equal(proof.name, 'js-test');
  assert.equal(proof.pid, process.pid);
  assert.ok(lease.lease_token);
  // The database is in WAL mode: it, its WAL and its shm are there, each
  // readable by its owner only, while the writer is open and after (the
  // read-only reader above never checkpoints them away).
  const ownerOnly = (when) => {
    for (const f of ['state.db', 'state.db-wal', 'state.db-shm']) {
      const p = path.join(home, f);
      assert.ok(fs.existsSync(p), `${f} exists ${when}`);
      assert.equal(fs.statSync(p).mode & 0o777, 0o600, `${f} ${when}`);
    }
  };
  ownerOnly('while the writer is open');
  await s.close();
  lease = db.prepare('SELECT lease_token, lease_holder FROM sessions WHERE id = ?').get('s1');
  assert.equal(lease.lease_token, null);
  db.close();
  ownerOnly('after close');
});

test('a newer schema is refused before anything is written', async () => {
  const home = tmp();
  const db = new Database(path.join(home, 'state.db'));
  db.pragma(`user_version = ${SCHEMA_VERSION + 1}`);
  db.close();
  const before = fs.readFileSync(path.join(home, 'state.db'));
  const s = new TurnsafeSession('s1', home);
  await assert.rejects(s.addItems([user('a')]), (e) => e.name === 'Refused' && e.found === SCHEMA_VERSION + 1
    && /newer than this turnsafe knows/.test(e.message));
  await assert.rejects(s.getItems(), { name: 'Refused' });
  assert.ok(before.equals(fs.readFileSync(path.join(home, 'state.db'))));
  assert.ok(!fs.existsSync(path.join(home, 'state.db-wal')));
  assert.ok(!fs.existsSync(path.join(home, 'sessions')));
  await s.close();
});

test('any SDK session id maps to a stable safe id', async () => {
  assert.equal(safeSessionId('user-42'), 'user-42');
  const odd = safeSessionId('user 42/ü');
  assert.match(odd, /^user_42__-h[0-9a-f]{32}$/);
  assert.equal(safeSessionId('user 42/ü'), odd);
  assert.notEqual(safeSessionId('../x'), '../x');
  const s = new TurnsafeSession('a/b', tmp());
  await s.addItems([user('x')]);
  assert.deepEqual(await s.getItems(), [user('x')]);
  assert.equal(await s.getSessionId(), 'a/b');
  await s.close();
});

test('the history-transaction hooks are there, atomic and idempotent by operation id', async () => {
  const s = new TurnsafeSession('s1', tmp());
  assert.ok(isSessionHistoryTransactionAwareSession(s));
  assert.equal(typeof s.replaceHistoryWithCompaction, 'function');
  const append = (operationId, items) => s.applyHistoryTransaction({ operationId, transaction: { type: 'append_items', items } });
  await append('op-1', [user('a'), user('b')]);
  await append('op-1', [user('a'), user('b')]);
  assert.deepEqual(await s.getItems(), [user('a'), user('b')]);
  await assert.rejects(append('op-1', [user('other')]), { name: 'UserError' });
  const replace = (operationId, expectedSuffix, replacement) =>
    s.applyHistoryTransaction({ operationId, transaction: { type: 'replace_suffix', expectedSuffix, replacement } });
  await assert.rejects(replace('op-2', [user('zzz')], [user('c')]), /suffix no longer matches/);
  assert.deepEqual(await s.getItems(), [user('a'), user('b')]);
  await replace('op-3', [user('b')], [user('c'), user('d')]);
  await replace('op-3', [user('b')], [user('c'), user('d')]);
  assert.deepEqual(await s.getItems(), [user('a'), user('c'), user('d')]);
  await assert.rejects(s.applyHistoryTransaction({ operationId: '', transaction: { type: 'append_items', items: [] } }),
    { name: 'UserError' });
  await assert.rejects(s.applyHistoryTransaction({ operationId: 'x', transaction: { type: 'nope' } }), { name: 'UserError' });
  const compaction = { type: 'compaction', encrypted_content: 'opaque' };
  await s.replaceHistoryWithCompaction([compaction, user('d')]);
  assert.deepEqual(await s.getItems(), [compaction, user('d')]);
  await s.close();
});

test('sessions on one home share one store and one worker', async () => {
  const home = tmp();
  const a = new TurnsafeSession('a', home);
  const b = new TurnsafeSession('b', home);
  assert.equal(a.store, b.store);
  await Promise.all([a.addItems([user('1')]), b.addItems([user('2')]), a.addItems([user('3')])]);
  assert.deepEqual(await a.getItems(), [user('1'), user('3')]);
  assert.deepEqual(await b.getItems(), [user('2')]);
  await a.close();
  await b.addItems([user('4')]);
  await b.close();
  assert.equal(a.store.closed, true);
});

test('batches that wait together are committed together; one that fails alone fails only itself', async () => {
  const home = tmp();
  const sessions = Array.from({ length: 16 }, (_, i) => new TurnsafeSession(`g${i}`, home));
  await sessions[0].getItems();
  await sessions[0].store.call('resetStats');
  // Each round's 16 batches reach the worker while it is held, so they
  // wait in its queue together, whatever the threads' timing.
  for (let round = 0; round < 3; round++) {
    await whileHeld(sessions[0].store,
      () => Promise.all(sessions.map((s, i) => s.addItems([user(`${i}/${round}/a`), user(`${i}/${round}/b`)]))));
  }
  const stats = await sessions[0].store.call('stats');
  assert.equal(stats.flushes, 48);
  assert.ok(stats.groups >= 1 && stats.writes < stats.flushes, JSON.stringify(stats));
  for (const [i, s] of sessions.entries()) {
    assert.deepEqual((await s.getItems()).map((x) => x.content),
      [0, 1, 2].flatMap((r) => [`${i}/${r}/a`, `${i}/${r}/b`]));
  }
  // In one group: a batch whose uid is stored with other content is a
  // conflict, handed back alone; the batches beside it are committed.
  const store = sessions[0].store;
  const { outcome: first } = await store.call('append', { session: 'g0', items: [user('kept')], uids: ['fixed'] });
  assert.equal(first.persisted, true);
  await store.call('resetStats');
  const answers = await whileHeld(store, () => Promise.all([
    store.call('append', { session: 'g0', items: [user('other')], uids: ['fixed'] }),
    store.call('append', { session: 'g1', items: [user('fine')] }),
    store.call('append', { session: 'g2', items: [user('fine too')] }),
  ]));
  assert.equal((await store.call('stats')).groups, 1);
  assert.deepEqual(answers.map((a) => a.outcome.persisted), [false, true, true]);
  assert.equal(answers[0].outcome.cause, 'uid_conflict');
  assert.equal(answers[0].outcome.handed_back, 1);
  assert.equal((await sessions[1].getItems()).at(-1).content, 'fine');
  for (const s of sessions) await s.close();
});

test("an edit asks the policy: another writer's live lease fences a pop, and nothing is removed", async () => {
  const home = tmp();
  const theirs = new TurnsafeSession('s1', home, { holder: 'theirs' });
  await theirs.addItems([user('a'), user('b')]);
  const ours = new TurnsafeSession('s1', home, { holder: 'ours' });
  await assert.rejects(ours.popItem(), (e) => e.name === 'TurnsafeError' && e.cause === 'turn_lease' && e.edit === 'pop');
  await assert.rejects(ours.clearSession(), (e) => e.name === 'TurnsafeError' && e.cause === 'turn_lease');
  assert.deepEqual(await ours.getItems(), [user('a'), user('b')]);
  await theirs.close();
  assert.deepEqual(await ours.popItem(), user('b'));
  if (SCHEMA_VERSION >= 4) {
    const db = new Database(path.join(home, 'state.db'), { readonly: true });
    const archived = db.prepare('SELECT item, reason, holder FROM archive WHERE session_id = ?').all('s1');
    db.close();
    assert.deepEqual(archived.map((r) => [JSON.parse(r.item), r.reason, r.holder]), [[user('b'), 'pop', 'ours']]);
  }
  await ours.close();
});

test('requests that reach the worker while it polls after an answer are taken up, in order, whatever the poll lasts', { timeout: 60_000 }, async () => {
  for (const spinMs of [0, 0.25, 50]) {
    const home = tmp();
    const s = new TurnsafeSession('s1', home, { spinMs });
    const t = new TurnsafeSession('s2', home, { spinMs });
    assert.equal(s.store, t.store);
    // A closed loop (each next batch sent while the worker still polls),
    // then a burst from two sessions at once.
    for (let i = 0; i < 20; i++) await s.addItems([user(`a${i}`)]);
    await Promise.all([s.addItems([user('b')]), t.addItems([user('c')]), s.getItems()]);
    assert.deepEqual((await s.getItems()).map((x) => x.content), [...Array.from({ length: 20 }, (_, i) => `a${i}`), 'b']);
    assert.deepEqual(await t.getItems(), [user('c')]);
    await s.close();
    await t.close();
  }
});
