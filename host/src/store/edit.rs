//! Edits of a stored transcript outside the flush (`pop`, `clear`,
//! `restore`, `fork`, a compaction's replace: [`super::history`]).
//!
//! They are writes, so they follow the policy: each attempt is one
//! `BEGIN IMMEDIATE` transaction that first checks the generation guard
//! and the session's turn lease; a failure becomes an observation and the
//! policy decides. There is nothing to divert (the data stays where it
//! is), so the policy is asked as for replay, whose fallback is to fail
//! closed: `locked` is retried on its plan, a degraded search index is
//! written around once, and every other cause fails the edit with that
//! cause. A sticky handle refuses without touching the database.

use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};
use turnsafe_policy::machine::Failure;
use turnsafe_policy::machine::background::{self, Next};
use turnsafe_policy::{ActionKind, Cause, Evidence, Operation};

use super::{SessionId, SessionStore, now_ms, random_u64, schema};
use crate::guard::Verdict;
use crate::observe;

/// An edit that did not happen: nothing was removed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{edit} of session {session} failed: session_persistence_failed:{}: {message}", .cause.label())]
pub struct EditError {
    /// `pop` or `clear`.
    pub edit: &'static str,
    pub session: String,
    /// The policy's cause.
    pub cause: Cause,
    /// The last action the policy asked for (`fail_closed`, or `divert` when
    /// the open failed and there was nothing to divert).
    pub action: ActionKind,
    pub message: String,
    /// Attempts made against the database.
    pub attempts: u32,
}

impl EditError {
    /// The policy's copy: what failed, and that nothing changed (or, after
    /// a lost COMMIT, that nobody can tell).
    pub fn copy(&self) -> turnsafe_policy::EditCopy {
        turnsafe_policy::explain_edit(self.edit, &self.session, self.cause, self.attempts)
    }
}

enum Stop {
    Sqlite(rusqlite::Error, Vec<Evidence>),
    Evidence(Evidence, String),
}

impl From<rusqlite::Error> for Stop {
    fn from(e: rusqlite::Error) -> Self {
        Stop::Sqlite(e, Vec::new())
    }
}

/// Ask the policy about each failed attempt of an edit, as for replay,
/// whose fallback is to fail closed: `locked` is retried on its plan, a
/// degraded search index is written around once (`attempt` is then called
/// with `true`), and every other cause fails the edit with that cause. A
/// sticky handle refuses without an attempt. `attempt` gets the
/// milliseconds since the edit began, for its failure.
#[allow(clippy::result_large_err)]
pub(crate) fn run_edit<T>(
    edit: &'static str,
    session: &SessionId,
    sticky: Option<Cause>,
    mut attempt: impl FnMut(bool, u64) -> Result<T, Failure>,
) -> Result<T, EditError> {
    let started = Instant::now();
    let seed = random_u64();
    let fail = |cause: Cause, action: ActionKind, message: String, attempts: u32| EditError {
        edit,
        session: session.as_str().to_string(),
        cause,
        action,
        message,
        attempts,
    };
    if let Some(sticky) = sticky
        && let Next::Stop { cause, action } = background::refused(sticky)
    {
        return Err(fail(
            cause,
            action,
            "the store refuses to touch its database until an operator acts".into(),
            0,
        ));
    }
    let mut degrade_fts = false;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let f = match attempt(degrade_fts, elapsed_ms) {
            Ok(v) => return Ok(v),
            Err(f) => f,
        };
        let mut evidence = f.evidence;
        evidence.sort();
        evidence.dedup();
        let obs = turnsafe_policy::Observation {
            operation: Operation::Replay,
            engine: f.engine,
            sqlstate: f.sqlstate,
            code: f.code,
            extended_code: f.extended_code,
            message: f.message,
            errno: f.errno,
            evidence,
            attempt: attempts,
            elapsed_ms: f.elapsed_ms,
            seed,
        };
        let next = background::after_failure(&obs, degrade_fts);
        tracing::info!(
            session = session.as_str(),
            edit,
            code = ?obs.extended_code.or(obs.code),
            sqlstate = ?obs.sqlstate,
            next = ?next,
            "edit attempt failed"
        );
        match next {
            Next::Wait { ms } => std::thread::sleep(Duration::from_millis(ms)),
            Next::DegradeFts => degrade_fts = true,
            Next::Stop { cause, action } => return Err(fail(cause, action, obs.message, attempts)),
        }
    }
}

impl SessionStore {
    // A `Failure` is the policy's own input, handed to it as it is; a
    // failed edit is rare, so its size on the error path costs nothing.
    #[allow(clippy::result_large_err)]
    pub(super) fn edit<T>(
        &mut self,
        edit: &'static str,
        session: &SessionId,
        mut f: impl FnMut(&Connection, &str) -> rusqlite::Result<T>,
    ) -> Result<T, EditError> {
        let sticky = self.ledger.handle.sticky;
        run_edit(edit, session, sticky, |degrade_fts, elapsed_ms| {
            // The handle opens its database once; a failed open is tried once per edit.
            self.open_failure = None;
            let (stop, errno) = match self.ensure_open() {
                Err(open) => {
                    let open = *open;
                    self.quarantined = open.conn;
                    (Stop::Sqlite(open.error, Vec::new()), open.errno)
                }
                Ok(()) => match self.edit_once(session, degrade_fts, &mut f) {
                    Ok(v) => return Ok(v),
                    Err(stop) => (stop, self.conn.as_ref().and_then(observe::system_errno)),
                },
            };
            Err(match stop {
                Stop::Sqlite(e, evidence) => super::failure_of(&e, errno, evidence, elapsed_ms),
                Stop::Evidence(evidence, detail) => Failure {
                    message: detail,
                    evidence: vec![evidence],
                    elapsed_ms,
                    ..Failure::default()
                },
            })
        })
    }

    /// One transaction: guard, lease, the edit, COMMIT.
    fn edit_once<T>(
        &mut self,
        session: &SessionId,
        degrade_fts: bool,
        f: &mut impl FnMut(&Connection, &str) -> rusqlite::Result<T>,
    ) -> Result<T, Stop> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(Stop::Sqlite(rusqlite::Error::InvalidQuery, Vec::new()));
        };
        let ours = self
            .ledger
            .sessions
            .get(session.as_str())
            .and_then(|s| s.lease_token.clone());
        let guard = &mut self.guard;
        let result = (|| -> Result<T, Stop> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            if let Some(g) = guard.as_mut() {
                match g.check(conn) {
                    Ok(Verdict::Intact) => {}
                    Ok(Verdict::Mismatch { evidence, detail }) => return Err(Stop::Evidence(evidence, detail)),
                    Err(e) => {
                        return Err(Stop::Sqlite(
                            rusqlite::Error::SqliteFailure(
                                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                                Some(format!("turnsafe {e}")),
                            ),
                            Vec::new(),
                        ));
                    }
                }
            }
            // Another writer's live turn lease fences the session.
            let lease: Option<(Option<String>, Option<i64>)> = conn
                .query_row(
                    "SELECT lease_token, lease_expires_ms FROM sessions WHERE id = ?1",
                    [session.as_str()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((Some(token), Some(expires))) = lease
                && expires > now_ms()
                && ours.as_deref() != Some(token.as_str())
            {
                return Err(Stop::Evidence(
                    Evidence::TurnLeaseLost,
                    "the session's turn lease is held by another writer".into(),
                ));
            }
            if degrade_fts {
                // The index's trigger failed: mark it for rebuild, so the
                // trigger leaves it alone and search stops trusting it.
                schema::disable_fts(conn)?;
            }
            let v = f(conn, session.as_str())?;
            crate::failpoint::hit("edit.before_commit");
            conn.execute_batch("COMMIT")?;
            crate::failpoint::hit("edit.after_commit");
            Ok(v)
        })();
        if result.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        result
    }
}
