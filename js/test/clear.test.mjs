// clearSession and the session's divert lines (docs/DIVERT.md, "Cleared"):
// the lines a clear settles are exactly the lines it read; a line that
// cannot be read is quarantined with its reason, a LangGraph line of a
// thread that shares the id stays pending, a line diverted after the
// clear read the file stays pending, and a file the clear cannot read
// fails it before anything is removed.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { TurnsafeSession } from '../src/index.js';
import { divert, flockExclusive } from '../src/divert.js';
import { JS, child, holdLock, tmp } from './helpers.mjs';

const LEDGER_FIELDS = ['at_ms', 'file', 'line', 'offset', 'reason', 'session', 'state', 'uid'];

const ledger = (home) => {
  const file = path.join(home, 'sessions', 'ledger.jsonl');
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : [];
};

const pendingUids = (home, session) => {
  const file = path.join(home, 'sessions', `${session}.jsonl`);
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l).uid);
};

const archived = (home) => {
  const db = new Database(path.join(home, 'state.db'), { readonly: true });
  try {
    return db.prepare("SELECT uid, seq, item FROM archive WHERE reason = 'clear' ORDER BY id").all();
  } finally {
    db.close();
  }
};

const line = (fields) => `${JSON.stringify({ v: 2, session: 's', batch: 'b1', cause: 'disk', at: '2025-01-01T00:00:00.000Z', ...fields })}\n`;

/** Wait (at most `ms`) until settling/ holds a file: the clear has taken and read the divert file. */
async function taken(home, ms) {
  const dir = path.join(home, 'sessions', 'settling');
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (fs.existsSync(dir) && fs.readdirSync(dir).length) return true;
    await new Promise((r) => setTimeout(r, 5));
  }
  return false;
}

test('each line read is settled for what it is: cleared, quarantined with its reason, or kept pending (LangGraph)', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s', home);
  await s.addItems([{ role: 'user', content: 'stored' }]);
  // The message's own bytes, a number JSON.parse would round included.
  const message = '{"role":"user","content":"diverted","n":1.0,"big":9007199254740993}';
  const graph = `${JSON.stringify({ v: 3, kind: 'checkpoint', session: 's', uid: 'checkpoint::c1', batch: 'b2', cause: 'disk',
    at: '2025-01-01T00:00:00.000Z', checkpoint: { thread_id: 's', checkpoint_ns: '', checkpoint_id: 'c1', parent_checkpoint_id: null,
      type: 'json', checkpoint: 'e30=', metadata: {} } })}\n`;
  const lines = [
    line({ uid: 'd1', seq: 5, message: {} }).replace('"message":{}', `"message":${message}`),
    '{"v":2,"session":"s","uid":"d2","mess\n',
    line({ uid: 'd3', seq: 6, message: { role: 'user', content: 'x' } }).replace('"session":"s"', '"session":"other"'),
    '[1]\n',
    '\n',
    line({ uid: 'd4', seq: 'seven', message: { role: 'user', content: 'y' } }),
    graph,
    // LangGraph lines that cannot be read: quarantined, as replay would.
    graph.replace('"checkpoint":"e30="', '"checkpoint":"not base64"'),
    graph.replace('"thread_id":"s"', '"thread_id":"another thread"'),
  ];
  const sessions = path.join(home, 'sessions');
  fs.mkdirSync(sessions, { mode: 0o700 });
  const bytes = Buffer.from(lines.join(''));
  fs.writeFileSync(path.join(sessions, 's.jsonl'), bytes, { mode: 0o600 });

  await s.clearSession();
  assert.deepEqual(await s.getItems(), []);

  const entries = ledger(home);
  for (const e of entries) assert.deepEqual(Object.keys(e).sort(), LEDGER_FIELDS);
  const offsets = lines.map((_, i) => Buffer.byteLength(lines.slice(0, i).join('')));
  assert.deepEqual(entries.map(({ line: n, offset, uid, state, reason }) => ({ n, offset, uid, state, reason })), [
    { n: 1, offset: offsets[0], uid: 'd1', state: 'cleared', reason: 'the session was cleared' },
    { n: 2, offset: offsets[1], uid: null, state: 'quarantined', reason: 'torn or invalid JSON' },
    { n: 3, offset: offsets[2], uid: 'd3', state: 'quarantined', reason: 'line belongs to another session' },
    { n: 4, offset: offsets[3], uid: null, state: 'quarantined', reason: 'not a JSON object' },
    { n: 6, offset: offsets[5], uid: 'd4', state: 'quarantined', reason: '`seq` is not an integer' },
    { n: 8, offset: offsets[7], uid: 'checkpoint::c1', state: 'quarantined', reason: '`checkpoint` is missing or cannot be read' },
    { n: 9, offset: offsets[8], uid: 'checkpoint::c1', state: 'quarantined', reason: "the record's thread is not the file's" },
  ]);
  const file = entries[0].file;
  assert.match(file, /^s@\d+-\d+\.jsonl$/);
  assert.ok(entries.every((e) => e.file === file && e.session === 's'));
  // The settled file is the file read, byte for byte.
  assert.deepEqual(fs.readFileSync(path.join(sessions, 'settled', file)), bytes);
  // The LangGraph line is pending again, as it was written.
  assert.equal(fs.readFileSync(path.join(sessions, 's.jsonl'), 'utf8'), graph);
  // The cleared line is archived with its message's bytes.
  const arch = archived(home);
  assert.deepEqual(arch.filter((r) => r.uid === 'd1'), [{ uid: 'd1', seq: 5, item: message }]);
  assert.equal(arch.length, 2, JSON.stringify(arch));
  await s.close();
});

test('a line diverted after the clear read the file stays pending', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s', home);
  await s.addItems([{ role: 'user', content: 'stored' }]);
  divert(home, 's', 'disk', [{ uid: 'd1', seq: 2, message: { role: 'user', content: 'before' } }]);
  // Another process holds the write lock until the test's word: the clear
  // waits in its edit, after its read, while a writer diverts one more line.
  const holder = await holdLock(path.join(home, 'state.db'));
  try {
    const clearing = s.clearSession();
    assert.ok(await taken(home, 30_000), 'the clear took the divert file before its edit');
    divert(home, 's', 'disk', [{ uid: 'd2', seq: 3, message: { role: 'user', content: 'after' } }]);
    await holder.release();
    await clearing;
  } finally {
    holder.kill();
  }
  assert.deepEqual(ledger(home).map((e) => [e.uid, e.state]), [['d1', 'cleared']]);
  assert.deepEqual(pendingUids(home, 's'), ['d2']);
  // The stored row and the line read are archived; the later line is not.
  const arch = archived(home);
  assert.equal(arch.length, 2);
  // The other archived row is the stored one, whose uid was minted.
  assert.deepEqual(arch.map((r) => r.uid).filter((u) => u === 'd1' || u === 'd2'), ['d1']);
  await s.close();
});

test('bytes a writer appends to the taken file after the read are written back pending, never settled', async () => {
  const home = tmp();
  const s = new TurnsafeSession('s', home);
  await s.addItems([{ role: 'user', content: 'stored' }]);
  divert(home, 's', 'disk', [{ uid: 'd1', seq: 2, message: { role: 'user', content: 'before' } }]);
  // A writer that opened the file before the clear took it (one that
  // does not look again after its lock), appending once the clear has read it.
  const late = fs.openSync(path.join(home, 'sessions', 's.jsonl'), fs.constants.O_WRONLY | fs.constants.O_APPEND);
  const holder = await holdLock(path.join(home, 'state.db'), 1500);
  try {
    const clearing = s.clearSession();
    assert.ok(await taken(home, 3000), 'the clear took the file');
    fs.writeSync(late, line({ uid: 'd2', seq: 3, message: { role: 'user', content: 'late' } }));
    fs.fsyncSync(late);
    await clearing;
  } finally {
    fs.closeSync(late);
    holder.kill();
  }
  assert.deepEqual(ledger(home).map((e) => [e.uid, e.state]), [['d1', 'cleared']]);
  assert.deepEqual(pendingUids(home, 's'), ['d2']);
  await s.close();
});

test('a divert that opened the file before a clear took it appends to the file now at the path', async () => {
  const home = tmp();
  divert(home, 's', 'disk', [{ uid: 'd1', seq: 1, message: { role: 'user', content: 'before' } }]);
  const file = path.join(home, 'sessions', 's.jsonl');
  // Held as a clear holds it while it reads and takes the file.
  const fd = fs.openSync(file, fs.constants.O_RDONLY);
  flockExclusive(fd);
  const divertJs = new URL('../src/divert.js', import.meta.url).href;
  const writer = spawn(process.execPath, ['--input-type=module', '-e', `
import { divert } from '${divertJs}';
divert(process.env.HOME_DIR, 's', 'disk', [{ uid: 'd2', seq: 2, message: { role: 'user', content: 'after' } }]);
`], { cwd: JS, env: { ...process.env, HOME_DIR: home }, stdio: ['ignore', 'inherit', 'inherit'] });
  try {
    // Once the writer holds the file open, it is waiting for the lock (or about to).
    const opened = () => {
      try {
        return fs.readdirSync(`/proc/${writer.pid}/fd`).some((n) => {
          try {
            return fs.readlinkSync(`/proc/${writer.pid}/fd/${n}`) === file;
          } catch {
            return false;
          }
        });
      } catch {
        return false;
      }
    };
    const until = Date.now() + 10_000;
    while (!opened() && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
    assert.ok(opened(), 'the writer opened the divert file');
    fs.mkdirSync(path.join(home, 'sessions', 'settling'), { mode: 0o700 });
    fs.renameSync(file, path.join(home, 'sessions', 'settling', 's@1-1.jsonl'));
  } finally {
    fs.closeSync(fd);
  }
  const [code] = await once(writer, 'exit');
  assert.equal(code, 0);
  assert.deepEqual(pendingUids(home, 's'), ['d2']);
  const takenUids = fs.readFileSync(path.join(home, 'sessions', 'settling', 's@1-1.jsonl'), 'utf8').split('\n').filter(Boolean)
    .map((l) => JSON.parse(l).uid);
  assert.deepEqual(takenUids, ['d1']);
});

test('a clear the policy refuses puts the file it took back, pending', async () => {
  const home = tmp();
  const theirs = new TurnsafeSession('s', home, { holder: 'theirs' });
  await theirs.addItems([{ role: 'user', content: 'theirs' }]);
  divert(home, 's', 'disk', [{ uid: 'd1', seq: 2, message: { role: 'user', content: 'pending' } }]);
  const file = path.join(home, 'sessions', 's.jsonl');
  const before = fs.readFileSync(file);
  const ours = new TurnsafeSession('s', home, { holder: 'ours' });
  await assert.rejects(ours.clearSession(), (e) => e.name === 'TurnsafeError' && e.cause === 'turn_lease');
  assert.deepEqual(fs.readFileSync(file), before);
  assert.deepEqual(fs.readdirSync(path.join(home, 'sessions', 'settling')), []);
  assert.deepEqual(ledger(home), []);
  assert.equal((await ours.getItems()).length, 1);
  await theirs.close();
  await ours.close();
});

test('a divert file the clear cannot read fails the clear, and nothing is removed', () => {
  const home = tmp();
  fs.mkdirSync(path.join(home, 'sessions'), { recursive: true, mode: 0o700 });
  const pending = line({ uid: 'd1', seq: 2, message: { role: 'user', content: 'pending' } });
  fs.writeFileSync(path.join(home, 'sessions', 's.jsonl'), pending, { mode: 0o600 });
  // Every descriptor taken (EMFILE) once the store is open: the clear's
  // open of the divert file is the first call to need one.
  const r = child(`
import fs from 'node:fs';
import { TurnsafeSession } from 'turnsafe-store';
const s = new TurnsafeSession('s', process.env.HOME_DIR, { thread: false });
await s.addItems([{ role: 'user', content: 'kept' }]);
const hog = [];
try { for (;;) hog.push(fs.openSync('/dev/null', 'r')); } catch {}
let result;
try { await s.clearSession(); result = 'cleared'; } catch (e) { result = e.name + ': ' + e.message; }
for (const fd of hog) fs.closeSync(fd);
process.stdout.write(JSON.stringify({ result, items: await s.getItems() }));
`, { env: { HOME_DIR: home }, prefix: 'ulimit -n 128' });
  assert.ok(r.json, `${r.status}: ${r.stdout} ${r.stderr}`);
  assert.match(r.json.result, /^TurnsafeError: clear of session s failed: its divert lines could not be settled: open .*EMFILE/);
  assert.deepEqual(r.json.items, [{ role: 'user', content: 'kept' }]);
  assert.equal(fs.readFileSync(path.join(home, 'sessions', 's.jsonl'), 'utf8'), pending);
  assert.deepEqual(ledger(home), []);
});
