// Items cross from a session to its store as their JSON texts, and the
// store keeps those texts as the rows' `item` (ops.js batchOf) instead of
// writing each parsed item out again. That is sound only if writing out
// what JSON.parse made of a text JSON.stringify wrote gives that text back:
// held here for items chosen to stress it, and for the rows a session stores.
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import Database from 'better-sqlite3';

import { TurnsafeSession } from '../src/index.js';
import { tmp } from './helpers.mjs';

const tricky = [
  { role: 'user', content: 'plain' },
  { role: 'user', content: 'lone surrogates \ud800 and \udfff, a pair 😀, controls \u0000\u001f\u007f\u2028\u2029, quotes "\\' },
  { n: [0, -0, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 0.1 + 0.2, -1.5, 9007199254740993] },
  { 2: 'integer-like keys', 10: 'come first', b: 1, a: 2, '-1': 'not integer-like', '01': 'nor this' },
  JSON.parse('{"__proto__": {"own": true}, "constructor": "x"}'),
  { nested: { deep: [{ x: [[], {}, null, true, false] }] }, undefinedField: undefined, fn: () => 1 },
  { date: new Date(0), toJSONd: { toJSON: () => ({ replaced: 'by toJSON' }) } },
  { text: 'é'.repeat(100), emoji: '👩‍👩‍👧‍👦' },
];

test('what JSON.parse makes of a JSON.stringify text is written out as the same text', () => {
  for (const item of tricky) {
    const text = JSON.stringify(item);
    assert.equal(JSON.stringify(JSON.parse(text)), text);
  }
});

test("a session's rows hold each item's own JSON text, through the worker and in the calling thread", async () => {
  for (const thread of [true, false]) {
    const home = tmp();
    const s = new TurnsafeSession('s1', home, { thread });
    await s.addItems(tricky);
    assert.deepEqual(await s.getItems(), tricky.map((i) => JSON.parse(JSON.stringify(i))));
    await s.close();
    const db = new Database(path.join(home, 'state.db'), { readonly: true });
    const rows = db.prepare('SELECT item FROM messages WHERE session_id = ? ORDER BY seq').all('s1').map((r) => r.item);
    db.close();
    assert.deepEqual(rows, tricky.map((i) => JSON.stringify(i)));
  }
});
