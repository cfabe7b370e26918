// The store's worker thread: better-sqlite3 blocks, so every effect of a
// flush (the SQLite calls, the fsyncs, the waits of a retry plan) runs
// here, off the event loop of the agent. One Host per worker, requests
// answered one at a time in the order they came.
import { parentPort, workerData } from 'node:worker_threads';

import { flatten } from './errors.js';
import { makeOps } from './ops.js';

const ops = makeOps(workerData.home, workerData.options);

parentPort.on('message', ({ id, op, args }) => {
  let reply;
  try {
    const f = ops[op];
    if (!f) throw new Error(`unknown store operation ${op}`);
    reply = { id, ok: true, value: f(args ?? {}) };
  } catch (e) {
    reply = { id, ok: false, error: flatten(e) };
  }
  parentPort.postMessage(reply);
});
