// The induced vectors this runtime recorded (`induced` starts with "Node")
// are induced again for real in better-sqlite3, and the observation this
// host builds (`observation` in session_writer.mjs) must equal the
// vector's: operation, codes, errno, evidence and message. Attempt,
// elapsed time and seed vary by nature and are left out.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { observation } from '../src/session_writer.mjs';
import { vectors } from './native.mjs';

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'turnsafe-node-'));

function thrown(fn) {
  try {
    fn();
  } catch (e) {
    return e;
  }
  assert.fail('the failure was not induced: nothing was thrown');
}

const INDUCERS = {
  // new Database('<missing dir>/state.db') throws a TypeError with no SQLite code.
  induced_better_sqlite3_missing_directory: () =>
    observation('open', thrown(() => new Database(path.join(tmp(), 'missing', 'state.db'))), 1, 0, 0),
};

const normalised = (o) => ({
  operation: o.operation ?? null,
  code: o.code ?? null,
  extended_code: o.extended_code ?? null,
  message: o.message ?? '',
  errno: o.errno ?? null,
  evidence: [...(o.evidence ?? [])].sort(),
});

const nodeVectors = () => vectors().filter((v) => (v.induced ?? '').startsWith('Node'));

test('every Node-induced vector has an inducer', () => {
  const names = nodeVectors().map((v) => v.name);
  assert.ok(names.length >= 1);
  assert.deepEqual(names.filter((n) => !(n in INDUCERS)), []);
});

for (const [name, induce] of Object.entries(INDUCERS)) {
  test(`node builds the recorded observation: ${name}`, () => {
    const recorded = nodeVectors().filter((v) => v.name === name);
    assert.equal(recorded.length, 1, `${name} is not a Node-induced vector`);
    assert.deepEqual(normalised(induce()), normalised(recorded[0].observation));
  });
}
