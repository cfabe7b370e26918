// Every shared vector file of tests/vectors/, through the component this
// package ships. The Rust suite runs each file of that folder
// (tests/vectors.rs and tests/induced_vectors.rs read all of it,
// tests/flush_sequences.rs the event sequences), and so does this one:
// FILES names each file and what runs it here, and a file of the folder
// missing from it is a failure.
// - decisions: the component's evaluate-json meets `expected` (cause,
//   basis, action, copy code; a retry carries its delay), and its
//   evaluate-json and classify-json answers are the native host's, byte
//   for byte (`turnsafe evaluate`, `turnsafe classify`);
// - flush sequences: every step, down to the outcome, is the one the
//   vectors hold;
// - leases: decide-lease-json's verdict on each probe is `expected`;
// - scopes: decide-scope-json's scope for each failure in a group write is `expected`.
// The induced ones are also induced again, each by the runtime that
// recorded it: those recorded from this package's host by test/induced.test.mjs.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { engine } from '../gen/policy/turnsafe_policy.js';
import { Host } from '../src/host.js';
import { classifyJson, decideScope, flushStep, version } from '../src/policy.js';
import { ROOT, tmp, turnsafe } from './helpers.mjs';

const DIR = path.join(ROOT, 'tests', 'vectors');
const FILES = {
  'codes.json': 'decisions',
  'evidence.json': 'decisions',
  'flush_sequences.json': 'flush sequences',
  'induced.json': 'decisions',
  'induced_js.json': 'decisions',
  'lease.json': 'leases',
  'messages.json': 'decisions',
  'phrases.json': 'decisions',
  'postgres.json': 'decisions',
  'scope.json': 'scopes',
};

const read = (f) => JSON.parse(fs.readFileSync(path.join(DIR, f), 'utf8'));
// A file named here but missing is reported by the first test; the others run on what is there.
const filesOf = (runner) => Object.keys(FILES).filter((f) => FILES[f] === runner && fs.existsSync(path.join(DIR, f)));
const cases = filesOf('flush sequences').flatMap(read);
const decisions = filesOf('decisions').flatMap(read);
const leases = filesOf('leases').flatMap(read);
const scopes = filesOf('scopes').flatMap(read);

test('every lease vector gets its verdict', () => {
  assert.ok(leases.length >= 12, `only ${leases.length} lease vectors`);
  for (const v of leases) {
    assert.deepEqual(JSON.parse(engine.decideLeaseJson(JSON.stringify(v.probe))), v.expected, `${v.name}: ${v.why}`);
  }
});

test('every scope vector reaches as far as expected, through the host\'s own wrapper', () => {
  assert.ok(scopes.length >= 40, `only ${scopes.length} scope vectors`);
  for (const v of scopes) {
    assert.deepEqual(JSON.parse(decideScope(v.request)), v.expected, `${v.name}: ${v.why}`);
  }
  assert.deepEqual([...new Set(scopes.map((v) => v.expected.scope))].sort(), ['batch', 'transaction']);
});

test('every vector file the Rust suite runs is run here', () => {
  // What the Rust runners take: the whole folder (so any file in it), and
  // the sequences by name.
  const source = (f) => fs.readFileSync(path.join(ROOT, 'tests', f), 'utf8');
  for (const runner of ['vectors.rs', 'induced_vectors.rs']) {
    assert.match(source(runner), /join\("tests\/vectors"\)[\s\S]*read_dir\(/, `tests/${runner} no longer reads the whole folder`);
  }
  assert.match(source('flush_sequences.rs'), /flush_sequences\.json/);
  const folder = fs.readdirSync(DIR).filter((f) => f.endsWith('.json')).sort();
  assert.deepEqual(folder.filter((f) => !(f in FILES)), [], 'vector files the Rust suite runs and this one does not');
  assert.deepEqual(Object.keys(FILES).filter((f) => !folder.includes(f)), [], 'vector files named here that are not in tests/vectors/');
});

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

test('every decision vector gives its expected answer, the native host\'s bytes', () => {
  assert.ok(decisions.length >= 300, `only ${decisions.length} vectors`);
  const names = decisions.map((v) => v.name);
  assert.equal(new Set(names).size, names.length, 'duplicate vector names');
  assert.ok(decisions.filter((v) => v.induced).length >= 5, 'too few vectors from real failures');
  const requests = decisions.map((v) => JSON.stringify({ observation: v.observation, context: v.context }));
  const native = turnsafe(['evaluate'], `${requests.join('\n')}\n`);
  assert.equal(native.status, 0, native.stderr);
  const natives = native.stdout.split('\n').filter(Boolean);
  assert.equal(natives.length, requests.length);
  const failures = [];
  decisions.forEach((v, i) => {
    const answer = engine.evaluateJson(requests[i]);
    if (answer !== natives[i]) {
      failures.push(`${v.name}: the component and the native host differ\n  js:     ${answer}\n  native: ${natives[i]}`);
      return;
    }
    const out = JSON.parse(answer);
    const got = { cause: out.cause, basis: out.basis, action: out.action, copy_code: out.copy?.code ?? null };
    try {
      assert.deepEqual(got, v.expected);
    } catch {
      failures.push(`${v.name}: expected ${JSON.stringify(v.expected)}, got ${JSON.stringify(got)}`);
    }
    if (out.action === 'retry' && !Number.isInteger(out.delay_ms)) failures.push(`${v.name}: retry without delay_ms`);
  });
  assert.deepEqual(failures, []);
});

test('classify-json answers every decision vector as the native host does', () => {
  const lines = decisions.map((v) => JSON.stringify(v.observation));
  const native = turnsafe(['classify'], `${lines.join('\n')}\n`);
  const natives = native.stdout.split('\n').filter(Boolean);
  assert.equal(natives.length, lines.length, native.stderr);
  const differ = lines.flatMap((l, i) => {
    const js = classifyJson(l);
    return js === natives[i] ? [] : [`${decisions[i].name}:\n  js:     ${js}\n  native: ${natives[i]}`];
  });
  assert.deepEqual(differ, []);
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
