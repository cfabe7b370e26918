// Reads and edits outside a flush (show, pop, a history transaction, the
// database half of clear): each attempt runs in one transaction, the guard
// and another holder's lease checked first for a write; a failed attempt is
// driven by the policy component's edit machine (`editStep`). A room of Host (host.js).
import Database from 'better-sqlite3';

import { holds, holdsSession, holdValue } from './captures.js';
import { validSession } from './divert.js';
import { EditFailure, Incomplete, Refusal, userError } from './errors.js';
import { failedEvent } from './failure.js';
import { mintId, seed } from './ids.js';
import { judge } from './lease.js';
import { editStep } from './policy.js';
import { textOf } from './projection.js';
import { recordObservation } from './record.js';
import { sameText } from './same.js';
import { sleep } from './sleep.js';

/** Host's methods for reads and edits. */
export const editing = {
  /** A sticky handle refuses every edit before it touches anything: the machine's first step. */
  refuseIfSticky(edit, session) {
    const sticky = this.stickyCause();
    if (!sticky) return;
    const { step } = editStep({ state: null, sticky, edit, session });
    if (step.type === 'failed') {
      throw new EditFailure(edit, session, step.cause, step.action,
        'the store refuses to touch its database until an operator acts', 0, step.copy, step.possibly_written);
    }
  },

  /**
   * Work outside a flush, driven by the policy's edit machine: each attempt
   * opens the store if needed and runs `f(db)` in one BEGIN IMMEDIATE
   * transaction (the guard and the session's lease checked first when
   * `write`); the machine says whether to wait, write around the search
   * index, or fail with its cause and copy.
   */
  edit(edit, session, f, { write = true } = {}) {
    const started = performance.now();
    const s = seed();
    let answer = editStep({ state: null, sticky: this.stickyCause() ?? null, seed: s, edit, session });
    let value;
    let last = 'the store refuses to touch its database until an operator acts';
    let attempt = 0;
    for (;;) {
      const { step } = answer;
      let event;
      if (step.type === 'attempt') {
        attempt += 1;
        let ev = this.openStore(started);
        if (!ev) ev = this.editOnce(session, f, write, step.degrade_fts, started);
        if (ev.type === 'ok') {
          value = ev.value;
          event = { type: 'succeeded' };
        } else {
          last = ev.message;
          const { type: _failed, ...obs } = ev;
          // Recorded as the machine reads it: a `replay`, work with nothing to divert.
          recordObservation('replay', { ...obs, attempt, seed: s });
          event = ev;
        }
      } else if (step.type === 'wait') {
        sleep(step.ms);
        event = { type: 'waited' };
      } else if (step.type === 'done') {
        return value;
      } else {
        throw new EditFailure(edit, session, step.cause, step.action, last, step.attempts, step.copy, step.possibly_written);
      }
      answer = editStep({ state: answer.state, edit, session, event });
    }
  },

  editOnce(session, f, write, degraded, started) {
    const db = this.db;
    const st = this.stmts;
    try {
      // A read takes no write lock: a deferred transaction, one snapshot.
      (write ? st.begin : st.beginRead).run();
      try {
        if (write && this.guard) {
          let verdict;
          try {
            verdict = this.guard.check();
          } catch (e) {
            throw Object.assign(new Error(`turnsafe ${e.message}`), { code: 'SQLITE_IOERR' });
          }
          if (verdict) throw Object.assign(new Error(`turnsafe guard: ${verdict.detail}`), { evidence: [verdict.evidence] });
        }
        if (write) {
          const row = st.lease.get(session);
          const ours = this.cursors.get(session)?.lease ?? null;
          // Another holder's lease fences the edit until it expires or the
          // policy finds its holder gone; an edit never takes the lease.
          const judged = row && row.lease_token !== null && row.lease_token !== ours
            ? judge(session, row.lease_holder, row.lease_expires_ms, Date.now()) : null;
          if (judged && !judged.take) {
            throw Object.assign(new Error("the session's turn lease is held by another writer"),
              { evidence: ['turn_lease_lost'], lease: judged.holder });
          }
          if (degraded) st.degrade.run();
        }
        const value = f(db);
        st.commit.run();
        return { type: 'ok', value };
      } catch (e) {
        if (db.inTransaction) st.rollback.run();
        throw e;
      }
    } catch (e) {
      if (e instanceof Refusal || e.userError) throw e;
      if (e.evidence) return { ...failedEvent(e, started, { evidence: e.evidence }), ...(e.lease ? { lease: e.lease } : {}) };
      if (!(e instanceof Database.SqliteError)) throw e;
      return failedEvent(e, started);
    }
  },

  /**
   * Rows of `session` in seq order (the newest `limit`, all when null):
   * `[{uid, seq, item, text}]`, `text` the stored JSON text (what a
   * comparison reads: JSON.parse would round its numbers).
   */
  rows(db, session, limit) {
    return db.prepare(`SELECT uid, seq, item FROM (SELECT id, uid, seq, item FROM messages WHERE session_id = ?
      ORDER BY seq DESC, id DESC LIMIT ?) ORDER BY seq, id`).all(session, limit ?? -1)
      .map((r) => ({ uid: r.uid, seq: r.seq, item: JSON.parse(r.item), text: r.item }));
  },

  /** The stored items, or Incomplete while an unsettled capture holds rows of the session. */
  show(session, limit) {
    if (!validSession(session)) throw new Refusal(`invalid session id: ${JSON.stringify(session)}`, { code: 'invalid_session_id' });
    const rows = this.edit('show', session, (db) => this.rows(db, session, limit), { write: false });
    const held = holds(this.home).filter((h) => holdsSession(h, session));
    if (held.length) throw new Incomplete(session, rows.map((r) => r.item), held.map((h) => holdValue(h, session)));
    return rows.map((r) => r.item);
  },

  /**
   * Take rows of `session` out of the transcript (`uid`, from `fromSeq`
   * on, or all): with schema 4 they move to the archive, stamped with the
   * reason, this writer and the edit's id, as the native host's edits do.
   */
  takeOut(db, session, { uid = null, fromSeq = null }, reason, editId) {
    const filter = 'session_id = ? AND (? IS NULL OR uid = ?) AND (? IS NULL OR seq >= ?)';
    const args = [session, uid, uid, fromSeq, fromSeq];
    if (this.hasArchive(db)) {
      db.prepare(`INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, reason, holder, edit)
        SELECT session_id, uid, seq, role, content, item, created_ms, ?, ?, ?, ? FROM messages WHERE ${filter} ORDER BY seq, id`)
        .run(Date.now(), reason, this.holder, editId, ...args);
    }
    // The schema's messages_fts_unindex trigger keeps the index and its watermark true.
    return db.prepare(`DELETE FROM messages WHERE ${filter}`).run(...args).changes;
  },

  hasArchive(db) {
    return db.prepare("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'archive') AS e").get().e === 1;
  },

  /** Remove and return the newest item (null when none). */
  pop(session) {
    const editId = mintId();
    return this.edit('pop', session, (db) => {
      const last = this.rows(db, session, 1)[0];
      if (!last) return null;
      this.takeOut(db, session, { uid: last.uid }, 'pop', editId);
      return last.item;
    });
  },

  /**
   * `replaceHistoryWithCompaction` and `replace_suffix`: in one
   * transaction, take the stored items from the start of the suffix on
   * out (to the archive with schema 4, reason `compaction`; all of them
   * with `expected` null, else the stored suffix must equal `expected`)
   * and store `replacement` under `uids` from that seq on. Idempotent: when
   * every replacement uid is stored with its item, it was applied already.
   */
  replace(session, expected, replacement, uids, edit = 'replace') {
    const editId = mintId();
    return this.edit(edit, session, (db) => {
      const stored = uids.map((u) => this.stmts.stored.get(session, u));
      if (uids.length > 0 && stored.every(Boolean)) {
        if (stored.every((r, i) => sameText(r.item, replacement[i]))) return { applied: false };
        throw userError('Session history operation was already applied with a different transaction.');
      }
      if (stored.some(Boolean)) throw userError('Session history operation was already applied with a different transaction.');
      const all = this.rows(db, session, null);
      let from = 0;
      if (expected !== null) {
        from = all.length - expected.length;
        if (from < 0 || !all.slice(from).every((r, i) => sameText(r.text, expected[i]))) {
          throw userError('Session history suffix no longer matches the transaction precondition.');
        }
      }
      let seq = from < all.length ? all[from].seq : this.stmts.maxSeq.get(session).s;
      if (from < all.length) this.takeOut(db, session, { fromSeq: seq }, 'compaction', editId);
      if (!this.stmts.lease.get(session)) db.prepare('INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?, ?)').run(session, Date.now());
      const created = Date.now();
      replacement.forEach((m, i) => {
        this.stmts.insert.run(session, uids[i], seq, typeof m.role === 'string' ? m.role : null, textOf(m.content),
          JSON.stringify(m), created);
        seq += 1;
      });
      const cur = this.cursor(session);
      if (cur.nextSeq !== null) cur.nextSeq = Math.max(cur.nextSeq, seq);
      return { applied: true };
    });
  },

  /**
   * How much of a history append by operation id is stored already:
   * `all` (each uid with the same item), `conflict` (a uid with another
   * item), else `none`. Nothing is opened for it on a sticky handle or
   * when the store cannot be opened: the flush then decides.
   */
  storedUids(session, uids, items) {
    if (this.stickyCause()) return 'none';
    try {
      if (this.openStore(performance.now())) return 'none';
      const rows = uids.map((u) => this.stmts.stored.get(session, u));
      if (rows.some((r, i) => r && !sameText(r.item, items[i]))) return 'conflict';
      return rows.length > 0 && rows.every(Boolean) ? 'all' : 'none';
    } catch (e) {
      if (e instanceof Refusal) throw e;
      return 'none';
    }
  },
};
