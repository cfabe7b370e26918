//! Edits of a stored transcript outside the flush (`pop`, `clear`,
//! `restore`, `fork`, a compaction's replace: [`super::history`]).
//!
//! They are writes, so they follow the policy: each attempt is one
//! `BEGIN IMMEDIATE` transaction that first checks the generation guard
//! and the session's turn lease; a failure becomes an observation, and
//! the policy's edit machine (`turnsafe_policy::machine::EditMachine`)
//! says what comes next: `locked` is retried on its plan, a degraded
//! search index is written around once, and every other cause fails the
//! edit with that cause. A sticky handle refuses without touching the
//! database. [`run_edit`] only performs the machine's steps, for both
//! engines.

use std::time::{Duration, Instant};

use crate::lease_proof::{Judged, judge};
use rusqlite::{Connection, OptionalExtension};
use turnsafe_policy::machine::Failure;
use turnsafe_policy::machine::{EditEvent, EditMachine, EditStep};
use turnsafe_policy::{ActionKind, Cause, Evidence, Operation};

use super::{SessionId, SessionStore, now_ms, random_u64, schema};
use crate::guard::Verdict;
use crate::observe;

/// An edit that did not happen: nothing was removed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{edit} of session {session} failed: session_persistence_failed:{}: {message}", .cause.label())]
pub struct EditError {
    /// The edit's name: `pop`, `clear`, `restore`, `fork`, `replace`,
    /// `prune`, `delete` or `import`.
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
    /// An attempt failed at or after its COMMIT's write: the edit is not in
    /// effect now, but the next open of the database may bring it back.
    pub possibly_written: bool,
}

impl EditError {
    /// The policy's copy: what failed, and that nothing changed (or, after
    /// a lost COMMIT or one that failed after its write, what is known).
    pub fn copy(&self) -> turnsafe_policy::EditCopy {
        turnsafe_policy::explain_edit(
            self.edit,
            &self.session,
            self.cause,
            self.attempts,
            self.possibly_written,
        )
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

/// Run an edit as the policy's edit machine says
/// ([`turnsafe_policy::machine::EditMachine`]): attempt its transaction,
/// wait, write around a damaged index, or stop with the machine's cause.
/// This loop only performs the steps. `attempt` gets whether to write
/// around the index and the milliseconds since the edit began, for its
/// failure.
#[allow(clippy::result_large_err)]
pub(crate) fn run_edit<T>(
    edit: &'static str,
    session: &SessionId,
    sticky: Option<Cause>,
    mut attempt: impl FnMut(bool, u64) -> Result<T, Failure>,
) -> Result<T, EditError> {
    let started = Instant::now();
    let seed = random_u64();
    let mut machine = EditMachine::start(sticky);
    let mut done = None;
    let mut message = String::from("the store refuses to touch its database until an operator acts");
    loop {
        let event = match machine.poll() {
            EditStep::Attempt { degrade_fts } => {
                let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                match attempt(degrade_fts, elapsed_ms) {
                    Ok(v) => {
                        done = Some(v);
                        EditEvent::Succeeded
                    }
                    Err(f) => {
                        let mut evidence = f.evidence;
                        evidence.sort();
                        evidence.dedup();
                        let obs = turnsafe_policy::Observation {
                            engine: f.engine,
                            sqlstate: f.sqlstate,
                            code: f.code,
                            extended_code: f.extended_code,
                            message: f.message,
                            errno: f.errno,
                            evidence,
                            elapsed_ms: f.elapsed_ms,
                            seed,
                            ..turnsafe_policy::Observation::new(Operation::Replay)
                        };
                        tracing::info!(
                            session = session.as_str(),
                            edit,
                            code = ?obs.extended_code.or(obs.code),
                            sqlstate = ?obs.sqlstate,
                            "edit attempt failed"
                        );
                        message.clone_from(&obs.message);
                        EditEvent::Failed(obs)
                    }
                }
            }
            EditStep::Wait { ms } => {
                std::thread::sleep(Duration::from_millis(ms));
                EditEvent::Waited
            }
            EditStep::Done => match done.take() {
                Some(v) => return Ok(v),
                None => {
                    message = "the edit machine finished without a result".into();
                    machine.abandon();
                    continue;
                }
            },
            EditStep::Failed {
                cause,
                action,
                attempts,
            } => {
                return Err(EditError {
                    edit,
                    session: session.as_str().to_string(),
                    cause,
                    action,
                    message,
                    attempts,
                    possibly_written: machine.possibly_written(),
                });
            }
        };
        if let Err(e) = machine.handle(event) {
            // The loop answers exactly the step it was given: this is a
            // bug, told as such rather than retried.
            message = e.message();
            machine.abandon();
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
            // Its lease ends on its expiry, or on the policy's word that
            // its holder is gone.
            let lease: Option<(Option<String>, Option<i64>, Option<String>)> = conn
                .query_row(
                    "SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = ?1",
                    [session.as_str()],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            if let Some((Some(token), expires, stored)) = lease
                && ours.as_deref() != Some(token.as_str())
                && let Judged::Fenced(_) = judge(
                    session.as_str(),
                    stored.as_deref(),
                    expires,
                    now_ms(),
                    turnsafe_policy::ServerProbe::Unrecorded,
                )
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
            // A failed COMMIT may have written the edit (`commit_sent`):
            // the policy tells from its code.
            conn.execute_batch("COMMIT")
                .map_err(|e| Stop::Sqlite(e, vec![Evidence::CommitSent]))?;
            crate::failpoint::hit("edit.after_commit");
            Ok(v)
        })();
        if result.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        result
    }
}
