// TurnsafeSession: the `Session` of the OpenAI Agents SDK for JavaScript
// (`@openai/agents` 0.20) on a turnsafe home, with its optional
// history-transaction hooks. Every batch ends committed, in a durable
// divert copy with a receipt, or handed back; when it is not committed,
// the call rejects with TurnNotPersisted carrying the outcome.
import { createHash, randomUUID } from 'node:crypto';

import { TurnNotPersisted, TurnsafeError } from './errors.js';
import { safeSessionId } from './safe_id.js';
import { NotJson, digest } from './same.js';
import { Store } from './store.js';

/**
 * What a handed-back item is known by until it is resent: the digest of
 * its canonical bytes (js/src/same.js), so only an item with the same
 * bytes takes its uid again. null for an item that has no canonical bytes
 * (a lone surrogate): it never takes an earlier uid.
 */
function print(item) {
  try {
    return digest(item);
  } catch (e) {
    if (e instanceof NotJson) return null;
    throw e;
  }
}

/** An item as it will be stored: its JSON round trip (undefined fields dropped). */
function plain(item) {
  return JSON.parse(textOfItem(item));
}

/** An item's JSON text, which parses to the item as it will be stored (`plain`). */
function textOfItem(item) {
  if (item === null || typeof item !== 'object' || Array.isArray(item)) {
    throw new TypeError('a session item must be a JSON object');
  }
  const text = JSON.stringify(item);
  // An item whose toJSON gives nothing has no text: refused as plain() refuses it.
  if (typeof text !== 'string') JSON.parse(text);
  return text;
}

function userError(message) {
  const e = new Error(message);
  e.name = 'UserError';
  return e;
}

/** The uids of a history transaction's items: the same for every retry of one operation id. */
function operationUids(operationId, n, salt) {
  const h = createHash('sha256').update(`${salt}\0${operationId}`).digest('hex').slice(0, 32);
  return Array.from({ length: n }, (_, i) => `op-${h}-${i}`);
}

export class TurnsafeSession {
  /**
   * @param {string} sessionId the SDK's id (any string; `turnsafeId` is the id it is stored under)
   * @param {string} home the turnsafe home: `home/state.db`, diverts in `home/sessions/`
   * @param {object} [options] `{ holder, leaseTtlMs, synchronous: 'full'|'normal', thread: true, limit }`
   */
  constructor(sessionId, home, options = {}) {
    if (typeof sessionId !== 'string' || sessionId.length === 0) throw new TypeError('sessionId must be a non-empty string');
    this.sessionId = sessionId;
    this.turnsafeId = safeSessionId(sessionId);
    this.home = home;
    this.limit = options.limit ?? null;
    this.store = options.store ?? Store.for(home, options);
    if (options.store) options.store.users += 1;
    // Uids of items whose batch was not persisted, by content, oldest first.
    this.unsettled = new Map();
    this.closed = false;
  }

  async getSessionId() {
    return this.sessionId;
  }

  // Each operation has an asynchronous form (the SDK's `Session`) and a
  // synchronous one (`...Sync`, for a session opened with `thread: false`:
  // the store runs in the calling thread, as better-sqlite3 does, and every
  // wait of a retry plan blocks it). Both forms make the same request and
  // read its answer the same way (`...Request` and `...Answer` below), so
  // they reach the same outcomes and copy.

  /**
   * The newest `limit` items (all without one) in chronological order,
   * exactly as they were added. Rejects with HistoryIncomplete while an
   * unsettled capture holds rows of the session the database lacks.
   */
  async getItems(limit) {
    const args = this.showRequest(limit);
    return args === null ? [] : this.store.call('show', args);
  }

  /** getItems() in the calling thread. */
  getItemsSync(limit) {
    const args = this.showRequest(limit);
    return args === null ? [] : this.store.callSync('show', args);
  }

  showRequest(limit) {
    const n = limit ?? this.limit;
    if (n !== null && n !== undefined && n <= 0) return null;
    return { session: this.turnsafeId, limit: n ?? null };
  }

  /** Append one batch; rejects with TurnNotPersisted (`.outcome`) unless every item was committed. */
  async addItems(items) {
    const request = this.appendRequest(items);
    if (request === null) return;
    this.appendAnswer(request, await this.store.call('append', request.args));
  }

  /** addItems() in the calling thread: returns once committed, else throws TurnNotPersisted. */
  addItemsSync(items) {
    const request = this.appendRequest(items);
    if (request === null) return;
    this.appendAnswer(request, this.store.callSync('append', request.args));
  }

  appendRequest(items) {
    if (!items || items.length === 0) return null;
    // Each item crosses to the store as its JSON text: what it will be
    // stored as, and cheaper to hand to a worker than the object.
    const texts = items.map(textOfItem);
    let prints = null;
    let uids = null;
    if (this.unsettled.size > 0) {
      // A resend after a failure reuses the failed attempt's uids.
      prints = texts.map((t) => print(JSON.parse(t)));
      uids = prints.map((p) => (p === null ? null : this.takeUnsettled(p)));
    }
    return { texts, prints, args: { session: this.turnsafeId, texts, uids } };
  }

  appendAnswer(request, { outcome, text }) {
    if (outcome.persisted) return;
    const prints = request.prints ?? request.texts.map((t) => print(JSON.parse(t)));
    prints.forEach((p, i) => {
      if (p === null) return;
      const q = this.unsettled.get(p) ?? [];
      q.push(outcome.uids[i]);
      this.unsettled.set(p, q);
    });
    throw new TurnNotPersisted(outcome, text);
  }

  takeUnsettled(print) {
    const q = this.unsettled.get(print);
    if (!q || q.length === 0) return null;
    const uid = q.shift();
    if (q.length === 0) this.unsettled.delete(print);
    return uid;
  }

  /** Remove and return the newest item (undefined when there is none). */
  async popItem() {
    const item = await this.store.call('pop', { session: this.turnsafeId });
    return item ?? undefined;
  }

  /** popItem() in the calling thread. */
  popItemSync() {
    const item = this.store.callSync('pop', { session: this.turnsafeId });
    return item ?? undefined;
  }

  /** Remove every item; the session's pending divert lines are settled as `cleared`. */
  async clearSession() {
    await this.store.call('clear', { session: this.turnsafeId });
    this.unsettled.clear();
  }

  /** clearSession() in the calling thread. */
  clearSessionSync() {
    this.store.callSync('clear', { session: this.turnsafeId });
    this.unsettled.clear();
  }

  /**
   * Replace the whole stored history with `items` (a compaction marker and
   * its retained suffix) in one transaction: all of it, or nothing.
   */
  async replaceHistoryWithCompaction(items) {
    await this.store.call('replace', this.compactionRequest(items));
  }

  /** replaceHistoryWithCompaction() in the calling thread. */
  replaceHistoryWithCompactionSync(items) {
    this.store.callSync('replace', this.compactionRequest(items));
  }

  compactionRequest(items) {
    const replacement = items.map(plain);
    const uids = operationUids(randomUUID(), replacement.length, 'compaction');
    return { session: this.turnsafeId, expected: null, replacement, uids, edit: 'replace_history' };
  }

  /**
   * `SessionHistoryTransactionAwareSession`: an `append_items` or a
   * `replace_suffix` transaction, applied atomically and idempotent by
   * `operationId`. Its items are stored under uids derived from the
   * operation id, so a retry of the same operation finds them stored (and
   * succeeds without applying it again), and the same id with other items
   * is refused. An append that is not committed rejects with
   * TurnNotPersisted, like addItems; its retry reuses the same uids.
   */
  async applyHistoryTransaction(args) {
    const request = this.transactionRequest(args);
    if (request === null) return;
    const r = await this.store.call(request.op, request.args);
    if (request.op === 'appendTransaction') transactionAnswer(r);
  }

  /** applyHistoryTransaction() in the calling thread. */
  applyHistoryTransactionSync(args) {
    const request = this.transactionRequest(args);
    if (request === null) return;
    const r = this.store.callSync(request.op, request.args);
    if (request.op === 'appendTransaction') transactionAnswer(r);
  }

  transactionRequest(args) {
    const operationId = args?.operationId;
    const transaction = args?.transaction;
    if (typeof operationId !== 'string' || !operationId.trim()) {
      throw userError('Session history transaction operationId must be a non-empty string.');
    }
    if (!transaction || typeof transaction !== 'object') throw userError('Session history transaction must be an object.');
    if (transaction.type === 'append_items') {
      if (!Array.isArray(transaction.items)) throw userError('Session history append transaction fields are invalid.');
      const items = transaction.items.map(plain);
      if (items.length === 0) return null;
      const uids = operationUids(operationId, items.length, 'append_items');
      return { op: 'appendTransaction', args: { session: this.turnsafeId, items, uids } };
    }
    if (transaction.type === 'replace_suffix') {
      if (!Array.isArray(transaction.expectedSuffix) || !Array.isArray(transaction.replacement)) {
        throw userError('Session history suffix transaction fields are invalid.');
      }
      const replacement = transaction.replacement.map(plain);
      const uids = operationUids(operationId, replacement.length, 'replace_suffix');
      return { op: 'replace', args: { session: this.turnsafeId, expected: transaction.expectedSuffix.map(plain),
        replacement, uids, edit: 'replace_suffix' } };
    }
    throw userError('Unsupported session history transaction type.');
  }

  /** Give back this session's turn lease; the last session on the store closes it. */
  async close() {
    if (this.closed) return;
    this.closed = true;
    await this.store.call('release', { session: this.turnsafeId }).catch(() => {});
    await this.store.release();
  }

  /** close() in the calling thread. */
  closeSync() {
    if (this.closed) return;
    this.closed = true;
    try {
      this.store.callSync('release', { session: this.turnsafeId });
    } catch {
      // the lease then expires on its own
    }
    this.store.releaseSync();
  }
}

/** What a history append answered: done already, committed, or TurnNotPersisted. */
function transactionAnswer(r) {
  if (r.already || r.outcome.persisted) return;
  throw new TurnNotPersisted(r.outcome, r.text);
}

export { TurnNotPersisted, TurnsafeError, safeSessionId };
