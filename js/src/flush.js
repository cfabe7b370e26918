// The flush: the loop that runs the policy component's flush machine for
// each batch (`flush-step-json`), performs every step it asks for (open,
// write, wait, resolve, capture, divert) and feeds back what happened until
// it says `done`; the outcome is the component's own object. Several
// batches met at once are written in one transaction when every machine
// asks to write first. A room of Host (host.js).
import { holdsSession } from './captures.js';
import { validSession } from './divert.js';
import { MAX_UID } from './divert_lines.js';
import { Refusal } from './errors.js';
import { mintId, seed } from './ids.js';
import { flushStep, outcomeText, spent } from './policy.js';
import { recordObservation } from './record.js';
import { sleep } from './sleep.js';

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

  /** A flush machine started for one batch on the handle's state `base`. */
  member(req, base) {
    const { session, items, uids } = req;
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
    const m = { batch: { session, items, uids: all }, startedMs: performance.now(), t0: performance.now() };
    m.answer = flushStep({ state: base, start });
    m.reply = JSON.parse(m.answer);
    if (m.reply.error) throw new Error(`the flush machine refused a step: ${m.reply.error}`);
    return m;
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
      && members.every((m) => !m.error && m.reply.step?.type === 'write');
    let results;
    if (together) {
      const events = this.writeGroup(members.map((m) => ({ batch: m.batch, plan: m.reply.step.plan ?? {} })), t0);
      this.counters.groups += 1;
      for (const ev of events) if (ev.type === 'failed') recordObservation('append_batch', ev);
      results = members.map((m, i) => {
        m.answer = flushStep({ state: m.reply.state, event: events[i] });
        m.reply = JSON.parse(m.answer);
        return this.drive(m);
      });
    } else {
      // One after the other, each machine started on the state the one
      // before it left (the first one's start is already made).
      results = members.map((m, i) => {
        if (m.error) return m;
        try {
          const started = i === 0 ? m : this.member(reqs[i], this.state);
          return this.drive(started);
        } catch (error) {
          // A refusal met on the way (a newer schema at the open) is this
          // batch's answer; the batches before it stand.
          return { error };
        }
      });
    }
    this.counters.flushes += reqs.length;
    this.counters.flushMs += performance.now() - t0;
    this.counters.componentMs += this.componentMs() - before;
    return results;
  },

  /** Perform the steps one machine asks for until it is done; the handle keeps its state. */
  drive(m) {
    const { batch, startedMs } = m;
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
      m.answer = flushStep({ state: this.state, event });
      m.reply = JSON.parse(m.answer);
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
