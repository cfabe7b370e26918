// Every "already stored" decision of the Node host is the one comparison of
// canonical bytes (js/src/same.js): a resend's uid conflict, a history edit
// applied already, a transaction's precondition, a history append by
// operation id and a lost COMMIT's resolution. A stored row that JSON.parse
// would make equal to the item (`1.0` for `1`, an integer past 2^53 that
// rounds to the item's) is another record, never "already stored".
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import { Host } from '../src/host.js';
import { makeOps } from '../src/ops.js';
import { tmp } from './helpers.mjs';

const item = { role: 'user', content: 'x', n: 1 };
// JSON.parse makes each of these the item above (or its 2^53 twin); their bytes differ.
const ONE_POINT_ZERO = '{"role":"user","content":"x","n":1.0}';
const BIG = { role: 'user', content: 'x', n: 9007199254740993 };
const BIG_STORED = '{"role":"user","content":"x","n":9007199254740993}';
// Other whitespace and key order: the same bytes once canonical.
const SAME_BYTES = '{ "n": 1, "content": "x", "role": "user" }';

/** Write `text` over the stored item of `uid`, as another host would have stored it. */
function storeText(home, uid, text) {
  const db = new Database(path.join(home, 'state.db'));
  try {
    assert.equal(db.prepare('UPDATE messages SET item = ? WHERE uid = ?').run(text, uid).changes, 1);
  } finally {
    db.close();
  }
}

const rowCount = (home) => {
  const db = new Database(path.join(home, 'state.db'), { readonly: true });
  try {
    return db.prepare('SELECT count(*) AS n FROM messages').get().n;
  } finally {
    db.close();
  }
};

test('a resend meets a stored row of other bytes as a conflict, never as committed', () => {
  for (const [stored, live] of [[ONE_POINT_ZERO, item], [BIG_STORED, BIG]]) {
    const home = tmp();
    const h = new Host(home);
    try {
      assert.equal(h.append('s', [live], ['u1']).outcome.persisted, true);
      storeText(home, 'u1', stored);
      const again = h.append('s', [live], ['u1']);
      assert.equal(again.outcome.persisted, false, `${stored} taken for ${JSON.stringify(live)}`);
      // The same bytes, written otherwise, are the same record: idempotent.
      storeText(home, 'u1', SAME_BYTES);
      assert.equal(h.append('s', [item], ['u1']).outcome.persisted, true);
      assert.equal(rowCount(home), 1);
    } finally {
      h.close();
    }
  }
});

test('a history append by operation id is a conflict when its uid holds other bytes', () => {
  const home = tmp();
  const ops = makeOps(home, {});
  try {
    assert.equal(ops.appendTransaction({ session: 's', items: [item], uids: ['op-1'] }).outcome.persisted, true);
    assert.deepEqual(ops.appendTransaction({ session: 's', items: [item], uids: ['op-1'] }), { already: true });
    storeText(home, 'op-1', ONE_POINT_ZERO);
    assert.throws(() => ops.appendTransaction({ session: 's', items: [item], uids: ['op-1'] }),
      /already applied with a different transaction/);
  } finally {
    ops.close();
  }
});

test('a replacement applied already is only one with the same bytes', () => {
  const home = tmp();
  const h = new Host(home);
  try {
    assert.deepEqual(h.replace('s', null, [item], ['r1']), { applied: true });
    assert.deepEqual(h.replace('s', null, [item], ['r1']), { applied: false });
    storeText(home, 'r1', ONE_POINT_ZERO);
    assert.throws(() => h.replace('s', null, [item], ['r1']), /already applied with a different transaction/);
  } finally {
    h.close();
  }
});

test('a suffix transaction holds only when the stored suffix has the expected bytes', () => {
  const home = tmp();
  const h = new Host(home);
  try {
    assert.equal(h.append('s', [item], ['a1']).outcome.persisted, true);
    storeText(home, 'a1', BIG_STORED);
    // What the caller read back through JSON.parse: the digits past 2^53 are gone.
    const read = h.show('s');
    assert.deepEqual(read, [BIG]);
    assert.throws(() => h.replace('s', read, [{ role: 'user', content: 'y' }], ['b1'], 'replace_suffix'),
      /suffix no longer matches/);
    storeText(home, 'a1', SAME_BYTES);
    assert.deepEqual(h.replace('s', [item], [{ role: 'user', content: 'y' }], ['b1'], 'replace_suffix'), { applied: true });
  } finally {
    h.close();
  }
});

test("a lost COMMIT took effect only when every uid holds its item's bytes", () => {
  const home = tmp();
  const h = new Host(home);
  try {
    assert.equal(h.append('s', [item, { role: 'user', content: 'z' }], ['c1', 'c2']).outcome.persisted, true);
    const batch = { session: 's', uids: ['c1', 'c2'], items: [item, { role: 'user', content: 'z' }] };
    assert.deepEqual(h.resolve(batch, performance.now()), { type: 'resolved', all_stored: true });
    storeText(home, 'c1', ONE_POINT_ZERO);
    assert.deepEqual(h.resolve(batch, performance.now()), { type: 'resolved', all_stored: false });
    storeText(home, 'c1', SAME_BYTES);
    assert.deepEqual(h.resolve(batch, performance.now()), { type: 'resolved', all_stored: true });
    assert.deepEqual(h.resolve({ ...batch, uids: ['c1', 'c3'] }, performance.now()), { type: 'resolved', all_stored: false });
  } finally {
    h.close();
  }
});
