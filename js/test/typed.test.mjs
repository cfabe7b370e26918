// The two ways into the one flush machine (src/flush.js): the typed
// resources, which carry a batch on a clean handle down the write-and-commit
// road, and flush-step-json, which decides every other step. They must be
// the same machine: every shared flush sequence gives the same steps and
// the same outcome bytes through both; a failed write after a typed start
// ends exactly as it ends with flush-step-json alone; and a handle that is
// not clean never takes the typed road.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import Database from 'better-sqlite3';

import { Host } from '../src/host.js';
import { flushStep, outcomeText, typedEvent, typedHandle, typedPoll, typedStart } from '../src/policy.js';
import { ROOT, tmp } from './helpers.mjs';

const kebab = (s) => s.replaceAll('_', '-');
const snake = (s) => s.replaceAll('-', '_');
const big = (n) => (n === null || n === undefined ? undefined : BigInt(n));

/** A flush-step-json event as the typed `event` variant. */
function typedEventOf(e) {
  switch (e.type) {
    case 'opened':
    case 'committed':
      return { tag: e.type };
    case 'failed':
      return { tag: 'failed', val: {
        engine: e.engine ?? (e.sqlstate ? 'postgres' : 'sqlite'),
        sqlstate: e.sqlstate ?? undefined,
        code: big(e.code),
        extendedCode: big(e.extended_code),
        message: e.message ?? '',
        errno: big(e.errno),
        evidence: (e.evidence ?? []).map(kebab),
        elapsedMs: BigInt(e.elapsed_ms ?? 0),
        lease: e.lease ? { name: e.lease.name, place: kebab(e.lease.place), pid: e.lease.pid ?? undefined,
          backendPid: e.lease.backend_pid ?? undefined, expiresMs: big(e.lease.expires_ms) } : undefined,
      } };
    case 'waited':
      return { tag: 'waited', val: BigInt(e.elapsed_ms) };
    case 'resolved':
      return { tag: 'resolved', val: e.all_stored };
    case 'captured':
      return { tag: 'captured', val: { path: e.receipt.path, manifestSha256: e.receipt.manifest_sha256,
        files: e.receipt.files.map((f) => ({ name: f.name, size: BigInt(f.size) })) } };
    case 'capture_failed':
      return { tag: 'capture-failed', val: { failure: { operation: e.operation, errno: big(e.errno) }, error: e.error } };
    case 'diverted':
      return { tag: 'diverted', val: { path: e.receipt.path, offset: BigInt(e.receipt.offset), length: BigInt(e.receipt.length),
        count: BigInt(e.receipt.count), sha256: e.receipt.sha256 } };
    case 'divert_failed':
      return { tag: 'divert-failed', val: { failure: { operation: e.operation, errno: big(e.errno) }, message: e.message,
        residue: e.residue ? { path: e.residue.path, offset: BigInt(e.residue.offset) } : undefined } };
    default:
      throw new Error(`no typed form for event ${e.type}`);
  }
}

/** A typed step in flush-step-json's form, and the outcome's text when it is `done`. */
function jsonStepOf(s) {
  switch (s.tag) {
    case 'write':
      return { step: { plan: { degrade_fts: s.val.degradeFts, recreate_session: s.val.recreateSession }, type: 'write' } };
    case 'wait':
      return { step: { ms: Number(s.val), type: 'wait' } };
    case 'divert':
      return { step: { cause: snake(s.val), type: 'divert' } };
    case 'done':
      return { step: { outcome: JSON.parse(s.val), type: 'done' }, text: s.val };
    default:
      return { step: { type: s.tag } };
  }
}

const cases = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests', 'vectors', 'flush_sequences.json'), 'utf8'));

test('every flush sequence gives the same steps and outcome bytes through the typed bindings as through flush-step-json', () => {
  assert.ok(cases.length >= 35, `only ${cases.length} sequences`);
  let done = 0;
  for (const c of cases) {
    let state = null;
    const handle = typedHandle();
    c.turns.forEach((turn, i) => {
      let answer = flushStep({ state, start: turn.start });
      const jsonSteps = [JSON.parse(answer).step];
      const flush = typedStart(handle, turn.start);
      const typed = [jsonStepOf(typedPoll(flush))];
      for (const event of turn.events) {
        answer = flushStep({ state: JSON.parse(answer).state, event });
        jsonSteps.push(JSON.parse(answer).step);
        typedEvent(flush, typedEventOf(event));
        typed.push(jsonStepOf(typedPoll(flush)));
      }
      state = JSON.parse(answer).state;
      assert.deepEqual(typed.map((t) => t.step), jsonSteps, `${c.name} turn ${i}`);
      const last = typed.at(-1);
      if (last.step.type === 'done') {
        assert.equal(last.text, outcomeText(answer), `${c.name} turn ${i}: the outcome's bytes`);
        done += 1;
      }
      flush[Symbol.dispose]();
    });
    handle[Symbol.dispose]();
  }
  assert.ok(done >= 35, `only ${done} outcomes compared`);
});

const user = (content) => ({ role: 'user', content });

test('a batch on a clean handle takes the typed road, and its outcome is the JSON machine\'s bytes', () => {
  const runs = [true, false].map((typedFlush) => {
    const h = new Host(tmp(), { typedFlush });
    const first = h.append('s1', [user('a')], ['u1']);
    const second = h.append('s1', [user('b'), user('c')], ['u2', 'u3']);
    const counters = { ...h.counters };
    h.close();
    return { first, second, counters };
  });
  const [typed, json] = runs;
  // The first batch opens the store: flush-step-json's road; the second is typed.
  assert.equal(typed.counters.typed, 1);
  assert.equal(json.counters.typed, 0);
  assert.equal(typed.first.text, json.first.text);
  assert.equal(typed.second.text, json.second.text);
  assert.equal(typed.second.outcome.persisted, true);
  assert.equal(typed.second.outcome.committed, 2);
});

test('a failed write after a typed start ends as it ends with flush-step-json alone', () => {
  // A uid stored with other bytes: a conflict, handed back, whichever door.
  const runs = [true, false].map((typedFlush) => {
    const h = new Host(tmp(), { typedFlush });
    h.append('s1', [user('kept')], ['fixed']);
    const before = h.counters.typed;
    const conflict = h.append('s1', [user('other'), user('fine')], ['fixed', 'u2']);
    const after = h.append('s1', [user('later')], ['u3']);
    const counters = { typedBefore: before, ...h.counters };
    h.close();
    return { conflict, after, counters };
  });
  const [typed, json] = runs;
  assert.equal(typed.conflict.outcome.persisted, false);
  assert.equal(typed.conflict.outcome.cause, 'uid_conflict');
  assert.equal(typed.conflict.outcome.handed_back, 2);
  assert.equal(typed.conflict.text, json.conflict.text, 'the outcome differs between the two doors');
  // The conflict was started typed and handed over; the batch after it is typed again.
  assert.equal(typed.counters.handedOver, 1);
  assert.equal(typed.counters.typed, 1);
  assert.equal(typed.after.outcome.persisted, true);
  assert.equal(typed.after.text, json.after.text);
});

test('a handle that is not clean never takes the typed road: a sticky store diverts every batch through flush-step-json', () => {
  const home = tmp();
  const h = new Host(home);
  h.append('s1', [user('a')], ['u1']);
  // state.db replaced under the connection: the guard's evidence, a sticky cause.
  const db = path.join(home, 'state.db');
  fs.renameSync(db, `${db}.moved`);
  fs.copyFileSync(`${db}.moved`, db);
  const replaced = h.append('s1', [user('b')], ['u2']);
  assert.equal(replaced.outcome.persisted, false);
  assert.equal(replaced.outcome.cause, 'replaced');
  assert.ok(h.stickyCause(), 'the handle is sticky');
  const typedBefore = h.counters.typed;
  const later = h.append('s1', [user('c')], ['u3']);
  assert.equal(later.outcome.persisted, false);
  assert.equal(later.outcome.cause, 'replaced');
  assert.equal(later.outcome.diverted, 1);
  assert.equal(h.counters.typed, typedBefore, 'a batch on a sticky handle took the typed road');
  h.close();
  // Nothing of the later batches reached the database at the path.
  const check = new Database(db, { readonly: true });
  const uids = check.prepare('SELECT uid FROM messages').all().map((r) => r.uid);
  check.close();
  assert.ok(!uids.includes('u3'));
});

test('a fault of the host on the typed road is that batch\'s error; the store goes on, typed', () => {
  const h = new Host(tmp());
  h.append('s1', [user('a')], ['u1']);
  const write = h.writeGroup;
  h.writeGroup = () => {
    throw new Error('a fault of the host');
  };
  assert.throws(() => h.append('s1', [user('b')], ['u2']), /a fault of the host/);
  h.writeGroup = write;
  const typed = h.counters.typed;
  const after = h.append('s1', [user('c')], ['u3']);
  assert.equal(after.outcome.persisted, true);
  assert.equal(h.counters.typed, typed + 1);
  h.close();
});
