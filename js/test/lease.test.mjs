// A writer that died does not fence its sessions: a turn lease ends on
// evidence that its holder is gone (the same boot and pid namespace, and
// its pid runs no process or another one), and stands without it. Driven
// through writer processes that are SIGKILLed for real, with the default
// 30 s lease: JavaScript writers (TurnsafeSession in a child node) and the
// native `turnsafe append`, each taking over from the other.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { afterEach, test } from 'node:test';
import { pathToFileURL } from 'node:url';

import Database from 'better-sqlite3';

import { TurnsafeSession } from '../src/index.js';
import { probeLocal, readProof } from '../src/lease.js';
import { JS, tmp, turnsafe, turnsafeBin } from './helpers.mjs';

// A JavaScript writer: one batch of two messages per stdin line (the
// line is the batch's tag), one JSON line out per batch.
const JS_WRITER = `
import readline from 'node:readline';
import { TurnsafeSession } from ${JSON.stringify(pathToFileURL(path.join(JS, 'src', 'index.js')).href)};
const s = new TurnsafeSession('s1', process.env.WRITER_HOME);
for await (const tag of readline.createInterface({ input: process.stdin })) {
  try {
    await s.addItems([{ role: 'user', content: tag + '-1' }, { role: 'assistant', content: tag + '-2' }]);
    process.stdout.write(JSON.stringify({ persisted: true }) + '\\n');
  } catch (e) {
    process.stdout.write(JSON.stringify({ persisted: false, outcome: e.outcome ?? null, message: e.message }) + '\\n');
  }
}
await s.close();
`;

// A file, not `-e`: the store's worker thread would inherit `--input-type`.
const JS_WRITER_FILE = path.join(tmp('turnsafe-js-writer-'), 'writer.mjs');
fs.writeFileSync(JS_WRITER_FILE, JS_WRITER);

// Every writer and session a test started, ended after it whatever its
// result: a failed assertion leaves no process that keeps the file running.
const started = new Set();
afterEach(async () => {
  for (const w of started) {
    if (w instanceof Writer) w.child.kill('SIGKILL');
    else await w.close().catch(() => {});
  }
  started.clear();
});

const session = (home) => {
  const s = new TurnsafeSession('s1', home);
  started.add(s);
  return s;
};

/** A writer process streaming into session s1 of `home`, answered batch by batch. */
class Writer {
  constructor(kind, home) {
    this.kind = kind;
    this.child = kind === 'js'
      ? spawn(process.execPath, [JS_WRITER_FILE], { cwd: JS,
        env: { ...process.env, WRITER_HOME: home }, stdio: ['pipe', 'pipe', 'pipe'] })
      : spawn(turnsafeBin(), ['append', '--session', 's1', '--home', home], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.closed = once(this.child, 'close');
    started.add(this);
    this.lines = readline.createInterface({ input: this.child.stdout })[Symbol.asyncIterator]();
    this.stderr = '';
    this.child.stderr.setEncoding('utf8');
    this.child.stderr.on('data', (d) => {
      this.stderr += d;
    });
  }

  get pid() {
    return this.child.pid;
  }

  /** Send one batch and read its answer: `{persisted, outcome}`. */
  async send(tag) {
    const line = this.kind === 'js' ? tag
      : JSON.stringify([{ uid: `${tag}-1`, role: 'user', content: `${tag}-1` },
        { uid: `${tag}-2`, role: 'assistant', content: `${tag}-2` }]);
    this.child.stdin.write(`${line}\n`);
    const { value, done } = await this.lines.next();
    if (done) throw new Error(`the ${this.kind} writer ended without an answer: ${this.stderr}`);
    const v = JSON.parse(value);
    return this.kind === 'js' ? v : { persisted: v.persisted, outcome: v };
  }

  /** SIGKILL, and reap: the process is gone, as after an OOM kill. */
  async kill9() {
    this.child.kill('SIGKILL');
    await this.closed;
  }

  /** End of input: the writer releases its lease and exits. */
  async finish() {
    this.child.stdin.end();
    await this.closed;
    assert.equal(this.child.exitCode, 0, this.stderr);
  }
}

const open = (home) => {
  const db = new Database(path.join(home, 'state.db'));
  db.pragma('busy_timeout = 5000');
  return db;
};

function lease(home) {
  const db = open(home);
  try {
    const row = db.prepare("SELECT lease_token, lease_holder, lease_expires_ms FROM sessions WHERE id = 's1'").get();
    return { ...row, proof: JSON.parse(row.lease_holder) };
  } finally {
    db.close();
  }
}

/** Rewrite the recorded holder of s1's lease (as another machine or process would have written it). */
function setHolder(home, proof) {
  const db = open(home);
  try {
    assert.equal(db.prepare("UPDATE sessions SET lease_holder = ? WHERE id = 's1'").run(JSON.stringify(proof)).changes, 1);
  } finally {
    db.close();
  }
}

function contents(home) {
  const db = open(home);
  try {
    return db.prepare("SELECT content FROM messages WHERE session_id = 's1' ORDER BY seq").all().map((r) => r.content);
  } finally {
    db.close();
  }
}

/** Field 22 of /proc/<pid>/stat, read here on its own: the start time a proof must record. */
function startOf(pid) {
  const text = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(text.slice(text.lastIndexOf(')') + 2).split(' ')[19]);
}

const noDivert = (home) => assert.ok(!fs.existsSync(path.join(home, 'sessions', 's1.jsonl')), 'a takeover diverts nothing');

/** A batch handed back by the lease of a holder the copy names at `place`. */
function assertFencedBy(v, place) {
  assert.equal(v.persisted, false, JSON.stringify(v));
  const o = v.outcome;
  assert.equal(o.cause, 'turn_lease', JSON.stringify(o));
  assert.equal(o.diverted, 0);
  assert.equal(o.handed_back, 2);
  assert.equal(o.copy.code, 'turn_lease.handed_back');
  assert.equal(o.copy.details.lease_place, place, JSON.stringify(o.copy));
  assert.match(o.copy.body, /is held by .* UTC/);
  assert.ok(!JSON.stringify(o).includes('finish'), JSON.stringify(o));
}

/** `lease_expires` as the copy writes it: the lease's expiry to the second, UTC. */
const expiresText = (ms) => new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');

test('a JavaScript writer SIGKILLed mid-stream and restarted at once commits its next batch; the takeover is logged with the old holder', async () => {
  const home = tmp();
  const first = new Writer('js', home);
  assert.equal((await first.send('a1')).persisted, true);
  const held = lease(home);
  // The proof the native host writes, of this very process.
  assert.deepEqual(Object.keys(held.proof), ['name', 'boot', 'pidns', 'pid', 'start']);
  assert.equal(held.proof.name, `pid-${first.pid}`);
  assert.equal(held.proof.pid, first.pid);
  assert.equal(held.proof.start, startOf(first.pid));
  assert.equal(held.proof.boot, fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim());
  assert.equal(held.proof.pidns, fs.readlinkSync('/proc/self/ns/pid'));
  const dead = first.pid;
  await first.kill9();
  // The default 30 s lease is still running.
  assert.ok(held.lease_expires_ms - Date.now() > 20_000, `${held.lease_expires_ms}`);

  const second = new Writer('js', home);
  const v = await second.send('b1');
  assert.equal(v.persisted, true, `the dead writer's lease fenced its successor: ${JSON.stringify(v)}`);
  assert.equal(lease(home).proof.pid, second.pid);
  assert.equal((await second.send('b2')).persisted, true);
  await second.finish();
  assert.deepEqual(contents(home), ['a1-1', 'a1-2', 'b1-1', 'b1-2', 'b2-1', 'b2-2']);
  noDivert(home);
  assert.match(second.stderr, /took over the turn lease of session s1 from a holder that is gone: holder_exited/);
  assert.ok(second.stderr.includes(`"old_holder":"pid-${dead}","old_pid":${dead}`), second.stderr);
});

test('a live holder in another process still fences, and the copy names its pid on this machine and the lease\'s end', async () => {
  const home = tmp();
  const holder = new Writer('js', home);
  assert.equal((await holder.send('a1')).persisted, true);
  const { lease_expires_ms: expires } = lease(home);
  const ours = session(home);
  const e = await ours.addItems([{ role: 'user', content: 'b1-1' }, { role: 'assistant', content: 'b1-2' }])
    .then(() => null, (err) => err);
  assert.ok(e, 'a live holder did not fence');
  assert.equal(e.name, 'TurnNotPersisted');
  assertFencedBy({ persisted: false, outcome: e.outcome }, 'this_machine');
  assert.equal(e.outcome.copy.details.lease_pid, String(holder.pid));
  assert.equal(e.outcome.copy.details.lease_holder, `pid-${holder.pid}`);
  assert.equal(e.outcome.copy.details.lease_expires, expiresText(expires));
  assert.ok(e.outcome.copy.body.includes(`pid ${holder.pid} on this machine`), e.outcome.copy.body);
  assert.ok(e.message.includes(`pid ${holder.pid} on this machine`), e.message);
  // An edit is fenced as well, and takes nothing; its copy is the policy's
  // edit copy, word for word what the native command prints for the same edit.
  const popped = await ours.popItem().then(() => null, (err) => err);
  assert.ok(popped && popped.name === 'TurnsafeError' && popped.cause === 'turn_lease' && popped.edit === 'pop', String(popped));
  assert.equal(popped.copy.code, 'edit.turn_lease');
  const native = turnsafe(['pop', '--home', home, '--session', 's1', '--json']);
  assert.equal(native.status, 5, native.stderr);
  const nativeCopy = native.lines.find((l) => l.type === 'error').data.copy;
  assert.deepEqual(popped.copy, nativeCopy);
  // Once the holder ends its input it gives the lease back.
  await holder.finish();
  await ours.addItems([{ role: 'user', content: 'b2-1' }, { role: 'assistant', content: 'b2-2' }]);
  await ours.close();
  assert.deepEqual(contents(home), ['a1-1', 'a1-2', 'b2-1', 'b2-2']);
});

test('an edit is not fenced by a dead holder, and takes no lease', async () => {
  const home = tmp();
  const first = new Writer('js', home);
  assert.equal((await first.send('a1')).persisted, true);
  await first.kill9();
  const token = lease(home).lease_token;
  const ours = session(home);
  assert.deepEqual(await ours.popItem(), { role: 'assistant', content: 'a1-2' });
  assert.equal(lease(home).lease_token, token, 'an edit took the lease');
  await ours.close();
  assert.deepEqual(contents(home), ['a1-1']);
});

test("a dead holder whose boot id is another machine's still fences", async () => {
  const home = tmp();
  const first = new Writer('js', home);
  assert.equal((await first.send('a1')).persisted, true);
  await first.kill9();
  // The same record, but from another boot: its pid means nothing here.
  setHolder(home, { ...lease(home).proof, boot: '00000000-0000-4000-8000-000000000000' });
  const second = new Writer('js', home);
  const v = await second.send('b1');
  assertFencedBy(v, 'other_machine');
  assert.ok(v.outcome.copy.body.includes(`pid ${first.pid} on another machine`), v.outcome.copy.body);
  await second.finish();
  assert.deepEqual(contents(home), ['a1-1', 'a1-2']);
});

test("an older writer's lease with nothing to check still fences", async () => {
  const home = tmp();
  const first = new Writer('js', home);
  assert.equal((await first.send('a1')).persisted, true);
  await first.kill9();
  const db = open(home);
  db.prepare("UPDATE sessions SET lease_holder = 'pid-1234' WHERE id = 's1'").run();
  db.close();
  const second = new Writer('js', home);
  const v = await second.send('b1');
  assertFencedBy(v, 'unknown');
  assert.equal(v.outcome.copy.details.lease_holder, 'pid-1234');
  await second.finish();
});

test('a lease naming a pid now used by an unrelated process with another start time is taken over', async (t) => {
  const home = tmp();
  const first = new Writer('js', home);
  assert.equal((await first.send('a1')).persisted, true);
  await first.kill9();
  // An unrelated live process, whose start time is not the one recorded.
  const unrelated = spawn('sleep', ['600'], { stdio: 'ignore' });
  t.after(() => unrelated.kill('SIGKILL'));
  await once(unrelated, 'spawn');
  const proof = lease(home).proof;
  assert.notEqual(startOf(unrelated.pid), proof.start);
  setHolder(home, { ...proof, pid: unrelated.pid });
  const second = new Writer('js', home);
  const v = await second.send('b1');
  assert.equal(unrelated.exitCode, null, 'the unrelated process was still running');
  assert.equal(v.persisted, true, JSON.stringify(v));
  await second.finish();
  assert.deepEqual(contents(home), ['a1-1', 'a1-2', 'b1-1', 'b1-2']);
  assert.match(second.stderr, /holder that is gone: pid_reused/);
});

for (const [dies, takes] of [['native', 'js'], ['js', 'native']]) {
  test(`interop: a ${dies} writer SIGKILLed mid-stream, a ${takes} writer takes its lease over at once`, async () => {
    const home = tmp();
    const first = new Writer(dies, home);
    assert.equal((await first.send('a1')).persisted, true);
    const held = lease(home);
    assert.deepEqual(Object.keys(held.proof), ['name', 'boot', 'pidns', 'pid', 'start']);
    assert.equal(held.proof.pid, first.pid);
    assert.equal(held.proof.start, startOf(first.pid));
    await first.kill9();
    assert.ok(held.lease_expires_ms - Date.now() > 20_000, `${held.lease_expires_ms}`);

    const second = new Writer(takes, home);
    const v = await second.send('b1');
    assert.equal(v.persisted, true, `the dead ${dies} writer's lease fenced: ${JSON.stringify(v)}`);
    const now = lease(home);
    assert.equal(now.proof.pid, second.pid);
    // Both hosts write the proof in the same bytes: the same machine, the same form.
    assert.equal(now.lease_holder, JSON.stringify({ name: `pid-${second.pid}`, boot: held.proof.boot,
      pidns: held.proof.pidns, pid: second.pid, start: startOf(second.pid) }));
    await second.finish();
    assert.deepEqual(contents(home), ['a1-1', 'a1-2', 'b1-1', 'b1-2']);
    noDivert(home);
  });
}

test("a holder's process is read past a command name with spaces and parentheses", async (t) => {
  // `sleep` under a name that reads like more stat fields: only the last
  // `)` ends the name, so its state is not taken for the name's `Z`.
  const dir = tmp();
  const bin = path.join(dir, 'x) Z 1 (y');
  const which = ['/bin/sleep', '/usr/bin/sleep'].find((p) => fs.existsSync(p));
  assert.ok(which, 'no sleep binary');
  fs.copyFileSync(which, bin);
  fs.chmodSync(bin, 0o755);
  const child = spawn(bin, ['600'], { stdio: 'ignore' });
  t.after(() => child.kill('SIGKILL'));
  await once(child, 'spawn');
  // Exec has happened once the kernel names the process after the file.
  while (!fs.readFileSync(`/proc/${child.pid}/stat`, 'utf8').includes('(x) Z 1 (y)')) await new Promise(setImmediate);
  const here = { name: 'w', boot: fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim(),
    pidns: fs.readlinkSync('/proc/self/ns/pid'), pid: child.pid };
  const start = startOf(child.pid);
  assert.equal(probeLocal(readProof(JSON.stringify({ ...here, start }))), 'running');
  assert.equal(probeLocal(readProof(JSON.stringify({ ...here, start: start + 1 }))), 'pid_reused');
  // An older writer's bare name, or text that is no proof, has nothing to check.
  assert.equal(probeLocal(readProof('pid-42')), 'unrecorded');
  assert.equal(readProof('{not json').name, '{not json');
  assert.equal(probeLocal(readProof(JSON.stringify({ ...here, pid: -1 }))), 'unrecorded');
});
