// The Node host: one handle on a turnsafe home (home/state.db, diverts in
// home/sessions/), the schema the native host writes (schema.js), and the
// effects the policy component's flush machine asks for. It holds no
// decision of its own: `append` starts a flush on the machine and performs
// each step it asks for until it says `done` (flush.js); edits (pop, clear,
// a history transaction) ask the component after each failed attempt
// (edits.js). Synchronous: it runs in the store's worker thread.
//
// This file is the handle's state and its face; each room adds its methods
// to it: open.js (open, configure, statements), flush.js (the flush
// machine's loop), write.js (the write step and the resolve read),
// lease.js (a session's turn lease), captures.js (the capture step),
// divert.js (the divert step), edits.js (reads and edits), clear.js (the
// clear), close.js (close). A method calls another through `this`, so a
// test may replace one on an instance.
import path from 'node:path';

import { capturing, HoldsWatch } from './captures.js';
import { clearing } from './clear.js';
import { closing, kept } from './close.js';
import { diverting } from './divert.js';
import { editing } from './edits.js';
import { flushing } from './flush.js';
import { leasing } from './lease.js';
import { opening } from './open.js';
import { writing } from './write.js';

export { EditFailure, Incomplete, Refusal } from './errors.js';
export { textOf } from './projection.js';
export { SCHEMA_VERSION, versionAt } from './schema.js';

export class Host {
  constructor(home, opts = {}) {
    this.home = path.resolve(home);
    this.dbPath = path.join(this.home, 'state.db');
    this.holder = opts.holder ?? `pid-${process.pid}`;
    this.leaseTtlMs = opts.leaseTtlMs ?? 30_000;
    this.busyTimeoutMs = opts.busyTimeoutMs ?? 10;
    this.synchronous = opts.synchronous === 'normal' ? 'NORMAL' : 'FULL';
    this.guardOn = opts.guard !== false;
    this.db = null;
    this.guard = null;
    this.homeSynced = false;
    // The machine's handle (open, sticky cause, capture), opaque here.
    this.state = null;
    // Per session: {nextSeq, lease}.
    this.cursors = new Map();
    this.captured = null;
    // A connection whose generation is retired is never closed (see close()).
    this.retired = false;
    // Whether SQLite's checkpoint at close is off (null: never asked).
    this.ckptForbidden = null;
    this.ckptError = null;
    this.stmts = null;
    this.counters = { opens: 0, writes: 0, groups: 0, flushes: 0, typed: 0, handedOver: 0, diverts: 0, flushMs: 0, componentMs: 0 };
    // The typed flush machine for the write-and-commit road (flush.js);
    // `typedFlush: false` sends every step through flush-step-json.
    this.typedFlush = opts.typedFlush !== false;
    // Clean typed handles, each free for the next batch.
    this.typedPool = [];
    this.holdsNow = [];
    // The captures in the home, as last read.
    this.holdsWatch = new HoldsWatch();
  }

  cursor(session) {
    let c = this.cursors.get(session);
    if (!c) {
      c = { nextSeq: null, lease: null };
      this.cursors.set(session, c);
    }
    return c;
  }
}

// Each room's methods, as a class's own are: not enumerable; no name twice.
for (const room of [opening, flushing, writing, leasing, capturing, diverting, editing, clearing, closing]) {
  for (const [name, d] of Object.entries(Object.getOwnPropertyDescriptors(room))) {
    if (Object.hasOwn(Host.prototype, name)) throw new Error(`Host.${name} is defined by two rooms`);
    Object.defineProperty(Host.prototype, name, { ...d, enumerable: false });
  }
}

/** Connections to retired generations, kept open until the process ends. */
Host.kept = kept;
