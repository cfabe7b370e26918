// The flush machine's event-sequence vectors, through the component from
// JavaScript: every step, down to the outcome, must be the one the vectors
// hold (the Rust runner checks the same file natively and in wasmtime).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { flushStep } from '../src/policy.mjs';
import { SessionWriter } from '../src/session_writer.mjs';
import { ROOT } from './native.mjs';

const cases = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests', 'vectors', 'flush_sequences.json'), 'utf8'));

test('every sequence gives the expected steps', () => {
  assert.ok(cases.length >= 35);
  for (const c of cases) {
    let state = null;
    c.turns.forEach((turn, i) => {
      let answer = JSON.parse(flushStep({ state, start: turn.start }));
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

test('the outcome text is the component\'s own', () => {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'ts-node-'));
  const w = new SessionWriter(home, 's1');
  const out = w.append([{ role: 'user', content: 'hi', uid: 'u1' }]);
  assert.equal(out.persisted, true);
  assert.deepEqual(JSON.parse(w.outcomeText), out);
  assert.equal(w.outcomeText, JSON.stringify(out));
});

test('a malformed state is refused', () => {
  const answer = JSON.parse(flushStep({ state: { v: 99 }, event: { type: 'opened' } }));
  assert.match(answer.error, /the state is not one this policy wrote/);
});
