// The lease decisions (tests/vectors/lease.json) through the component from
// Node: when a writer takes over a turn lease another holder has.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { decideLeaseJson } from '../src/policy.mjs';
import { ROOT } from './native.mjs';

const VECTORS = JSON.parse(readFileSync(join(ROOT, 'tests', 'vectors', 'lease.json'), 'utf8'));

test('there are lease vectors for every verdict', () => {
  const verdicts = new Set(VECTORS.map((v) => v.expected.verdict));
  assert.deepEqual([...verdicts].sort(), ['backend_gone', 'free', 'holder_exited', 'pid_reused', 'stands']);
});

for (const v of VECTORS) {
  test(`lease vector ${v.name}`, () => {
    assert.deepEqual(JSON.parse(decideLeaseJson(JSON.stringify(v.probe))), v.expected, v.why);
  });
}

test('a probe the policy cannot read is an error', () => {
  assert.equal(typeof JSON.parse(decideLeaseJson('{"now_ms": 1, "local": "alive"}')).error, 'string');
});
