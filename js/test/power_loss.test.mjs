// TurnsafeSession on a filesystem that forgets what was not fsynced
// (powerfs, driven through its `powerfs-ctl`; docs/POWERFS.md): three
// turns committed into one home and two diverted (a folder stands where
// the other home's state.db should be), with the power cut at every sync
// point of the flow in turn, in every cut mode. After each cut and a
// remount, with our own connection, JSON parsing and sha256 (never the
// package's readers): every item whose addItems resolved while the power
// was still on is in state.db exactly once with the bytes sent (its
// `item`, in canonical form), every receipt given while the power was on
// holds its range (its sha256, its count), each line the item sent under
// the outcome's uid, and state.db passes integrity_check. An outcome names
// one uid per item sent.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { test } from 'node:test';

import { Store, TurnsafeSession } from '../src/index.js';
import { ROOT, need, tmp } from './helpers.mjs';

const CTL = process.env.POWERFS_CTL ?? path.join(process.env.CARGO_TARGET_DIR ?? path.join(ROOT, 'target'), 'debug', 'powerfs-ctl');

/** One mount, served by powerfs-ctl in a child process. */
class PowerFs {
  static async mount(t) {
    if (!fs.existsSync(CTL)) throw new Error(`${CTL} is not built (js/run-tests builds it)`);
    const dir = tmp('turnsafe-js-powerfs-');
    const p = new PowerFs();
    p.path = path.join(dir, 'mnt');
    p.proc = spawn(CTL, [path.join(dir, 'backing'), p.path], { stdio: ['pipe', 'pipe', 'inherit'] });
    p.lines = readline.createInterface({ input: p.proc.stdout })[Symbol.asyncIterator]();
    const first = (await p.lines.next()).value?.trim() ?? '';
    if (first.startsWith('unavailable')) {
      need(t, false, `powerfs: ${first}`);
      return null;
    }
    // Anything but `ready` is a broken harness, a failure everywhere.
    assert.equal(first, 'ready', `powerfs-ctl did not mount: ${first}`);
    return p;
  }

  async cmd(line) {
    this.proc.stdin.write(`${line}\n`);
    const answer = ((await this.lines.next()).value ?? '').trim();
    assert.ok(answer.startsWith('ok'), `powerfs-ctl ${line}: ${answer}`);
    return answer.slice(2).trim();
  }

  /** No sync point frozen yet: a claim made now would be made in real life. */
  async powered() {
    return (await this.cmd('frozen')) === 'none';
  }

  async close() {
    if (this.proc.exitCode === null) {
      this.proc.stdin.write('quit\n');
      await new Promise((r) => this.proc.once('exit', r));
    }
  }
}

const batch = (tag) => [0, 1].map((i) => ({ role: 'user', content: `${tag}-${i}` }));

/** The test's own canonical text of its plain ASCII records: sorted keys, no whitespace. */
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

/** The home beside `home` whose state.db is a folder: every batch is diverted. */
const divertHome = (home) => `${home}-diverted`;

/** A home, and its diverting twin, made before the flow's mount so they are durable. */
function makeHomes(home) {
  fs.mkdirSync(home, { mode: 0o700 });
  fs.mkdirSync(path.join(divertHome(home), 'state.db'), { recursive: true, mode: 0o700 });
}

/**
 * Three turns committed, two diverted; what was acknowledged with the power
 * on: committed items, and diverted batches as {receipt, uids, sent}. The
 * stores are left open, as they are when the power goes.
 */
async function flow(pfs, home) {
  const store = new Store(home);
  const session = new TurnsafeSession('user-42', home, { store });
  const other = new Store(divertHome(home));
  const diverting = new TurnsafeSession('user-42', divertHome(home), { store: other });
  const acked = { committed: [], diverted: [], problems: [] };
  const uids = (outcome, sent) => {
    if (outcome.uids?.length !== sent.length) acked.problems.push(`an outcome names the uids ${JSON.stringify(outcome.uids)}; the test sent ${sent.length}`);
  };
  for (let b = 0; b < 3; b++) {
    try {
      await session.addItems(batch(`turn${b}`));
    } catch (e) {
      if (e.name !== 'TurnNotPersisted') throw e;
      uids(e.outcome, batch(`turn${b}`));
      continue;
    }
    if (await pfs.powered()) acked.committed.push(...batch(`turn${b}`));
  }
  for (let b = 0; b < 2; b++) {
    const sent = batch(`diverted${b}`);
    try {
      await diverting.addItems(sent);
      acked.problems.push(`${JSON.stringify(sent)} was committed into a home whose state.db is a folder`);
    } catch (e) {
      if (e.name !== 'TurnNotPersisted') throw e;
      uids(e.outcome, sent);
      if (e.outcome.receipt && (await pfs.powered())) acked.diverted.push({ receipt: e.outcome.receipt, uids: e.outcome.uids, sent });
    }
  }
  return { acked, stores: [store, other] };
}

/** Every stored item's text, and integrity_check. */
function stored(home) {
  const file = path.join(home, 'state.db');
  if (!fs.existsSync(file)) return { items: [], integrity: 'ok' };
  // Read-write: the first open after a power cut recovers the WAL, as the next writer would.
  const db = new Database(file);
  try {
    let items = [];
    if (db.prepare("SELECT 1 FROM sqlite_master WHERE name = 'messages'").get()) {
      items = db.prepare('SELECT item FROM messages').all().map((r) => r.item);
    }
    return { items, integrity: db.pragma('integrity_check', { simple: true }) };
  } finally {
    db.close();
  }
}

/** Each committed item stored exactly once with the bytes sent. */
function committedProblems(home, committed) {
  const { items, integrity } = stored(home);
  const texts = items.map((i) => canonical(JSON.parse(i)));
  const bad = committed
    .map((m) => [canonical(m), texts.filter((t) => t === canonical(m)).length])
    .filter(([, n]) => n !== 1)
    .map(([c, n]) => `${c} acknowledged, stored ${n} times with its bytes`);
  if (integrity !== 'ok') bad.push(`integrity_check: ${integrity}`);
  return bad;
}

/** The receipt's range, read and hashed here: its sha256, whole lines, `count` of them, each the item sent under the outcome's uid. */
function receiptProblems({ receipt, uids, sent }, session = 'user-42') {
  const where = `receipt ${receipt.path} [${receipt.offset}, +${receipt.length})`;
  let data;
  try {
    data = fs.readFileSync(receipt.path);
  } catch (e) {
    return [`${where}: ${e.message}`];
  }
  const start = receipt.offset;
  const end = start + receipt.length;
  if (data.length < end) return [`${where}: the file is ${data.length} bytes`];
  const range = data.subarray(start, end);
  const digest = createHash('sha256').update(range).digest('hex');
  if (digest !== receipt.sha256) return [`${where}: the bytes hash to ${digest}, the receipt says ${receipt.sha256}`];
  if ((start > 0 && data[start - 1] !== 0x0a) || range[range.length - 1] !== 0x0a) return [`${where}: not whole lines`];
  const lines = range.subarray(0, range.length - 1).toString('utf8').split('\n');
  if (lines.length !== receipt.count || lines.length !== sent.length || uids.length !== sent.length) {
    return [`${where}: ${lines.length} lines, the receipt says ${receipt.count}, ${sent.length} sent`];
  }
  const bad = [];
  lines.forEach((raw, i) => {
    const line = JSON.parse(raw);
    if (line.uid !== uids[i] || line.session !== session) bad.push(`${where}: line ${i} is ${line.session}/${line.uid}, sent ${session}/${uids[i]}`);
    if (canonical(line.message) !== canonical(sent[i])) bad.push(`${where}: line ${i} holds ${canonical(line.message)}, sent ${canonical(sent[i])}`);
  });
  return bad;
}

async function closeDead(store) {
  // Its descriptors died with the power; closing must not matter, nor hang.
  await Promise.race([store.close().catch(() => {}), new Promise((r) => setTimeout(r, 2000))]);
  await store.worker?.terminate();
}

async function cutAndCheck(pfs, n, mode) {
  const home = path.join(pfs.path, `home-${n}-${mode.replaceAll(' ', '-')}`);
  makeHomes(home);
  await pfs.cmd('remount');
  if (n) await pfs.cmd(`cut_at_sync ${n}`);
  const { acked, stores } = await flow(pfs, home);
  await pfs.cmd(`cut ${mode}`);
  for (const store of stores) await closeDead(store);
  await pfs.cmd('remount');
  const bad = [...acked.problems, ...committedProblems(home, acked.committed), ...acked.diverted.flatMap((d) => receiptProblems(d))];
  return bad.map((b) => `cut ${mode} at sync ${n || 'end'}: ${b}`);
}

test('every acknowledged item survives a power cut at every sync point', { timeout: 600_000 }, async (t) => {
  const pfs = await PowerFs.mount(t);
  if (!pfs) return;
  try {
    const home = path.join(pfs.path, 'count');
    makeHomes(home);
    await pfs.cmd('remount');
    const { acked, stores } = await flow(pfs, home);
    for (const store of stores) await store.close();
    assert.deepEqual(acked.problems, []);
    assert.equal(acked.committed.length, 6, JSON.stringify(acked));
    assert.equal(acked.diverted.length, 2, JSON.stringify(acked));
    const count = Number(await pfs.cmd('sync_count'));
    // The first open, the schema, the WAL, three commits and two diverts: each a sync.
    assert.ok(count >= 6, `the flow made only ${count} syncs`);
    let failures = await cutAndCheck(pfs, 0, 'drop');
    for (let n = 1; n <= count; n++) {
      for (const mode of ['drop', `torn ${n}`, `reorder ${n}`]) failures = failures.concat(await cutAndCheck(pfs, n, mode));
    }
    assert.deepEqual(failures, []);
  } finally {
    await pfs.close();
  }
});

test('a new home two levels down keeps every level and its first receipt across a power cut', { timeout: 120_000 }, async (t) => {
  const pfs = await PowerFs.mount(t);
  if (!pfs) return;
  try {
    await pfs.cmd('remount');
    // <mount>/a/b/home: three folders the session makes.
    const home = path.join(pfs.path, 'a', 'b', 'home');
    const session = new TurnsafeSession('user-42', home);
    // A folder where state.db should be: the open fails and the batch is diverted.
    fs.mkdirSync(path.join(home, 'state.db'));
    let receipt = null;
    let uids = null;
    try {
      await session.addItems(batch('first'));
    } catch (e) {
      if (e.name !== 'TurnNotPersisted') throw e;
      ({ receipt, uids } = e.outcome);
    }
    assert.ok(receipt, 'the first batch was diverted with a receipt');
    assert.equal(receipt.path, path.join(home, 'sessions', 'user-42.jsonl'));
    assert.ok(await pfs.powered(), 'the receipt was given with the power on');
    await pfs.cmd('cut drop');
    await closeDead(session.store);
    await pfs.cmd('remount');
    for (const dir of [path.join(pfs.path, 'a'), path.join(pfs.path, 'a', 'b'), home, path.join(home, 'sessions')]) {
      assert.ok(fs.existsSync(dir), `${dir} survived the cut`);
    }
    assert.ok(fs.existsSync(receipt.path), 'the receipt\'s file survived the cut');
    assert.deepEqual(receiptProblems({ receipt, uids, sent: batch('first') }), [], 'the receipt\'s bytes survived the cut');
  } finally {
    await pfs.close();
  }
});
