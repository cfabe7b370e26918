// The flush: the loop that runs the policy component's flush machine for
// each batch, performs every step it asks for (open, write, wait, resolve,
// capture, divert) and feeds back what happened until it says `done`; the
// outcome is the component's own object. Several batches met at once are
// written in one transaction when every machine asks to write first. A
// room of Host (host.js).
//
// Two doors into the one machine. `flush-step-json` carries the handle's
// state as opaque JSON (this.state) and replays the running flush's inputs
// at every call: it serves every state and every step. The typed resources
// (`handle`, `flush`) keep their state inside the component and cost about
// half as much a batch; they serve one road only, the common one: a batch
// started on a clean handle (open, nothing sticky, nothing captured, no
// pending capture) whose machine asks to write, and whose write commits.
// Each such batch runs on a typed handle of its own from a pool (a group's
// batches are in flight together, and a typed handle runs one flush at a
// time); a handle from the pool has only ever been answered `opened` and
// `committed`, so its state is the clean one too. Whatever else the write
// meets (a failure of any kind) is decided by the JSON machine: it is
// started from the handle's state with the same start (uids, seed), must
// ask for the same write, and is fed the write's event; from there on the
// flush is the JSON machine's alone, as every flush was before. The typed
// handle is then dropped. test/typed.test.mjs holds the two doors to the
// same steps and outcome bytes.
import { holdsSession } from './captures.js';
import { validSession } from './divert.js';
import { MAX_UID } from './divert_lines.js';
import { Refusal } from './errors.js';
import { mintId, seed } from './ids.js';
import { flushStep, outcomeText, spent, typedEvent, typedHandle, typedPoll, typedStart } from './policy.js';
import { recordObservation } from './record.js';
import { sleep } from './sleep.js';

/** A state of the JSON machine that is the clean handle: open, nothing sticky, nothing captured, no flush running. */
function clean(state) {
  if (state === null || typeof state !== 'object') return false;
  for (const k of Object.keys(state)) if (!['v', 'open', 'sticky', 'capture', 'flush'].includes(k)) return false;
  return state.v === 1 && state.open === true && state.sticky === null && state.capture === null && state.flush === null;
}

const plainPlan = (plan) => plan?.degrade_fts !== true && plan?.recreate_session !== true;

function dispose(...resources) {
  for (const r of resources) {
    try {
      r?.[Symbol.dispose]();
    } catch {
      // a resource the component has let go of already
    }
  }
}

/** Host's methods for flushing. */
export const flushing = {
  /**
   * Flush one batch: `items` (JSON objects, stored exactly as given) with
   * `uids` (null where the caller has none: minted here). Returns
   * `{outcome, text}`: the component's outcome object and its exact JSON.
   */
  append(session, items, uids = null) {
    const [r] = this.appendGroup([{ session, items, uids }]);
    if (r.error) throw r.error;
    return r;
  },

  /**
   * A flush machine started for one batch on the handle's state `base`:
   * `m.first` is the step it asks for first. Typed when `base` is the clean
   * handle and the typed machine asks to write; else the JSON machine's.
   */
  member(req, base) {
    const { session, items, uids, texts } = req;
    if (!validSession(session)) throw new Refusal(`invalid session id: ${JSON.stringify(session)}`, { code: 'invalid_session_id' });
    const minted = [];
    const all = items.map((_, i) => {
      const u = uids?.[i];
      // host/src/message.rs MAX_UID: replay reads no longer uid back.
      if (typeof u === 'string' && Buffer.byteLength(u) > MAX_UID) {
        throw new Refusal(`uids[${i}] must be a non-empty string of at most ${MAX_UID} bytes`, { code: 'invalid_uid' });
      }
      if (typeof u === 'string' && u.length > 0) return u;
      const m = mintId();
      minted.push(m);
      return m;
    });
    const start = { session, uids: all, minted_uids: minted, seed: seed() };
    if (this.synchronous === 'NORMAL') start.durability = 'unsynced';
    const hold = this.holdsNow.find((h) => holdsSession(h, session));
    if (hold) start.pending_capture = { path: hold.path, cause: hold.cause };
    const now = performance.now();
    // `texts`: the items' JSON texts when the session sent them (ops.js batchOf), stored as they are.
    const batch = { session, items, uids: all, texts: texts ?? null };
    const m = { batch, start, base, startedMs: now, t0: now, typed: null, done: null };
    if (this.typedFlush && this.db && !hold && clean(base)) m.typed = this.typedBegin(start);
    if (m.typed) {
      m.first = { type: 'write', plan: {} };
      return m;
    }
    m.answer = flushStep({ state: base, start });
    m.reply = JSON.parse(m.answer);
    if (m.reply.error) throw new Error(`the flush machine refused a step: ${m.reply.error}`);
    m.first = m.reply.step;
    return m;
  },

  /**
   * A typed flush of `start` on a clean handle from the pool (a new one
   * first asks to open: the store is open, so it is answered `opened`).
   * `{handle, flush}` when it asks to write with no remedy in the plan;
   * else null (nothing was performed), and the JSON machine starts it.
   */
  typedBegin(start) {
    const handle = this.typedPool.pop() ?? typedHandle();
    let flush = null;
    try {
      flush = typedStart(handle, start);
      let step = typedPoll(flush);
      if (step?.tag === 'open') {
        typedEvent(flush, { tag: 'opened' });
        step = typedPoll(flush);
      }
      if (step?.tag === 'write' && !step.val.degradeFts && !step.val.recreateSession) return { handle, flush };
    } catch {
      // refused: the JSON machine starts the flush and says why
    }
    dispose(flush, handle);
    return null;
  },

  /**
   * Feed the answer to the step `m` waits on. A typed flush whose write
   * committed ends here with the typed machine's outcome; any other event
   * goes to the JSON machine, started from the same state with the same
   * start, which must ask for the write that was performed.
   */
  feed(m, event) {
    if (!m.typed) {
      m.answer = flushStep({ state: m.reply.state, event });
      m.reply = JSON.parse(m.answer);
      return;
    }
    const { handle, flush } = m.typed;
    m.typed = null;
    if (event.type === 'committed') {
      try {
        typedEvent(flush, { tag: 'committed' });
        const step = typedPoll(flush);
        if (step?.tag === 'done') {
          const outcome = JSON.parse(step.val);
          dispose(flush);
          this.typedPool.push(handle);
          this.counters.typed += 1;
          m.done = { outcome, text: step.val };
          return;
        }
      } catch {
        // refused: the JSON machine is fed the same event below
      }
    }
    dispose(flush, handle);
    this.counters.handedOver += 1;
    const started = JSON.parse(flushStep({ state: m.base, start: m.start }));
    if (started.error || started.step?.type !== 'write' || !plainPlan(started.step.plan)) {
      throw new Error(`the flush machine over JSON did not ask for the write performed: ${started.error ?? JSON.stringify(started.step)}`);
    }
    m.answer = flushStep({ state: started.state, event });
    m.reply = JSON.parse(m.answer);
  },

  /** Let go of the pool's typed handles (the store is closing). */
  dropTyped() {
    dispose(...this.typedPool.splice(0));
  },

  /** Give back a member's typed flush that will not run (its handle is dropped: a flush is still open on it). */
  abandonTyped(m) {
    if (!m?.typed) return;
    dispose(m.typed.flush, m.typed.handle);
    m.typed = null;
  },

  /**
   * Flush several batches at once, each under its own flush machine and
   * with its own outcome, in order. When every machine asks to write first
   * (the store is open, nothing sticky, no two batches of one session),
   * the batches are committed together in one transaction with one sync,
   * each in its own savepoint: a failure of one batch alone (a uid
   * conflict, a lost lease) fails only it; a failure that ends the
   * transaction is every batch's, and each machine then decides on its
   * own. Otherwise they are flushed one after the other.
   */
  appendGroup(reqs) {
    const before = this.componentMs();
    const t0 = performance.now();
    this.holdsNow = this.holdsWatch.holds(this.home);
    const base = this.state;
    // A batch refused before its flush began (an invalid session id) gets
    // its error; nothing of it was done.
    const members = reqs.map((r) => {
      try {
        return this.member(r, base);
      } catch (error) {
        return { error };
      }
    });
    const sessions = new Set(reqs.map((r) => r.session));
    const together = members.length > 1 && this.db && sessions.size === members.length
      && members.every((m) => !m.error && m.first?.type === 'write');
    let results;
    try {
      results = this.runGroup(reqs, members, together, t0);
    } finally {
      // A typed flush a fault of the host left open is let go with its handle.
      for (const m of members) this.abandonTyped(m);
    }
    this.counters.flushes += reqs.length;
    this.counters.flushMs += performance.now() - t0;
    this.counters.componentMs += this.componentMs() - before;
    return results;
  },

  /** appendGroup's members, flushed together or one after the other. */
  runGroup(reqs, members, together, t0) {
    let results;
    if (together) {
      const events = this.writeGroup(members.map((m) => ({ batch: m.batch, plan: m.first.plan ?? {} })), t0);
      this.counters.groups += 1;
      for (const ev of events) if (ev.type === 'failed') recordObservation('append_batch', ev);
      results = members.map((m, i) => {
        try {
          this.feed(m, events[i]);
          return this.drive(m);
        } catch (error) {
          return { error };
        }
      });
    } else {
      // One after the other, each machine started on the state the one
      // before it left (the first one's start is already made).
      for (const m of members.slice(1)) this.abandonTyped(m);
      results = members.map((m, i) => {
        if (m.error) return m;
        let started = m;
        try {
          if (i > 0) started = this.member(reqs[i], this.state);
          return this.drive(started);
        } catch (error) {
          this.abandonTyped(started);
          // A refusal met on the way (a newer schema at the open) is this
          // batch's answer; the batches before it stand.
          return { error };
        }
      });
    }
    return results;
  },

  /** Perform the steps one machine asks for until it is done; the handle keeps its state. */
  drive(m) {
    const { batch, startedMs } = m;
    if (m.typed) {
      // The typed machine's first step, the write: its event is fed as any.
      const event = this.writeGroup([{ batch, plan: m.first.plan ?? {} }], startedMs)[0];
      if (event.type === 'failed') recordObservation('append_batch', event);
      this.feed(m, event);
    }
    if (m.done) return m.done;
    for (;;) {
      const reply = m.reply;
      if (reply.error) throw new Error(`the flush machine refused a step: ${reply.error}`);
      this.state = reply.state;
      const step = reply.step;
      let event;
      switch (step.type) {
        case 'done':
          return { outcome: step.outcome, text: outcomeText(m.answer) };
        case 'open':
          event = this.openStore(startedMs) ?? { type: 'opened' };
          break;
        case 'write':
          event = this.writeGroup([{ batch, plan: step.plan ?? {} }], startedMs)[0];
          break;
        case 'wait':
          sleep(step.ms);
          event = { type: 'waited', elapsed_ms: Math.round(performance.now() - startedMs) };
          break;
        case 'resolve':
          event = this.resolve(batch, startedMs);
          break;
        case 'capture':
          event = this.captureStep();
          break;
        case 'divert':
          event = this.divertStep(batch, step.cause);
          break;
        default:
          throw new Error(`unknown step ${step.type}`);
      }
      // The flush machine names a failure by its phase: opening, or writing
      // (a write and the read that resolves a lost COMMIT).
      if (event.type === 'failed') recordObservation(step.type === 'open' ? 'open' : 'append_batch', event);
      this.feed(m, event);
    }
  },

  componentMs() {
    return spent.ms;
  },

  /** The machine's sticky cause, as its state says (opaque otherwise: read only for edits). */
  stickyCause() {
    const s = this.state;
    const sticky = s?.handle?.sticky ?? s?.sticky ?? null;
    return typeof sticky === 'string' ? sticky : null;
  },
};
