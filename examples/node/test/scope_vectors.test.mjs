// The failure scopes (tests/vectors/scope.json) through the component from
// Node: how far a failure inside a group's transaction reaches (the batch's
// savepoint or the whole transaction).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { decideScopeJson } from '../src/policy.mjs';
import { ROOT } from './native.mjs';

const VECTORS = JSON.parse(readFileSync(join(ROOT, 'tests', 'vectors', 'scope.json'), 'utf8'));

test('there are scope vectors for both scopes', () => {
  assert.deepEqual([...new Set(VECTORS.map((v) => v.expected.scope))].sort(), ['batch', 'transaction']);
  assert.ok(VECTORS.length >= 40);
});

for (const v of VECTORS) {
  test(`scope vector ${v.name}`, () => {
    assert.deepEqual(JSON.parse(decideScopeJson(JSON.stringify(v.request))), v.expected, v.why);
  });
}

test('a request without the transaction\'s state is an error', () => {
  assert.equal(typeof JSON.parse(decideScopeJson('{"observation": {"code": 13}}')).error, 'string');
});
