// The store's worker thread: better-sqlite3 blocks, so every effect of a
// flush (the SQLite calls, the fsyncs, the waits of a retry plan) runs
// here, off the event loop of the agent. One Host per worker; requests are
// answered in the order they came. Batches that wait together (appends
// that arrived while the worker was busy) are committed together: one
// transaction, one sync (Host.appendGroup), at most 64 at a time and never
// two of one session in one group.
//
// The crossing, both ways, is batched: the store posts every request made
// in one turn of its event loop as one message (an array), and each drain
// answers every request it ran in one message. An append's answer crosses
// as the outcome's text alone (the component's own bytes), which the store
// parses: a string clones for a fraction of the object's cost.
import fs from 'node:fs';
import { parentPort, receiveMessageOnPort, workerData } from 'node:worker_threads';

import { flatten } from './errors.js';
import { batchOf, makeOps } from './ops.js';

const ops = makeOps(workerData.home, workerData.options);

// The test suite's holds (test/worker_hooks.mjs: points where a test stops
// this thread until it says go). Loaded only with TURNSAFE_JS_TEST_HOOKS set
// and only from a checkout: the package's files carry no test/, so in a
// release the variable changes nothing.
const HOOKS = new URL('../test/worker_hooks.mjs', import.meta.url);
if (process.env.TURNSAFE_JS_TEST_HOOKS === '1' && fs.existsSync(HOOKS)) {
  (await import(HOOKS.href)).install(ops);
}
const GROUP_MAX = 64;
const queue = [];
let scheduled = false;
// The answers of the request (or the group) that runs, posted together
// as soon as it is done.
let answers = [];

function post() {
  const out = answers;
  answers = [];
  if (out.length > 0) parentPort.postMessage(out);
}

function answer(id, f) {
  try {
    answers.push({ id, ok: true, value: f() });
  } catch (e) {
    answers.push({ id, ok: false, error: flatten(e) });
  }
}

// After it answers, the worker looks for the next request for up to
// `spinMs` (0.25 ms unless the store was opened with another) before its
// thread sleeps. A thread asleep in the kernel costs its waker a system
// call and the wait for it to be scheduled again, tens of microseconds on a
// virtual machine; a session in a closed loop sends its next batch in less
// than that. Bounded: an idle store spends at most this much CPU per
// answer, and only this thread, never the event loop, polls.
const SPIN_MS = Math.max(0, Number(workerData.options?.spinMs ?? 0.25));

function drain() {
  scheduled = false;
  for (;;) {
    while (queue.length > 0) {
      run(queue.shift());
      post();
    }
    if (!(SPIN_MS > 0)) return;
    const until = performance.now() + SPIN_MS;
    let next;
    while (!(next = receiveMessageOnPort(parentPort)) && performance.now() < until);
    if (!next) return;
    for (const r of next.message) queue.push(r);
  }
}

/** Run `first` (with the appends queued behind it that form its group). */
function run(first) {
  if (first.op !== 'append') {
    answer(first.id, () => {
      const f = ops[first.op];
      if (!f) throw new Error(`unknown store operation ${first.op}`);
      return f(first.args ?? {});
    });
    return;
  }
  const group = [first];
  const sessions = new Set([first.args.session]);
  while (group.length < GROUP_MAX && queue[0]?.op === 'append' && !sessions.has(queue[0].args.session)) {
    const next = queue.shift();
    sessions.add(next.args.session);
    group.push(next);
  }
  // A request whose items do not read is answered alone.
  const batches = [];
  for (const r of group.splice(0)) {
    try {
      batches.push(batchOf(r.args));
      group.push(r);
    } catch (e) {
      answers.push({ id: r.id, ok: false, error: flatten(e) });
    }
  }
  if (group.length === 0) return;
  let results;
  try {
    results = ops.host.appendGroup(batches);
  } catch (e) {
    // Only a fault of the host itself gets here; no batch is answered twice.
    for (const r of group) answers.push({ id: r.id, ok: false, error: flatten(e) });
    return;
  }
  group.forEach((r, i) => {
    const res = results[i];
    if (res.error) answers.push({ id: r.id, ok: false, error: flatten(res.error) });
    else answers.push({ id: r.id, ok: true, text: res.text });
  });
}

parentPort.on('message', (requests) => {
  for (const r of requests) queue.push(r);
  if (!scheduled) {
    scheduled = true;
    // Every message that has arrived is queued before the drain runs.
    setImmediate(drain);
  }
});
