// The write step: one BEGIN IMMEDIATE transaction for one batch or
// several (each in a savepoint), the guard checked under the write lock,
// each batch's seqs, lease and rows, one COMMIT; and the read that resolves
// a lost COMMIT. A room of Host (host.js).
import Database from 'better-sqlite3';

import { divertMaxSeq } from './divert.js';
import { failedEvent } from './failure.js';
import { codesOf, decideScope } from './policy.js';
import { textOf } from './projection.js';
import { sameText } from './same.js';

/** Host's methods for writing. */
export const writing = {
  /**
   * One attempt for `entries` (`{batch, plan}`, distinct sessions): a single
   * BEGIN IMMEDIATE transaction, the guard checked under the write lock,
   * each batch in a savepoint when there are several, one COMMIT. Returns
   * one event per entry (`committed` or `failed`).
   */
  writeGroup(entries, startedMs) {
    const db = this.db;
    const st = this.stmts;
    if (!db) return entries.map(() => failedEvent(new Error('the store is not open'), startedMs, { openCode: true }));
    this.counters.writes += 1;
    const several = entries.length > 1;
    const own = entries.map(() => null);
    // What each session will know once COMMIT succeeds.
    const pending = entries.map(() => null);
    let group = null;
    const sqlite = (e) => e instanceof Database.SqliteError || (typeof e?.code === 'string' && e.code.startsWith('SQLITE_'));
    try {
      st.begin.run();
      try {
        if (this.guard) {
          let verdict;
          try {
            verdict = this.guard.check();
          } catch (e) {
            throw Object.assign(new Error(`turnsafe ${e.message}`), { code: 'SQLITE_IOERR', probeErrno: e.errno });
          }
          if (verdict) throw Object.assign(new Error(`turnsafe guard: ${verdict.detail}`), { evidence: [verdict.evidence] });
        }
        entries.forEach(({ batch, plan }, k) => {
          if (several) st.savepoint.run();
          const cur = this.cursor(batch.session);
          try {
            pending[k] = this.writeBatch(batch, plan, cur);
            if (several) st.release.run();
          } catch (e) {
            // A batch that fails alone while the transaction lives on.
            if (several && (e.leaseLost || sqlite(e)) && scopeOf(e, db.inTransaction) === 'batch') {
              st.rollbackTo.run();
              st.release.run();
              own[k] = e;
              if (e.leaseLost) cur.nextSeq = null;
              return;
            }
            throw e;
          }
        });
        st.commit.run();
      } catch (e) {
        if (db.inTransaction) st.rollback.run();
        throw e;
      }
    } catch (e) {
      if (!e.leaseLost && !e.evidence && !sqlite(e)) throw e;
      group = e;
    }
    return entries.map(({ batch }, k) => {
      const e = own[k] ?? group;
      if (!e) {
        const cur = this.cursor(batch.session);
        cur.lease = pending[k].lease;
        cur.nextSeq = pending[k].nextSeq;
        return { type: 'committed' };
      }
      if (e.leaseLost) {
        this.cursor(batch.session).nextSeq = null;
        // The copy names whoever holds the lease.
        return { ...failedEvent(e, startedMs, { evidence: ['turn_lease_lost'] }), ...(e.lease ? { lease: e.lease } : {}) };
      }
      if (e.evidence) return failedEvent(e, startedMs, { evidence: e.evidence });
      return failedEvent(e, startedMs, { errno: e.probeErrno ? Math.abs(e.probeErrno) : null });
    });
  },

  /** One batch's statements inside the transaction: its seqs, the session's lease, its rows. */
  writeBatch(batch, plan, cur) {
    const st = this.stmts;
    const { session, items, uids, texts } = batch;
    // A writer about to take the lease learns which seqs diverted lines
    // already hold, so it never commits over them.
    const promised = cur.lease ? null : divertMaxSeq(this.home, session);
    let seq = st.maxSeq.get(session).s;
    if (cur.nextSeq !== null && cur.nextSeq > seq) seq = cur.nextSeq;
    if (promised !== null && promised + 1 > seq) seq = promised + 1;
    // Where a divert of this batch would put its lines, should it fail.
    if (cur.nextSeq === null) cur.nextSeq = seq;
    if (plan.degrade_fts) st.degrade.run();
    const lease = this.takeLease(session, cur, plan.recreate_session === true);
    const created = Date.now();
    items.forEach((m, i) => {
      try {
        st.insert.run(session, uids[i], seq, typeof m.role === 'string' ? m.role : null, textOf(m.content),
          texts?.[i] ?? JSON.stringify(m), created);
        seq += 1;
      } catch (e) {
        // Idempotent resend: a stored row with the same canonical bytes
        // counts as committed; any other bytes are a conflict.
        if (e.code === 'SQLITE_CONSTRAINT_UNIQUE' && /messages\.session_id, messages\.uid/.test(e.message)) {
          const row = st.stored.get(session, uids[i]);
          if (row && sameText(row.item, m)) return;
        }
        throw e;
      }
    });
    return { lease, nextSeq: seq };
  },

  /**
   * Whether a lost COMMIT took effect, on the connection just opened: every
   * uid of the batch stored with its item's canonical bytes. A uid stored
   * with other bytes is not this batch's row, so the batch is written
   * again and meets it as a conflict.
   */
  resolve(batch, startedMs) {
    try {
      const rows = batch.uids.map((u) => this.stmts.stored.get(batch.session, u));
      return { type: 'resolved', all_stored: rows.every((r, i) => r && sameText(r.item, batch.items[i])) };
    } catch (e) {
      return failedEvent(e, startedMs);
    }
  },
};

/**
 * How far a failed statement reaches inside the group's transaction, as the
 * policy decides (`decide-scope-json`): `batch` (its savepoint) or
 * `transaction`. An answer the host cannot read ends the transaction.
 */
function scopeOf(e, transactionOpen) {
  const observation = e.leaseLost
    ? { evidence: ['turn_lease_lost'] }
    : { ...codesOf(e), message: typeof e.message === 'string' ? e.message : '' };
  const answer = JSON.parse(decideScope({ observation, transaction_open: transactionOpen }));
  return answer.scope === 'batch' ? 'batch' : 'transaction';
}
