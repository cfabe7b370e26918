// The flush machine's event-sequence vectors (tests/vectors/flush_sequences.json),
// through the component this package ships: every step, down to the
// outcome, must be the one the vectors hold (the Rust runner checks the
// same file natively and in wasmtime, the examples in wasmtime-py and jco).
// The classification vectors (every other tests/vectors/*.json) give the
// same cause, basis and action through it too.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { Host } from '../src/host.js';
import { classifyJson, flushStep, version } from '../src/policy.js';
import { ROOT, tmp, turnsafe } from './helpers.mjs';

const cases = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests', 'vectors', 'flush_sequences.json'), 'utf8'));

test('every flush sequence gives the expected steps', () => {
  assert.ok(cases.length >= 35, `only ${cases.length} sequences`);
  for (const c of cases) {
    let state = null;
    c.turns.forEach((turn, i) => {
      let answer = JSON.parse(flushStep({ state, start: turn.start }));
      assert.equal(answer.error, undefined, `${c.name}: ${answer.error}`);
      const steps = [answer.step];
      for (const event of turn.events) {
        answer = JSON.parse(flushStep({ state: answer.state, event }));
        assert.equal(answer.error, undefined, `${c.name}: ${answer.error}`);
        steps.push(answer.step);
      }
      state = answer.state;
      assert.deepEqual(steps, turn.steps, `${c.name} turn ${i}`);
    });
  }
});

test('every classification vector gives its cause, basis and action', () => {
  const dir = path.join(ROOT, 'tests', 'vectors');
  const vectors = fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.json') && f !== 'flush_sequences.json')
    .sort()
    .flatMap((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')));
  assert.ok(vectors.length >= 300, `only ${vectors.length} vectors`);
  const failures = [];
  for (const v of vectors) {
    const got = JSON.parse(classifyJson(JSON.stringify(v.observation)));
    const have = `${got.cause}/${got.basis}/${got.action}`;
    const want = `${v.expected.cause}/${v.expected.basis}/${v.expected.action}`;
    if (have !== want) failures.push(`${v.name}: expected ${want}, got ${have}`);
  }
  assert.deepEqual(failures, []);
});

test('the component is the one the native binary carries', () => {
  const wasm = fs.readFileSync(path.join(ROOT, 'js', 'gen', 'turnsafe_policy.wasm'));
  const dir = tmp();
  const out = path.join(dir, 'p.wasm');
  const r = turnsafe(['component', '--out', out]);
  assert.equal(r.status, 0, r.stderr);
  assert.ok(wasm.equals(fs.readFileSync(out)), 'js/gen is stale: run npm run build');
  assert.match(version(), /^\d+\.\d+\.\d+/);
});

test("the host's outcome is the component's own text", () => {
  const h = new Host(tmp());
  const { outcome, text } = h.append('s1', [{ role: 'user', content: 'hi' }], ['u1']);
  assert.equal(outcome.persisted, true);
  assert.equal(text, JSON.stringify(outcome));
  assert.deepEqual(outcome.uids, ['u1']);
  assert.deepEqual(outcome.minted_uids, []);
  h.close();
});

test('a state the component did not write is refused', () => {
  const answer = JSON.parse(flushStep({ state: { v: 99 }, event: { type: 'opened' } }));
  assert.match(answer.error, /the state is not one this policy wrote/);
});
