//! One attempt at writing a batch: a single `BEGIN IMMEDIATE` transaction.
//! Nothing is read before the write lock is held, so a stale snapshot
//! (`SQLITE_BUSY_SNAPSHOT`) cannot arise.

use rusqlite::{Connection, OptionalExtension, params};
use turnsafe_policy::Evidence;
use turnsafe_policy::machine::WritePlan;

use super::{Flush, SessionState, SessionStore, now_ms};
use crate::observe;

pub(super) enum WriteFailure {
    /// The first SQLite error of the attempt, and the errno SQLite saw.
    Sqlite {
        error: rusqlite::Error,
        errno: Option<i64>,
        evidence: Vec<Evidence>,
    },
    /// Another writer holds this session's turn lease.
    LeaseLost,
    /// The guard found the generation changed under the handle.
    Guard { evidence: Evidence, detail: String },
    /// A guard probe itself failed.
    Probe(crate::guard::ProbeError),
}

enum Stop {
    Guard(Evidence, String),
    Probe(crate::guard::ProbeError),
    Sqlite(rusqlite::Error),
    LeaseLost,
}

impl From<rusqlite::Error> for Stop {
    fn from(e: rusqlite::Error) -> Self {
        Stop::Sqlite(e)
    }
}

impl SessionStore {
    pub(super) fn write(&mut self, flush: &Flush<'_>, plan: &WritePlan) -> Result<(), WriteFailure> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(WriteFailure::Sqlite {
                error: rusqlite::Error::InvalidQuery,
                errno: None,
                evidence: Vec::new(),
            });
        };
        // A handle's first write to a session learns which seqs diverted
        // lines already hold, so replay can put them back in place.
        let promised = match self.sessions.get(flush.session.as_str()).and_then(|s| s.next_seq) {
            Some(_) => None,
            None => self.divert_max_seq(flush.session.as_str()).map(|m| m + 1),
        };
        let state = self.sessions.entry(flush.session.as_str().to_string()).or_default();
        if state.next_seq.is_none() {
            state.next_seq = promised;
        }
        let guard = &mut self.guard;
        let ttl_ms = self.opts.lease_ttl.as_millis() as i64;
        let holder = self.opts.holder.clone();

        let mut first_seq = None;
        let result = (|| -> Result<(String, i64), Stop> {
            // Every statement of the hot path is prepared once per connection.
            conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
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
            let mut seq = next_seq(conn, flush.session.as_str(), state.next_seq)?;
            first_seq = Some(seq);
            // Between this transaction's first read and its first write:
            // under BEGIN IMMEDIATE no other writer can commit here.
            crate::failpoint::hit("flush.after_read");
            if plan.degrade_fts {
                super::schema::disable_fts(conn)?;
            }
            let token = take_lease(conn, flush, state, plan.recreate_session, &holder, ttl_ms)?;
            let created = now_ms();
            let mut insert = conn.prepare_cached(super::rows::INSERT)?;
            for (m, uid) in flush.messages.iter().zip(&flush.uids) {
                match super::rows::insert(&mut insert, flush.session.as_str(), uid, seq, m, created) {
                    Ok(_) => seq += 1,
                    Err(e) if is_unique_violation(&e) => {
                        // Idempotent resend: an identical stored row counts
                        // as committed; different content is a conflict.
                        if !super::rows::same_row(conn, flush.session.as_str(), uid, m)? {
                            return Err(Stop::Sqlite(e));
                        }
                    }
                    Err(e) => return Err(Stop::Sqlite(e)),
                }
            }
            crate::failpoint::hit("flush.before_commit");
            // The full-text index is not written here: it catches up after
            // the commit (`super::index`), so no index failure can fail a turn.
            conn.prepare_cached("COMMIT")?.execute([])?;
            crate::failpoint::hit("flush.after_commit");
            Ok((token, seq))
        })();

        match result {
            Ok((token, seq)) => {
                state.lease_token = Some(token);
                state.next_seq = Some(seq);
                Ok(())
            }
            Err(stop) => {
                // Read the errno before anything else can overwrite it.
                let errno = observe::system_errno(conn);
                // The transcript position read under the lock still tells a
                // divert where these messages belong.
                if state.next_seq.is_none() {
                    state.next_seq = first_seq;
                }
                // FULL and IOERR at COMMIT have already rolled back; roll
                // back only what is still open, and ignore the follow-up.
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                Err(match stop {
                    Stop::Sqlite(error) => WriteFailure::Sqlite {
                        error,
                        errno,
                        evidence: Vec::new(),
                    },
                    Stop::LeaseLost => WriteFailure::LeaseLost,
                    Stop::Guard(evidence, detail) => WriteFailure::Guard { evidence, detail },
                    Stop::Probe(e) => WriteFailure::Probe(e),
                })
            }
        }
    }
}

/// Take, or confirm and renew, the session's turn lease; insert the session row at the
/// first batch (or when the policy said `recreate_session`).
fn take_lease(
    conn: &Connection,
    flush: &Flush<'_>,
    state: &SessionState,
    recreate: bool,
    holder: &str,
    ttl_ms: i64,
) -> Result<String, Stop> {
    let now = now_ms();
    let row: Option<(Option<String>, Option<i64>)> = conn
        .prepare_cached("SELECT lease_token, lease_expires_ms FROM sessions WHERE id = ?1")?
        .query_row([flush.session.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let ours = state.lease_token.clone();
    match (row, ours) {
        (Some((Some(t), expires)), Some(mine)) if t == mine => {
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
        // We held the lease and someone else took it: fenced, whatever its expiry.
        (Some(_), Some(_)) => Err(Stop::LeaseLost),
        (Some((token, expires)), None) => {
            let live = token.is_some() && expires.is_some_and(|e| e > now);
            if live {
                return Err(Stop::LeaseLost);
            }
            let mine = super::mint_id();
            conn.execute(
                "UPDATE sessions SET lease_token = ?2, lease_holder = ?3, lease_expires_ms = ?4 WHERE id = ?1",
                params![flush.session.as_str(), mine, holder, now + ttl_ms],
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
                params![flush.session.as_str(), now, mine, holder, now + ttl_ms],
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
