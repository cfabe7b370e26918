// One home, two hosts: what the JavaScript host writes, the native CLI
// shows, searches and checks, and the other way round; seqs continue across
// them, and the turn lease of one fences the other until it is given back.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { SCHEMA_VERSION, TurnsafeSession } from '../src/index.js';
import { ROOT, tmp, turnsafe } from './helpers.mjs';

const user = (content) => ({ role: 'user', content });

function append(home, session, batches, extra = []) {
  const r = turnsafe(['append', '--home', home, '--session', session, ...extra], batches.map((b) => JSON.stringify(b)).join('\n') + '\n');
  return { ...r, outcomes: r.lines };
}

const rows = (home, session) => turnsafe(['show', '--home', home, '--session', session, '--json']).lines
  .filter((l) => l.type === 'message').map((l) => l.data);

test('native writes, JavaScript reads and continues, native continues after it', async () => {
  const home = tmp();
  const tool = { type: 'function_call', callId: 'c1', name: 'lookup', arguments: '{"q":"ü"}', providerData: { n: 1.5, z: null } };
  let r = append(home, 's1', [{ items: [user('native one'), tool], uids: ['n1', 'n2'] }]);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.outcomes[0].persisted, true);
  const s = new TurnsafeSession('s1', home);
  assert.deepEqual(await s.getItems(), [user('native one'), tool]);
  await s.addItems([user('js three'), user('js four')]);
  await s.close();
  r = append(home, 's1', [[user('native five')]]);
  assert.equal(r.outcomes[0].persisted, true, JSON.stringify(r.outcomes[0]));
  const all = rows(home, 's1');
  assert.deepEqual(all.map((x) => x.seq), [1, 2, 3, 4, 5]);
  assert.deepEqual(all.map((x) => x.message.content ?? x.message.type),
    ['native one', 'function_call', 'js three', 'js four', 'native five']);
  assert.deepEqual(all.slice(0, 2).map((x) => x.uid), ['n1', 'n2']);
  const again = new TurnsafeSession('s1', home);
  assert.equal((await again.getItems()).length, 5);
  await again.close();
});

test('what JavaScript wrote is searched and checked by the native CLI', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  await s.addItems([user('the refund policy is thirty days'), { role: 'assistant', type: 'message', status: 'completed',
    content: [{ type: 'output_text', text: 'noted the refund' }] }]);
  await s.close();
  const search = turnsafe(['search', '--home', home, 'refund', '--json']);
  assert.equal(search.status, 0, search.stderr);
  const hits = search.lines.filter((l) => l.type === 'hit');
  assert.equal(hits.length, 2);
  assert.ok(hits.every((h) => h.data.session === 's1'));
  const doctor = turnsafe(['doctor', '--home', home, '--json']);
  assert.equal(doctor.status, 0, doctor.stdout);
  // The index the native search built is kept true by JavaScript's edits.
  const again = new TurnsafeSession('s1', home);
  await again.popItem();
  await again.close();
  const after = turnsafe(['search', '--home', home, 'refund', '--json']).lines.filter((l) => l.type === 'hit');
  assert.equal(after.length, 1);
  assert.equal(turnsafe(['doctor', '--home', home, '--json']).status, 0);
});

test("a resend after a failure is idempotent across hosts: the native host's uids, the same rows", async () => {
  const home = tmp();
  const r = append(home, 's1', [{ items: [user('a'), user('b')], uids: ['u1', 'u2'] }]);
  assert.equal(r.outcomes[0].persisted, true);
  // The native append resent with the same uids and items stores nothing twice.
  const again = append(home, 's1', [{ items: [user('a'), user('b')], uids: ['u1', 'u2'] }]);
  assert.equal(again.outcomes[0].persisted, true);
  const s = new TurnsafeSession('s1', home);
  // The same uid with other content is a conflict, handed back.
  await assert.rejects(s.store.call('append', { session: 's1', items: [user('changed')], uids: ['u1'] })
    .then(({ outcome }) => {
      if (!outcome.persisted) throw Object.assign(new Error(outcome.error), { outcome });
    }), (e) => e.outcome.cause === 'uid_conflict' && e.outcome.handed_back === 1);
  const { outcome } = await s.store.call('append', { session: 's1', items: [user('a')], uids: ['u1'] });
  assert.equal(outcome.persisted, true);
  assert.deepEqual((await s.getItems()).map((i) => i.content), ['a', 'b']);
  await s.close();
});

test("the turn lease: a live JavaScript session fences the native writer until close() gives it back", async () => {
  const home = tmp();
  const s = new TurnsafeSession('s1', home, { holder: 'js' });
  await s.addItems([user('mine')]);
  const fenced = append(home, 's1', [[user('theirs')]]);
  assert.equal(fenced.status, 3);
  assert.equal(fenced.outcomes[0].cause, 'turn_lease');
  assert.equal(fenced.outcomes[0].handed_back, 1);
  await s.close();
  const after = append(home, 's1', [[user('theirs')]]);
  assert.equal(after.outcomes[0].persisted, true, JSON.stringify(after.outcomes[0]));
  // And the other way: the native writer's lease is released when it ends,
  // so the JavaScript session writes on.
  const again = new TurnsafeSession('s1', home);
  await again.addItems([user('mine again')]);
  await again.close();
  assert.deepEqual(rows(home, 's1').map((x) => x.message.content), ['mine', 'theirs', 'mine again']);
});

const norm = (sql) => (sql ?? '').replace(/\s+/g, ' ').trim();

/** The schema of the home's state.db as sqlite_master has it, with its state_meta keys and journal mode. */
const schemaOf = (home) => {
  const db = new Database(path.join(home, 'state.db'), { readonly: true });
  try {
    return {
      version: db.pragma('user_version', { simple: true }),
      objects: db.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name")
        .all().map((o) => ({ ...o, sql: norm(o.sql) })),
      meta: db.prepare("SELECT key FROM state_meta ORDER BY key").all().map((r) => r.key),
      journal: db.pragma('journal_mode', { simple: true }),
    };
  } finally {
    db.close();
  }
};

test('the JavaScript host creates the very schema the native host creates', async () => {
  const native = tmp();
  assert.equal(append(native, 's1', [[user('x')]]).status, 0);
  const js = tmp();
  const s = new TurnsafeSession('s1', js);
  await s.addItems([user('x')]);
  await s.close();
  assert.deepEqual(schemaOf(js), schemaOf(native));
  assert.equal(schemaOf(js).version, SCHEMA_VERSION);
  if (SCHEMA_VERSION >= 6) {
    assert.deepEqual(schemaOf(js).objects.filter((o) => o.tbl_name.startsWith('checkpoint')).map((o) => o.name).sort(),
      ['checkpoint_writes', 'checkpoints', 'checkpoints_by_run']);
  }
});

test('the JavaScript host migrates homes of schema 3, 4 and 5 to the very schema the native host migrates them to', async () => {
  const tables = (home) => {
    const db = new Database(path.join(home, 'state.db'), { readonly: true });
    try {
      const all = (sql) => db.prepare(sql).all();
      const has = (name) => db.prepare('SELECT 1 FROM sqlite_master WHERE name = ?').get(name) !== undefined;
      return {
        messages: all('SELECT * FROM messages ORDER BY id'),
        archive: has('archive') ? all('SELECT * FROM archive ORDER BY id') : [],
        sessionMeta: has('session_meta') ? all('SELECT * FROM session_meta ORDER BY session_id') : [],
      };
    } finally {
      db.close();
    }
  };
  for (const [fixture, was, counts] of [['state-v3.db', 3, [6, 0, 0]], ['state-v4.db', 4, [4, 2, 0]], ['state-v5.db', 5, [9, 7, 2]]]) {
    const homes = [tmp(), tmp()];
    for (const home of homes) fs.copyFileSync(path.join(ROOT, 'tests', 'fixtures', fixture), path.join(home, 'state.db'));
    const [native, js] = homes;
    const before = tables(js);
    assert.equal(schemaOf(js).version, was, fixture);
    assert.deepEqual([before.messages.length, before.archive.length, before.sessionMeta.length], counts, fixture);
    const r = append(native, 's1', [[user('after')]]);
    assert.equal(r.status, 0, r.stderr);
    const s = new TurnsafeSession('s1', js);
    await s.addItems([user('after')]);
    await s.close();
    assert.equal(schemaOf(js).version, SCHEMA_VERSION, fixture);
    assert.deepEqual(schemaOf(js), schemaOf(native), fixture);
    // Every row that was stored stays exactly as it was; one was added.
    const after = tables(js);
    assert.deepEqual(after.messages.slice(0, -1), before.messages, fixture);
    assert.equal(JSON.parse(after.messages.at(-1).item).content, 'after', fixture);
    assert.deepEqual(after.archive, before.archive, fixture);
    assert.deepEqual(after.sessionMeta, before.sessionMeta, fixture);
  }
});

test('an object keyed like serde_json\'s number token crosses both hosts as written', async () => {
  // serde_json with `arbitrary_precision` reserves this key for numbers;
  // the native host must still read it as the key it is.
  const token = { role: 'tool', content: { '$serde_json::private::Number': '12' } };
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  await s.addItems([token]);
  await s.close();
  let r = append(home, 's1', [{ items: [token], uids: [rows(home, 's1')[0].uid] }]);
  assert.equal(r.outcomes[0].persisted, true, JSON.stringify(r.outcomes[0]));
  assert.deepEqual(rows(home, 's1').map((x) => x.message), [token]);
  // The number the value spells is other content: a conflict, never "already stored".
  r = append(home, 's1', [{ items: [{ role: 'tool', content: 12 }], uids: [rows(home, 's1')[0].uid] }]);
  assert.equal(r.outcomes[0].cause, 'uid_conflict', JSON.stringify(r.outcomes[0]));
  // Written natively (spelled with escapes), read by JavaScript as written.
  r = turnsafe(['append', '--home', home, '--session', 's2'], '[{"role":"tool","content":{"\\u0024serde_json::private::Number":"x"}}]\n');
  assert.equal(r.lines[0].persisted, true, r.stderr);
  const back = new TurnsafeSession('s2', home);
  assert.deepEqual(await back.getItems(), [{ role: 'tool', content: { '$serde_json::private::Number': 'x' } }]);
  await back.close();
});
