// Every shared vector through the component transpiled by jco: equal to
// `expected`, and byte-identical to the native Rust answer.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { classifyJson, evaluateJson, version } from '../src/policy.mjs';
import { native, vectors } from './native.mjs';

test('every vector matches expected and native', () => {
  const vs = vectors();
  assert.ok(vs.length >= 60, `only ${vs.length} vectors`);
  const requests = vs.map((v) => JSON.stringify({ observation: v.observation, context: v.context }));
  const natives = native('evaluate', requests);
  assert.equal(natives.length, requests.length);
  const failures = [];
  vs.forEach((v, i) => {
    const out = evaluateJson(requests[i]);
    if (out !== natives[i]) {
      failures.push(`${v.name}: node ${out} != native ${natives[i]}`);
      return;
    }
    const got = JSON.parse(out);
    const summary = { cause: got.cause, basis: got.basis, action: got.action, copy_code: got.copy?.code ?? null };
    try {
      assert.deepEqual(summary, v.expected);
    } catch {
      failures.push(`${v.name}: expected ${JSON.stringify(v.expected)}, got ${JSON.stringify(summary)}`);
    }
  });
  assert.deepEqual(failures, []);
});

test('classify-json matches native', () => {
  const lines = vectors().map((v) => JSON.stringify(v.observation));
  assert.deepEqual(lines.map(classifyJson), native('classify', lines));
});

test('the component reports its version', () => {
  assert.equal(version(), '0.1.0');
});
