// TurnsafeSession on a filesystem that forgets what was not fsynced
// (powerfs, driven through its `powerfs-ctl`; docs/POWERFS.md): three
// turns, with the power cut at every sync point of the flow in turn, in
// every cut mode. After each cut and a remount, every item whose addItems
// resolved while the power was still on is in state.db exactly once,
// counted with our own connection, and state.db passes integrity_check.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { test } from 'node:test';

import { Store, TurnsafeSession } from '../src/index.js';
import { ROOT, need, receiptHolds, tmp } from './helpers.mjs';

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

/** Three turns; the contents of those acknowledged with the power on. The store is left open, as it is when the power goes. */
async function flow(pfs, home) {
  const store = new Store(home);
  const session = new TurnsafeSession('user-42', home, { store });
  const acked = [];
  for (let b = 0; b < 3; b++) {
    try {
      await session.addItems(batch(`turn${b}`));
    } catch (e) {
      if (e.name !== 'TurnNotPersisted') throw e;
      continue;
    }
    if (await pfs.powered()) acked.push(...batch(`turn${b}`).map((m) => m.content));
  }
  return { acked, store };
}

/** Each stored item's content with its count, and integrity_check. */
function stored(home) {
  const file = path.join(home, 'state.db');
  if (!fs.existsSync(file)) return { counts: {}, integrity: 'ok' };
  // Read-write: the first open after a power cut recovers the WAL, as the next writer would.
  const db = new Database(file);
  try {
    const counts = {};
    if (db.prepare("SELECT 1 FROM sqlite_master WHERE name = 'messages'").get()) {
      for (const { c } of db.prepare("SELECT json_extract(item, '$.content') AS c FROM messages").all()) counts[c] = (counts[c] ?? 0) + 1;
    }
    return { counts, integrity: db.pragma('integrity_check', { simple: true }) };
  } finally {
    db.close();
  }
}

async function closeDead(store) {
  // Its descriptors died with the power; closing must not matter, nor hang.
  await Promise.race([store.close().catch(() => {}), new Promise((r) => setTimeout(r, 2000))]);
  await store.worker?.terminate();
}

async function cutAndCheck(pfs, n, mode) {
  await pfs.cmd('remount');
  const home = path.join(pfs.path, `home-${n}-${mode.replaceAll(' ', '-')}`);
  fs.mkdirSync(home, { mode: 0o700 });
  if (n) await pfs.cmd(`cut_at_sync ${n}`);
  const { acked, store } = await flow(pfs, home);
  await pfs.cmd(`cut ${mode}`);
  await closeDead(store);
  await pfs.cmd('remount');
  const { counts, integrity } = stored(home);
  const bad = acked.filter((c) => counts[c] !== 1).map((c) => `${c} acknowledged, stored ${counts[c] ?? 0} times`);
  if (integrity !== 'ok') bad.push(`integrity_check: ${integrity}`);
  return bad.map((b) => `cut ${mode} at sync ${n || 'end'}: ${b}`);
}

test('every acknowledged item survives a power cut at every sync point', { timeout: 600_000 }, async (t) => {
  const pfs = await PowerFs.mount(t);
  if (!pfs) return;
  try {
    await pfs.cmd('remount');
    const home = path.join(pfs.path, 'count');
    fs.mkdirSync(home, { mode: 0o700 });
    const { acked, store } = await flow(pfs, home);
    await store.close();
    assert.equal(acked.length, 6, JSON.stringify(acked));
    const count = Number(await pfs.cmd('sync_count'));
    // The first open, the schema, the WAL and three commits: each a sync.
    assert.ok(count >= 4, `the flow made only ${count} syncs`);
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
    try {
      await session.addItems(batch('first'));
    } catch (e) {
      if (e.name !== 'TurnNotPersisted') throw e;
      receipt = e.outcome.receipt;
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
    assert.ok(receiptHolds(receipt), 'the receipt\'s bytes survived the cut');
  } finally {
    await pfs.close();
  }
});
