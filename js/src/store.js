// A store: one Host on a home, in a worker thread (the default) or in the
// calling thread (`thread: false`). Sessions on one home share one store
// per process, as they share one connection and one lease holder in the
// native host and the Python package.
import fs from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';

import { createDirAll } from './durable.js';
import { revive } from './errors.js';
import { requireNoCkptExtension } from './extension.js';
import { makeOps } from './ops.js';

const stores = new Map();

export class Store {
  /** The shared store for `home` and these options. */
  static for(home, options = {}) {
    // Refused loudly, before the home is made, where the guard's extension cannot load.
    requireNoCkptExtension();
    const abs = path.resolve(home);
    // Each missing level made durable in its parent (the home's own parent
    // is fsynced again at the first open).
    createDirAll(abs, 0o700);
    const key = JSON.stringify([fs.realpathSync(abs), options.thread !== false, options.holder ?? null,
      options.leaseTtlMs ?? null, options.synchronous ?? null, options.typedFlush ?? null, options.spinMs ?? null]);
    let s = stores.get(key);
    if (!s || s.closed) {
      s = new Store(abs, options);
      s.key = key;
      stores.set(key, s);
    }
    s.users += 1;
    return s;
  }

  constructor(home, options = {}) {
    requireNoCkptExtension();
    this.home = home;
    this.closed = false;
    this.users = 0;
    const hostOptions = { holder: options.holder, leaseTtlMs: options.leaseTtlMs, synchronous: options.synchronous,
      busyTimeoutMs: options.busyTimeoutMs, typedFlush: options.typedFlush, spinMs: options.spinMs };
    if (options.thread === false) {
      this.ops = makeOps(home, hostOptions);
      this.worker = null;
    } else {
      this.worker = new Worker(new URL('./worker.js', import.meta.url), { workerData: { home, options: hostOptions } });
      this.pending = new Map();
      this.nextId = 1;
      // Requests made in this turn of the event loop, posted as one message.
      this.outbox = [];
      this.worker.on('message', (answers) => {
        for (const a of answers) this.settle(a);
      });
      this.worker.on('error', (e) => this.failAll(e));
      this.worker.on('exit', (code) => this.failAll(new Error(`the store's worker exited (${code})`)));
      this.worker.unref();
    }
  }

  settle({ id, ok, value, text, error }) {
    const p = this.pending.get(id);
    if (!p) return;
    this.pending.delete(id);
    if (this.pending.size === 0) this.worker.unref();
    if (!ok) p.reject(revive(error));
    // An append's answer: the outcome's text, the component's own bytes.
    else if (text !== undefined) p.resolve({ outcome: JSON.parse(text), text });
    else p.resolve(value);
  }

  failAll(e) {
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
    this.closed = true;
  }

  /** Run `op` on the Host; resolves with its value. */
  call(op, args) {
    if (this.closed) return Promise.reject(new Error('the store is closed'));
    if (!this.worker) {
      try {
        return Promise.resolve(this.ops[op](args ?? {}));
      } catch (e) {
        return Promise.reject(e);
      }
    }
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      if (this.pending.size === 0) this.worker.ref();
      this.pending.set(id, { resolve, reject });
      if (this.outbox.length === 0) queueMicrotask(() => this.post());
      this.outbox.push({ id, op, args });
    });
  }

  /** Post the requests made since the last post, in the order they were made. */
  post() {
    const out = this.outbox;
    this.outbox = [];
    if (out.length > 0) this.worker.postMessage(out);
  }

  /**
   * Run `op` on the Host in the calling thread and return its value (or
   * throw): the synchronous path, for a store opened with `thread: false`.
   * Every wait of a retry plan blocks the calling thread.
   */
  callSync(op, args) {
    if (this.worker) {
      throw new TypeError('synchronous calls run the store in the calling thread: open the session with { thread: false }');
    }
    if (this.closed) throw new Error('the store is closed');
    return this.ops[op](args ?? {});
  }

  /** One session let go of the store; the last one closes it (leases released, connection closed). */
  async release() {
    this.users -= 1;
    if (this.users > 0 || this.closed) return null;
    return this.close();
  }

  /** release(), in the calling thread (a store opened with `thread: false`). */
  releaseSync() {
    this.users -= 1;
    if (this.users > 0 || this.closed) return null;
    if (this.worker) throw new TypeError('synchronous calls run the store in the calling thread: open the session with { thread: false }');
    let result = null;
    try {
      result = this.ops.close();
    } finally {
      this.closed = true;
      if (stores.get(this.key) === this) stores.delete(this.key);
    }
    return result;
  }

  async close() {
    if (this.closed) return null;
    let result = null;
    try {
      result = await this.call('close');
    } finally {
      this.closed = true;
      if (stores.get(this.key) === this) stores.delete(this.key);
      if (this.worker && !result?.kept) {
        // A connection to a retired generation is never closed (see Host.close):
        // its worker is left running, unreferenced, until the process ends.
        if (result?.closed !== false) await this.worker.terminate();
      }
    }
    return result;
  }
}
