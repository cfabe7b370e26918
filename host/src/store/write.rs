//! One attempt at writing a batch: a single `BEGIN IMMEDIATE` transaction.
//! Nothing is read before the write lock is held, so a stale snapshot
//! (`SQLITE_BUSY_SNAPSHOT`) cannot arise.

use crate::lease_proof::{Judged, Proof, judge};
use rusqlite::{Connection, OptionalExtension, params};
use turnsafe_policy::ServerProbe;
use turnsafe_policy::machine::WritePlan;
use turnsafe_policy::{Evidence, Observation, Operation};

use std::collections::HashMap;

use super::{Cursor, Flush, SessionStore};
use crate::ids::now_ms;
use crate::observe;

pub(super) enum WriteFailure {
    /// The first SQLite error of the attempt, and the errno SQLite saw.
    Sqlite {
        error: rusqlite::Error,
        errno: Option<i64>,
        evidence: Vec<Evidence>,
    },
    /// Another writer holds this session's turn lease (named, when its
    /// row names it).
    LeaseLost(Option<Box<turnsafe_policy::LeaseHolder>>),
    /// The guard found the generation changed under the handle.
    Guard { evidence: Evidence, detail: String },
    /// A guard probe itself failed.
    Probe(crate::guard::ProbeError),
}

enum Stop {
    Guard(Evidence, String),
    Probe(crate::guard::ProbeError),
    Sqlite(rusqlite::Error),
    /// COMMIT itself failed: the policy tells from its code whether the
    /// batch may have been written (`commit_sent`).
    Commit(rusqlite::Error),
    LeaseLost(Option<Box<turnsafe_policy::LeaseHolder>>),
}

impl From<rusqlite::Error> for Stop {
    fn from(e: rusqlite::Error) -> Self {
        Stop::Sqlite(e)
    }
}

/// What one transaction did with each batch in it.
pub(super) struct Written {
    /// A failure that ended the whole transaction: no batch of it is
    /// stored, and every batch without a failure of its own failed with it.
    pub group: Option<WriteFailure>,
    /// Each batch's own failure (its savepoint rolled back), in order.
    pub each: Vec<Option<WriteFailure>>,
}

impl SessionStore {
    /// Write `batches` in one `BEGIN IMMEDIATE` transaction, each in its
    /// own savepoint when there are several, and commit them with one sync.
    ///
    /// A batch that fails while the transaction lives on (a constraint, a
    /// lost lease) is rolled back to its savepoint and fails alone. A
    /// failure that ends the transaction (SQLite rolled it back, or a
    /// busy, full, I/O, corruption class error, or a failed COMMIT) fails
    /// the group: everything is rolled back, nothing is half committed.
    pub(super) fn commit_group(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> Written {
        let mut each: Vec<Option<WriteFailure>> = batches.iter().map(|_| None).collect();
        let Some(conn) = self.conn.as_ref() else {
            return Written {
                group: Some(WriteFailure::Sqlite {
                    error: rusqlite::Error::InvalidQuery,
                    errno: None,
                    evidence: Vec::new(),
                }),
                each,
            };
        };
        // Transcript positions belong to the session's lease holder. A
        // writer about to take the lease (its first batch, or a takeover)
        // learns which seqs diverted lines already hold, other writers'
        // included, so it never commits over them and replay can put them
        // back in place.
        let mut promised: HashMap<String, i64> = HashMap::new();
        for (flush, _) in batches {
            let session = flush.session.as_str();
            let holds_lease = self
                .ledger
                .sessions
                .get(session)
                .is_some_and(|s| s.lease_token.is_some());
            if !holds_lease
                && flush.graph.is_none()
                && !promised.contains_key(session)
                && let Some(first) = crate::backend::group::promised_seq(&self.ledger.divert_dir, session)
            {
                promised.insert(session.to_string(), first);
            }
        }
        // What each session will know once the COMMIT succeeds; thrown away if it does not.
        let mut pending: HashMap<String, Cursor> = batches
            .iter()
            .map(|(flush, _)| {
                let id = flush.session.as_str();
                (
                    id.to_string(),
                    self.ledger.sessions.get(id).cloned().unwrap_or_default(),
                )
            })
            .collect();
        // The first seq read for each session, for diverts after a failure;
        // and the sessions whose lease another writer holds.
        let mut first_seqs: HashMap<String, i64> = HashMap::new();
        let mut fenced: Vec<String> = Vec::new();
        let guard = &mut self.guard;
        let ttl_ms = self.opts.lease_ttl.as_millis() as i64;
        let holder = self.opts.holder.as_str();
        let savepoints = batches.len() > 1;
        let watch = &mut self.lock_watch;
        let (stall, busy_timeout) = (self.opts.lock_stall, self.opts.busy_timeout);
        // The lock wait gives up when no other writer has committed for the
        // stall window since the longest-waiting batch started.
        let since = batches
            .iter()
            .map(|(flush, _)| flush.started)
            .min()
            .unwrap_or_else(std::time::Instant::now);

        let result = (|| -> Result<(), Stop> {
            // Every statement of the hot path is prepared once per connection.
            // The lock is waited for while other writers commit (`lockwait`).
            super::lockwait::begin_immediate(conn, watch, since, stall, busy_timeout)?;
            // Under the write lock: is this still the generation we opened?
            if let Some(g) = guard.as_mut() {
                match g.check(conn) {
                    Ok(crate::guard::Verdict::Intact) => {}
                    Ok(crate::guard::Verdict::Mismatch { evidence, detail }) => {
                        return Err(Stop::Guard(evidence, detail));
                    }
                    Err(e) => return Err(Stop::Probe(e)),
                }
            }
            for (k, (flush, plan)) in batches.iter().enumerate() {
                if k > 0 {
                    crate::failpoint::hit("group.between_batches");
                }
                if savepoints {
                    conn.prepare_cached("SAVEPOINT batch")?.execute([])?;
                }
                let state = pending.entry(flush.session.as_str().to_string()).or_default();
                let mut first_seq = None;
                let known = promised.get(flush.session.as_str()).copied();
                let written = write_batch(conn, flush, plan, state, known, holder, ttl_ms, &mut first_seq);
                if let Some(seq) = first_seq {
                    first_seqs.entry(flush.session.as_str().to_string()).or_insert(seq);
                }
                match written {
                    Ok(()) if savepoints => {
                        conn.prepare_cached("RELEASE batch")?.execute([])?;
                    }
                    Ok(()) => {}
                    // Fenced: the writer has no claim on any position of
                    // the session (a batch it diverts later, say after the
                    // guard tripped, carries no seq: replay appends it).
                    Err(Stop::LeaseLost(holder)) if savepoints => {
                        conn.prepare_cached("ROLLBACK TO batch")?.execute([])?;
                        conn.prepare_cached("RELEASE batch")?.execute([])?;
                        state.next_seq = None;
                        first_seqs.remove(flush.session.as_str());
                        fenced.push(flush.session.as_str().to_string());
                        each[k] = Some(WriteFailure::LeaseLost(holder));
                    }
                    Err(stop) if savepoints && !ends_transaction(conn, &stop) => {
                        conn.prepare_cached("ROLLBACK TO batch")?.execute([])?;
                        conn.prepare_cached("RELEASE batch")?.execute([])?;
                        // A batch that failed alone still tells a divert
                        // where its messages belong.
                        if let (None, Some(seq)) = (state.next_seq, first_seq) {
                            state.next_seq = Some(seq);
                        }
                        each[k] = Some(stop.into_failure(None));
                    }
                    Err(stop) => {
                        if matches!(stop, Stop::LeaseLost(_)) {
                            first_seqs.remove(flush.session.as_str());
                            fenced.push(flush.session.as_str().to_string());
                        }
                        return Err(stop);
                    }
                }
            }
            crate::failpoint::hit("flush.before_commit");
            // The full-text index is not written here: it catches up after
            // the commit (`super::index`), so no index failure can fail a turn.
            conn.prepare_cached("COMMIT")?.execute([]).map_err(Stop::Commit)?;
            crate::failpoint::hit("flush.after_commit");
            Ok(())
        })();

        match result {
            Ok(()) => {
                self.ledger.sessions.extend(pending);
                Written { group: None, each }
            }
            Err(stop) => {
                // Read the errno before anything else can overwrite it.
                let errno = observe::system_errno(conn);
                // FULL and IOERR at COMMIT have already rolled back; roll
                // back only what is still open, and ignore the follow-up.
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                // The transcript positions read under the lock still tell
                // the diverts where these messages belong; a fenced writer
                // has none.
                for (session, seq) in first_seqs {
                    let state = self.ledger.sessions.entry(session).or_default();
                    if state.next_seq.is_none() {
                        state.next_seq = Some(seq);
                    }
                }
                for session in fenced {
                    self.ledger.sessions.entry(session).or_default().next_seq = None;
                }
                Written {
                    group: Some(stop.into_failure(errno)),
                    each,
                }
            }
        }
    }
}

impl Stop {
    fn into_failure(self, errno: Option<i64>) -> WriteFailure {
        match self {
            Stop::Sqlite(error) => WriteFailure::Sqlite {
                error,
                errno,
                evidence: Vec::new(),
            },
            Stop::Commit(error) => WriteFailure::Sqlite {
                error,
                errno,
                evidence: vec![Evidence::CommitSent],
            },
            Stop::LeaseLost(holder) => WriteFailure::LeaseLost(holder),
            Stop::Guard(evidence, detail) => WriteFailure::Guard { evidence, detail },
            Stop::Probe(e) => WriteFailure::Probe(e),
        }
    }
}

/// Whether `stop` ends the whole transaction rather than one batch's
/// savepoint: the policy decides from what the host saw, and whether
/// SQLite still holds the transaction open.
fn ends_transaction(conn: &Connection, stop: &Stop) -> bool {
    let scope = turnsafe_policy::machine::failure_scope(&stop.observation(), !conn.is_autocommit());
    scope == turnsafe_policy::machine::Scope::Transaction
}

impl Stop {
    /// What the policy is shown of a stop inside the group's transaction:
    /// the SQLite error's codes, and the host's own evidence for the
    /// guard, COMMIT and a fenced lease. A failed guard probe is an I/O
    /// error, as the flush machine is told (`probe_error`).
    fn observation(&self) -> Observation {
        let (error, evidence) = match self {
            Stop::Sqlite(e) => (Some(e), Vec::new()),
            Stop::Commit(e) => (Some(e), vec![Evidence::CommitSent]),
            Stop::Guard(evidence, _) => (None, vec![*evidence]),
            Stop::LeaseLost(_) => (None, vec![Evidence::TurnLeaseLost]),
            Stop::Probe(_) => {
                return Observation {
                    code: Some(turnsafe_policy::codes::IOERR),
                    ..Observation::new(Operation::AppendBatch)
                };
            }
        };
        match error {
            Some(e) => observe::observation(Operation::AppendBatch, e, None, evidence, 1, 0, 0),
            None => Observation {
                evidence,
                ..Observation::new(Operation::AppendBatch)
            },
        }
    }
}

/// One batch's statements, inside the group's transaction: its seqs (after
/// any `promised` to diverted lines), the session's lease, and its rows.
/// `state` learns the lease and the next seq only when every statement
/// succeeded.
#[allow(clippy::too_many_arguments)]
fn write_batch(
    conn: &Connection,
    flush: &Flush<'_>,
    plan: &WritePlan,
    state: &mut Cursor,
    promised: Option<i64>,
    holder: &str,
    ttl_ms: i64,
    first_seq: &mut Option<i64>,
) -> Result<(), Stop> {
    if let Some(graph) = flush.graph {
        // A LangGraph batch: no transcript position, no turn lease.
        if plan.degrade_fts {
            super::schema::disable_fts(conn)?;
        }
        return Ok(super::graph::write(conn, graph, now_ms())?);
    }
    let mut seq = next_seq(conn, flush.session.as_str(), state.next_seq.max(promised))?;
    *first_seq = Some(seq);
    // Between this transaction's first read and its first write:
    // under BEGIN IMMEDIATE no other writer can commit here.
    crate::failpoint::hit("flush.after_read");
    if plan.degrade_fts {
        super::schema::disable_fts(conn)?;
    }
    let token = take_lease(conn, flush, state, plan.recreate_session, holder, ttl_ms)?;
    let created = now_ms();
    let mut insert = conn.prepare_cached(crate::rows::INSERT)?;
    for (m, uid) in flush.messages.iter().zip(&flush.uids) {
        match crate::rows::insert(&mut insert, flush.session.as_str(), uid, seq, m, created) {
            Ok(_) => seq += 1,
            Err(e) if is_unique_violation(&e) => {
                // Idempotent resend: an identical stored row counts
                // as committed; different content is a conflict.
                if !crate::rows::same_row(conn, flush.session.as_str(), uid, m)? {
                    return Err(Stop::Sqlite(e));
                }
            }
            Err(e) => return Err(Stop::Sqlite(e)),
        }
    }
    state.lease_token = Some(token);
    state.next_seq = Some(seq);
    Ok(())
}

/// Take, or confirm and renew, the session's turn lease; insert the session row at the
/// first batch (or when the policy said `recreate_session`).
fn take_lease(
    conn: &Connection,
    flush: &Flush<'_>,
    state: &Cursor,
    recreate: bool,
    holder: &str,
    ttl_ms: i64,
) -> Result<String, Stop> {
    let now = now_ms();
    let row: Option<(Option<String>, Option<i64>, Option<String>)> = conn
        .prepare_cached("SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = ?1")?
        .query_row([flush.session.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let ours = state.lease_token.clone();
    match (row, ours) {
        (Some((Some(t), expires, _)), Some(mine)) if t == mine => {
            // Still ours. Renew it once half its time has passed, not with
            // every batch: a renewal dirties the sessions page, and a batch
            // that skips it commits one page fewer. The lease then never has
            // less than half its time left after a batch.
            if expires.is_none_or(|e| e - now < ttl_ms - ttl_ms / 2) {
                conn.prepare_cached("UPDATE sessions SET lease_expires_ms = ?2 WHERE id = ?1")?
                    .execute(params![flush.session.as_str(), now + ttl_ms])?;
            }
            Ok(mine)
        }
        // We held the lease and someone else took it: fenced, whatever its
        // expiry. The copy names whoever holds it now.
        (Some((token, expires, stored)), Some(_)) => Err(Stop::LeaseLost(
            token.map(|_| Box::new(Proof::read(stored.as_deref()).holder(expires))),
        )),
        (Some((token, expires, stored)), None) => {
            // Another holder's lease ends on its expiry, or on the policy's
            // word that its holder is gone; never on this writer's guess.
            let expires = token.and(expires);
            if let Judged::Fenced(holder) = judge(
                flush.session.as_str(),
                stored.as_deref(),
                expires,
                now,
                ServerProbe::Unrecorded,
            ) {
                return Err(Stop::LeaseLost(Some(holder)));
            }
            let mine = super::mint_id();
            conn.execute(
                "UPDATE sessions SET lease_token = ?2, lease_holder = ?3, lease_expires_ms = ?4 WHERE id = ?1",
                params![
                    flush.session.as_str(),
                    mine,
                    Proof::mine(holder).to_text(),
                    now + ttl_ms
                ],
            )?;
            Ok(mine)
        }
        (None, ours) => {
            // A session row that vanished after our first batch is left
            // missing, so the insert fails with a foreign-key error and the
            // policy decides (`recreate_session`).
            if ours.is_some() && !recreate {
                return Ok(ours.unwrap_or_default());
            }
            let mine = ours.unwrap_or_else(super::mint_id);
            conn.execute(
                "INSERT INTO sessions(id, created_ms, lease_token, lease_holder, lease_expires_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![flush.session.as_str(), now, mine, Proof::mine(holder).to_text(), now + ttl_ms],
            )?;
            Ok(mine)
        }
    }
}

fn next_seq(conn: &Connection, session: &str, known: Option<i64>) -> rusqlite::Result<i64> {
    let stored: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = ?1")?
        .query_row([session], |r| r.get(0))?;
    Ok(known.map_or(stored, |k| k.max(stored)))
}

/// The (session, uid) uniqueness of `messages`, and nothing else.
fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, Some(msg))
        if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
            && msg.contains("messages.session_id, messages.uid"))
}
