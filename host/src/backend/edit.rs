//! Edits of a stored transcript outside the flush (`pop`, `clear`,
//! `restore`, `fork`, a compaction's replace, prune, delete, import), on
//! either engine.
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

use turnsafe_policy::machine::Failure;
use turnsafe_policy::machine::{EditEvent, EditMachine, EditStep};
use turnsafe_policy::{ActionKind, Cause, Operation};

use crate::ids::SessionId;

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

/// Run an edit as the policy's edit machine says
/// ([`turnsafe_policy::machine::EditMachine`]): attempt its transaction,
/// wait, write around a damaged index, or stop with the machine's cause.
/// This loop only performs the steps. `attempt` gets whether to write
/// around the index and the milliseconds since the edit began, for its
/// failure.
#[allow(clippy::result_large_err)]
pub fn run_edit<T>(
    edit: &'static str,
    session: &SessionId,
    sticky: Option<Cause>,
    mut attempt: impl FnMut(bool, u64) -> Result<T, Failure>,
) -> Result<T, EditError> {
    let started = Instant::now();
    let seed = crate::ids::seed();
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
