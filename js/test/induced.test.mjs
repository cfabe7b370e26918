// The induced vectors this package's host recorded (`induced` starts with
// "JavaScript"; tests/vectors/induced_js.json, from the observations its
// recorder wrote during this suite, src/record.js) are induced again for
// real, each as its test induces it, and the observation the host builds
// must equal the vector's: operation, codes, errno, evidence and message.
// Attempt, elapsed time and seed vary by nature and are left out, and so
// does the number of an inode a message names. tests/induced_vectors.rs
// fails on a vector of this runtime missing from INDUCERS.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { TurnsafeSession } from '../src/index.js';
import { ROOT, holdLock, isRoot, need, tmp } from './helpers.mjs';

// Every observation the hosts of this process and its workers make from
// here on, one JSON line each (the workers take the variable when they start).
const RECORD = path.join(tmp(), 'observations.jsonl');
fs.writeFileSync(RECORD, '');
process.env.TURNSAFE_JS_RECORD_OBSERVATIONS = RECORD;

const recorded = () => fs.readFileSync(RECORD, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));

/** Resolves once the recorder holds `n` observations (on the file's own change events). */
async function recordedAtLeast(n) {
  const watcher = fs.watch(RECORD);
  try {
    for (;;) {
      const have = recorded();
      if (have.length >= n) return have;
      await once(watcher, 'change');
    }
  } finally {
    watcher.close();
  }
}

const user = (content) => ({ role: 'user', content });

async function rejected(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail('the failure was not induced: the call succeeded');
}

/**
 * Another process holds the write lock while `call(session)` runs in the
 * worker: the lock is given back once the host has recorded its first
 * failure, so whatever the call ends in, its first observation is the one.
 */
async function underHeldLock(call) {
  const home = tmp();
  const s = new TurnsafeSession('s1', home);
  await s.addItems([user('before')]);
  const from = recorded().length;
  const holder = await holdLock(path.join(home, 'state.db'));
  let running;
  try {
    running = call(s).catch(() => null);
    await recordedAtLeast(from + 1);
  } finally {
    await holder.release();
  }
  await running;
  await s.close();
}

const INDUCERS = {
  // A directory where state.db goes: the flush's open fails.
  js_induced_directory_at_db_path: async () => {
    const home = tmp();
    fs.mkdirSync(path.join(home, 'state.db'));
    const s = new TurnsafeSession('s1', home, { thread: false });
    await rejected(s.addItems([user('kept')]));
    await s.close();
  },
  // state.db immutable (chattr +i) after a clean close, its WAL and shm gone.
  js_induced_immutable_db: async (t) => {
    if (!need(t, isRoot() && spawnSync('chattr', ['--version']).status !== null, 'root and chattr')) return false;
    const home = tmp();
    const first = new TurnsafeSession('s1', home, { thread: false });
    await first.addItems([user('first')]);
    await first.close();
    const db = path.join(home, 'state.db');
    fs.rmSync(`${db}-wal`, { force: true });
    fs.rmSync(`${db}-shm`, { force: true });
    const r = spawnSync('chattr', ['+i', db], { encoding: 'utf8' });
    if (!need(t, r.status === 0, `chattr +i works here (${r.stderr.trim()})`)) return false;
    try {
      const again = new TurnsafeSession('s1', home, { thread: false });
      await rejected(again.addItems([user('second')]));
      await again.close();
    } finally {
      spawnSync('chattr', ['-i', db]);
    }
    return true;
  },
  // Another process holds BEGIN IMMEDIATE: the flush's write fails.
  js_induced_busy_write: () => underHeldLock((s) => s.addItems([user('during')])),
  // Another process holds BEGIN IMMEDIATE: an edit cannot begin.
  js_induced_busy_edit: () => underHeldLock((s) => s.clearSession()),
  // Another writer's live turn lease fences a pop.
  js_induced_edit_lease_fenced: async () => {
    const home = tmp();
    const theirs = new TurnsafeSession('s1', home, { holder: 'theirs', thread: false });
    await theirs.addItems([user('a')]);
    const ours = new TurnsafeSession('s1', home, { holder: 'ours', thread: false });
    await rejected(ours.popItem());
    await ours.close();
    await theirs.close();
  },
  // A uid stored with other content: the batch's INSERT meets the UNIQUE index.
  js_induced_uid_conflict: async () => {
    const s = new TurnsafeSession('s1', tmp(), { thread: false });
    await s.store.call('append', { session: 's1', items: [user('kept')], uids: ['fixed'] });
    const { outcome } = await s.store.call('append', { session: 's1', items: [user('other')], uids: ['fixed'] });
    assert.equal(outcome.cause, 'uid_conflict');
    await s.close();
  },
  // The WAL and shm deleted under a live session: the guard sees it.
  js_induced_deleted_wal: async () => {
    const home = tmp();
    const s = new TurnsafeSession('s1', home, { thread: false });
    await s.addItems([user('one')]);
    fs.rmSync(path.join(home, 'state.db-wal'));
    fs.rmSync(path.join(home, 'state.db-shm'));
    await rejected(s.addItems([user('two')]));
    await s.close();
  },
};

const normalised = (o) => ({
  operation: o.operation ?? null,
  code: o.code ?? null,
  extended_code: o.extended_code ?? null,
  // The inode a guard's message names is the file's of that run.
  message: (o.message ?? '').replace(/\binode \d+/g, 'inode N'),
  errno: o.errno ?? null,
  evidence: [...(o.evidence ?? [])].sort(),
});

const vectors = fs.readdirSync(path.join(ROOT, 'tests', 'vectors')).filter((f) => f.endsWith('.json')).sort()
  .flatMap((f) => JSON.parse(fs.readFileSync(path.join(ROOT, 'tests', 'vectors', f), 'utf8')))
  .filter((v) => (v.induced ?? '').startsWith('JavaScript'));

test('every vector this host recorded has an inducer, and every inducer a vector', () => {
  assert.ok(vectors.length >= 7, `only ${vectors.length} vectors recorded from this host`);
  assert.deepEqual(vectors.map((v) => v.name).filter((n) => !(n in INDUCERS)), []);
  assert.deepEqual(Object.keys(INDUCERS).filter((n) => !vectors.some((v) => v.name === n)), []);
});

for (const [name, induce] of Object.entries(INDUCERS)) {
  test(`the host builds the recorded observation: ${name}`, async (t) => {
    const [vector] = vectors.filter((v) => v.name === name);
    assert.ok(vector, `${name} is not a vector recorded from this host`);
    const from = recorded().length;
    if ((await induce(t)) === false) return;
    const made = recorded().slice(from);
    assert.ok(made.length >= 1, 'the host recorded no observation: the failure was not induced');
    assert.deepEqual(normalised(made[0]), normalised(vector.observation));
  });
}
