//! A history edit (`pop`, `clear`, `restore`, `fork`, a compaction's
//! `replace`, `prune`, `delete`, `import`) as a machine: the policy drives,
//! the host runs the edit's one transaction when asked and says how it
//! went.
//!
//! An edit has nothing to divert: its data stays where it is. So each
//! failed attempt is decided as for replay, whose fallback is to fail
//! closed: a cause the decision table retries is waited out on its plan,
//! a damaged search index is written around once, and every other cause
//! fails the edit, which then did not happen (the transaction rolled
//! back). A store quarantined by a sticky cause never touches its database
//! again: the edit fails before any attempt.
//!
//! ```text
//! let mut m = EditMachine::start(sticky);
//! loop {
//!     match m.poll() {
//!         EditStep::Attempt { degrade_fts } => match run_once(degrade_fts) {
//!             Ok(v) => { m.handle(EditEvent::Succeeded)?; result = v }
//!             Err(obs) => m.handle(EditEvent::Failed(obs))?,
//!         },
//!         EditStep::Wait { ms } => { sleep(ms); m.handle(EditEvent::Waited)? }
//!         EditStep::Done => break Ok(result),
//!         EditStep::Failed { cause, action, attempts } => break Err(..),
//!     }
//! }
//! ```

#[allow(unused_imports)]
use crate::prelude::*;

use super::ProtocolError;
use super::background::{self, Next};
use crate::model::{ActionKind, Cause, Observation, Operation};

/// The next thing the host does for the edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditStep {
    /// Run the edit's transaction once; with `degrade_fts`, write around
    /// the search index (marking it for rebuild in the same transaction).
    /// Answer [`EditEvent::Succeeded`] or [`EditEvent::Failed`].
    Attempt { degrade_fts: bool },
    /// Wait this long; answer [`EditEvent::Waited`].
    Wait { ms: u64 },
    /// The edit happened.
    Done,
    /// The edit did not happen (see [`crate::explain_edit`] for its copy).
    Failed {
        cause: Cause,
        /// What the decision table named: `fail_closed`, or what there
        /// was no way to do.
        action: ActionKind,
        attempts: u32,
    },
}

/// What the host reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditEvent {
    /// The transaction committed.
    Succeeded,
    /// The attempt failed; the transaction rolled back. The machine sets
    /// the operation and the attempt number.
    Failed(Observation),
    /// The wait asked for is over.
    Waited,
}

/// One edit.
#[derive(Debug, Clone)]
pub struct EditMachine {
    step: EditStep,
    attempts: u32,
    degraded: bool,
    /// An attempt failed at or after its COMMIT's write.
    written: bool,
}

impl EditMachine {
    /// Begin an edit on a store whose handle carries `sticky` (if any).
    pub fn start(sticky: Option<Cause>) -> EditMachine {
        let step = match sticky.map(background::refused) {
            Some(Next::Stop { cause, action }) => EditStep::Failed {
                cause,
                action,
                attempts: 0,
            },
            _ => EditStep::Attempt { degrade_fts: false },
        };
        EditMachine {
            step,
            attempts: 0,
            degraded: false,
            written: false,
        }
    }

    /// The step the machine waits on; the same until an event answers it.
    pub fn poll(&self) -> EditStep {
        self.step
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether an attempt failed at or after its COMMIT's write
    /// ([`crate::possibly_written`]): a failed edit then is not in effect
    /// now, but may be once the database is next opened, and its copy
    /// ([`crate::explain_edit`]) must not say nothing changed.
    pub fn possibly_written(&self) -> bool {
        self.written
    }

    /// End the edit as failed with cause `unknown`, whatever step it was
    /// on (a failure stays as it is): for a host that cannot go on (a bug
    /// of its own), so that it still fails closed with the machine's
    /// words. Returns the step.
    pub fn abandon(&mut self) -> EditStep {
        if !matches!(self.step, EditStep::Failed { .. }) {
            self.step = EditStep::Failed {
                cause: Cause::Unknown,
                action: ActionKind::FailClosed,
                attempts: self.attempts,
            };
        }
        self.step
    }

    /// Feed back the result of the step just performed. An event that does
    /// not answer it is refused and changes nothing.
    pub fn handle(&mut self, event: EditEvent) -> Result<(), ProtocolError> {
        self.step = match (self.step, event) {
            (EditStep::Attempt { .. }, EditEvent::Succeeded) => {
                self.attempts += 1;
                EditStep::Done
            }
            (EditStep::Attempt { .. }, EditEvent::Failed(mut obs)) => {
                self.attempts += 1;
                self.written |= crate::written::possibly_written(&obs, crate::classify::classify(&obs).cause);
                obs.operation = Operation::Replay;
                obs.attempt = self.attempts;
                match background::after_failure(&obs, self.degraded) {
                    Next::Wait { ms } => EditStep::Wait { ms },
                    Next::DegradeFts => {
                        self.degraded = true;
                        EditStep::Attempt { degrade_fts: true }
                    }
                    Next::Stop { cause, action } => EditStep::Failed {
                        cause,
                        action,
                        attempts: self.attempts,
                    },
                }
            }
            (EditStep::Wait { .. }, EditEvent::Waited) => EditStep::Attempt {
                degrade_fts: self.degraded,
            },
            (step, event) => {
                return Err(ProtocolError::Unexpected {
                    step: step_label(step),
                    event: event_label(&event),
                });
            }
        };
        Ok(())
    }
}

fn step_label(step: EditStep) -> &'static str {
    match step {
        EditStep::Attempt { .. } => "attempt",
        EditStep::Wait { .. } => "wait",
        EditStep::Done => "done",
        EditStep::Failed { .. } => "failed",
    }
}

fn event_label(event: &EditEvent) -> &'static str {
    match event {
        EditEvent::Succeeded => "succeeded",
        EditEvent::Failed(_) => "failed",
        EditEvent::Waited => "waited",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes;
    use crate::model::{Engine, Evidence};

    fn obs(code: i64, evidence: Vec<Evidence>) -> Observation {
        Observation {
            code: Some(code),
            evidence,
            engine: Engine::Sqlite,
            ..Observation::new(Operation::AppendBatch)
        }
    }

    #[test]
    fn a_sticky_store_fails_before_any_attempt() {
        let m = EditMachine::start(Some(Cause::Replaced));
        assert_eq!(
            m.poll(),
            EditStep::Failed {
                cause: Cause::Replaced,
                action: ActionKind::FailClosed,
                attempts: 0
            }
        );
    }

    #[test]
    fn a_lock_is_waited_out_then_tried_again() {
        let mut m = EditMachine::start(None);
        assert_eq!(m.poll(), EditStep::Attempt { degrade_fts: false });
        m.handle(EditEvent::Failed(obs(codes::BUSY, vec![]))).unwrap();
        assert!(matches!(m.poll(), EditStep::Wait { ms } if ms > 0));
        assert!(m.handle(EditEvent::Succeeded).is_err(), "a wait is answered by waited");
        m.handle(EditEvent::Waited).unwrap();
        assert_eq!(m.poll(), EditStep::Attempt { degrade_fts: false });
        m.handle(EditEvent::Succeeded).unwrap();
        assert_eq!(m.poll(), EditStep::Done);
        assert_eq!(m.attempts(), 2);
    }

    #[test]
    fn a_damaged_index_is_written_around_once_then_the_edit_fails() {
        let mut m = EditMachine::start(None);
        m.handle(EditEvent::Failed(obs(codes::CORRUPT, vec![Evidence::FtsScope])))
            .unwrap();
        assert_eq!(m.poll(), EditStep::Attempt { degrade_fts: true });
        m.handle(EditEvent::Failed(obs(codes::CORRUPT, vec![Evidence::FtsScope])))
            .unwrap();
        assert!(matches!(
            m.poll(),
            EditStep::Failed {
                cause: Cause::FtsIndex,
                attempts: 2,
                ..
            }
        ));
    }

    #[test]
    fn an_abandoned_edit_fails_closed_and_a_failure_stays() {
        let mut m = EditMachine::start(None);
        m.handle(EditEvent::Succeeded).unwrap();
        assert!(matches!(
            m.abandon(),
            EditStep::Failed {
                cause: Cause::Unknown,
                action: ActionKind::FailClosed,
                attempts: 1
            }
        ));
        let mut m = EditMachine::start(Some(Cause::Corrupt));
        assert!(matches!(
            m.abandon(),
            EditStep::Failed {
                cause: Cause::Corrupt,
                ..
            }
        ));
    }

    #[test]
    fn any_other_cause_fails_the_edit_at_once() {
        let mut m = EditMachine::start(None);
        m.handle(EditEvent::Failed(obs(codes::READONLY, vec![]))).unwrap();
        assert!(matches!(
            m.poll(),
            EditStep::Failed {
                cause: Cause::Disk,
                attempts: 1,
                ..
            }
        ));
        assert!(m.handle(EditEvent::Waited).is_err(), "a finished edit takes no event");
    }

    /// A failed COMMIT's sync: the edit fails with its cause, and the
    /// machine says it may have been written. A lock COMMIT never got, or
    /// a failure before COMMIT, wrote nothing.
    #[test]
    fn a_commit_that_failed_after_its_write_is_possibly_written() {
        let commit = |code: i64| Observation {
            extended_code: Some(code),
            ..obs(codes::IOERR, vec![Evidence::CommitSent])
        };
        let mut m = EditMachine::start(None);
        m.handle(EditEvent::Failed(commit(codes::BUSY))).unwrap();
        assert!(!m.possibly_written());
        m.handle(EditEvent::Waited).unwrap();
        m.handle(EditEvent::Failed(commit(1034))).unwrap();
        assert!(matches!(m.poll(), EditStep::Failed { cause: Cause::Disk, .. }));
        assert!(m.possibly_written());

        let mut m = EditMachine::start(None);
        m.handle(EditEvent::Failed(obs(codes::IOERR, vec![]))).unwrap();
        assert!(matches!(m.poll(), EditStep::Failed { cause: Cause::Disk, .. }));
        assert!(!m.possibly_written());
    }

    #[test]
    fn a_lock_held_for_ever_ends_the_edit() {
        let mut m = EditMachine::start(None);
        for elapsed in 0..10_000u64 {
            match m.poll() {
                EditStep::Attempt { .. } => {
                    let mut o = obs(codes::BUSY, vec![]);
                    o.elapsed_ms = elapsed * 100;
                    m.handle(EditEvent::Failed(o)).unwrap();
                }
                EditStep::Wait { .. } => m.handle(EditEvent::Waited).unwrap(),
                EditStep::Failed { cause, .. } => {
                    assert_eq!(cause, Cause::Locked);
                    return;
                }
                EditStep::Done => panic!("never succeeded"),
            }
        }
        panic!("the machine kept retrying a lock for ever");
    }
}
