//! The flush machine: one batch, from the first open or write to its
//! outcome. Every decision it takes is the decision table's
//! ([`crate::decide`]); what it adds is the order of effects.

#[allow(unused_imports)]
use crate::prelude::*;
use serde::{Deserialize, Serialize};

use super::report::{self, CaptureReport, DivertErrorReport, Ending, FlushReport};
use super::start::FlushStart;
use super::{Event, Failure, HandleState, ProtocolError, Step, WritePlan};
use crate::model::{ActionKind, Cause, Observation, Operation, TlsFailure};

/// Where the flush stands: the step it waits on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Phase {
    Opening,
    Writing,
    /// Looking the batch's uids up after a COMMIT whose answer was lost.
    Resolving,
    Waiting {
        ms: u64,
        then: Resume,
    },
    Capturing {
        then: Terminal,
    },
    Diverting {
        cause: Cause,
    },
    Done(Ending),
}

/// What runs again after a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Resume {
    Open,
    Write,
}

/// What comes after a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Terminal {
    Divert(Cause),
    HandBack,
}

/// One batch's protocol. Hosts normally drive it through
/// [`super::Handle`], which owns the [`HandleState`] it reads and changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlushMachine {
    start: FlushStart,
    phase: Phase,
    plan: WritePlan,
    /// Writes tried against the database, and opens that failed.
    attempts: u32,
    /// The decision that shaped the outcome, and the operation it was for.
    last: Option<(Cause, Operation)>,
    /// The action the outcome reports (a remedy the host cannot run is
    /// reported as the divert it became).
    action: Option<ActionKind>,
    /// The errno of the failure the outcome rests on (it shapes the copy).
    errno: Option<i64>,
    /// The TLS reason the failure the outcome rests on names (it shapes
    /// the copy of `disk`).
    tls: Option<TlsFailure>,
    /// The holder of the lease that fenced the write (it shapes the copy
    /// of `turn_lease`).
    lease: Option<Box<crate::lease::LeaseHolder>>,
    /// The capture this flush made, for the outcome.
    capture: Option<CaptureReport>,
    /// A COMMIT's answer was lost and its batch is not looked up yet: the
    /// next open resolves it, and a divert keeps the cause `outcome_unknown`.
    resolving: bool,
    /// An attempt failed at or after its COMMIT's write
    /// ([`crate::possibly_written`]): the batch is not in the store now, but
    /// may be when it is next opened, and the copy says so.
    written: bool,
}

impl FlushMachine {
    /// A flush of `start`'s batch on a handle in `handle`'s state.
    pub fn new(start: FlushStart, handle: &HandleState) -> FlushMachine {
        let pending = start.pending_capture.as_ref().map(|p| p.cause);
        let phase = match (handle.sticky, pending, handle.open) {
            (Some(cause), _, _) => Phase::Diverting { cause },
            (None, Some(cause), _) => Phase::Diverting { cause },
            (None, None, true) => Phase::Writing,
            (None, None, false) => Phase::Opening,
        };
        let action = handle.sticky.or(pending).map(|_| ActionKind::Divert);
        // A sticky handle's cause is the handle's; a pending capture's is
        // this batch's own (the handle goes on writing other sessions).
        let last = match (handle.sticky, pending) {
            (None, Some(cause)) => Some((cause, Operation::AppendBatch)),
            _ => None,
        };
        FlushMachine {
            start,
            phase,
            plan: WritePlan::default(),
            attempts: 0,
            last,
            action,
            errno: None,
            tls: None,
            lease: None,
            capture: None,
            resolving: false,
            written: false,
        }
    }

    /// The batch this flush was started with.
    pub(super) fn batch(&self) -> &FlushStart {
        &self.start
    }

    /// The batch this flush was started with.
    pub fn into_start(self) -> FlushStart {
        self.start
    }

    /// End this flush, whatever it waits on, handing the batch back (see
    /// [`super::Handle::abandon`]).
    pub fn abandon(self) -> FlushReport {
        super::abandoned(self.start)
    }

    /// The step this flush waits on.
    pub fn poll(&self, handle: &HandleState) -> Step {
        match self.effect() {
            Some(step) => step,
            None => Step::Done(Box::new(self.clone().into_report(handle))),
        }
    }

    /// The effect this flush waits on; `None` once it is done.
    pub(super) fn effect(&self) -> Option<Step> {
        Some(match &self.phase {
            Phase::Opening => Step::Open,
            Phase::Writing => Step::Write(self.plan),
            Phase::Resolving => Step::Resolve,
            Phase::Waiting { ms, .. } => Step::Wait { ms: *ms },
            Phase::Capturing { .. } => Step::Capture,
            Phase::Diverting { cause } => Step::Divert { cause: *cause },
            Phase::Done(_) => return None,
        })
    }

    /// Take the result of the step this flush waits on.
    pub fn handle(&mut self, handle: &mut HandleState, event: Event) -> Result<(), ProtocolError> {
        let next = match (&self.phase, event) {
            (Phase::Opening, Event::Opened) => {
                handle.open = true;
                if self.resolving {
                    Phase::Resolving
                } else {
                    Phase::Writing
                }
            }
            (Phase::Opening, Event::Failed(f)) => self.failed(handle, Operation::Open, f),
            (Phase::Writing, Event::Committed) => {
                self.attempts = self.attempts.saturating_add(1);
                Phase::Done(Ending::Committed)
            }
            (Phase::Writing, Event::Failed(f)) => self.failed(handle, Operation::AppendBatch, f),
            // Every uid stored: the lost COMMIT took effect.
            (Phase::Resolving, Event::Resolved { all_stored: true }) => Phase::Done(Ending::Committed),
            // Not all: the batch is written again, as any write (a stored
            // identical row counts as committed).
            (Phase::Resolving, Event::Resolved { all_stored: false }) => {
                self.resolving = false;
                Phase::Writing
            }
            (Phase::Resolving, Event::Failed(f)) => self.failed(handle, Operation::AppendBatch, f),
            (Phase::Waiting { then, .. }, Event::Waited { .. }) => match then {
                Resume::Open => Phase::Opening,
                Resume::Write => Phase::Writing,
            },
            (Phase::Capturing { then }, Event::Captured(receipt)) => {
                let then = *then;
                self.captured(handle, CaptureReport::Captured(receipt));
                phase_after(then)
            }
            (Phase::Capturing { then }, Event::CaptureFailed { failure, error }) => {
                let then = *then;
                self.captured(handle, CaptureReport::Failed { failure, error });
                phase_after(then)
            }
            (Phase::Diverting { .. }, Event::Diverted(receipt)) => Phase::Done(Ending::Diverted(receipt)),
            (
                Phase::Diverting { .. },
                Event::DivertFailed {
                    failure,
                    message,
                    residue,
                },
            ) => Phase::Done(Ending::DivertFailed {
                error: DivertErrorReport::new(failure, message),
                residue,
            }),
            (phase, event) => {
                return Err(ProtocolError::Unexpected {
                    step: phase_label(phase),
                    event: event.label(),
                });
            }
        };
        self.phase = next;
        Ok(())
    }

    fn captured(&mut self, handle: &mut HandleState, report: CaptureReport) {
        handle.capture = Some(report.clone());
        self.capture = Some(report);
    }

    /// Ask the decision table about a failed open or write, and move on.
    fn failed(&mut self, handle: &mut HandleState, operation: Operation, f: Failure) -> Phase {
        self.attempts = self.attempts.saturating_add(1);
        let obs = Observation {
            attempt: self.attempts,
            seed: self.start.seed,
            ..f.into_observation(operation)
        };
        let d = crate::decide::decide(&obs);
        handle.engine = obs.engine;
        // Once any attempt may have written the batch, the outcome cannot
        // say it was not written, whatever a later attempt meets.
        self.written |= crate::written::possibly_written(&obs, d.classification.cause);
        self.last = Some((d.classification.cause, operation));
        self.errno = obs.errno;
        self.tls = TlsFailure::of(&obs);
        self.lease = obs.lease.filter(|_| d.classification.cause == Cause::TurnLease);
        self.action = Some(d.action);
        if d.sticky {
            // Quarantined: nothing opens or writes this database again.
            handle.sticky = Some(d.classification.cause);
        }
        let cause = d.classification.cause;
        // A server that went away, or became a standby, is written to again
        // only on a new connection.
        let reconnect = matches!(cause, Cause::Unavailable | Cause::ReadOnly | Cause::OutcomeUnknown);
        if reconnect {
            handle.open = false;
        }
        let terminal = match d.action {
            ActionKind::Resolve => {
                self.resolving = true;
                return Phase::Opening;
            }
            ActionKind::Retry => {
                let then = match operation {
                    _ if reconnect => Resume::Open,
                    Operation::Open => Resume::Open,
                    _ => Resume::Write,
                };
                return Phase::Waiting {
                    ms: d.delay_ms.unwrap_or(1),
                    then,
                };
            }
            // Remedies need an open database: after a failed open they
            // cannot run, so the batch is diverted.
            ActionKind::DegradeFts | ActionKind::RecreateSession if operation == Operation::Open => {
                self.action = Some(ActionKind::Divert);
                Terminal::Divert(cause)
            }
            ActionKind::DegradeFts => {
                self.plan.degrade_fts = true;
                return Phase::Writing;
            }
            ActionKind::RecreateSession => {
                self.plan.recreate_session = true;
                return Phase::Writing;
            }
            // No host keeps continuation sessions yet, so there is nothing
            // to adopt: the batch is kept in the divert file instead.
            ActionKind::AdoptContinuation => {
                self.action = Some(ActionKind::Divert);
                Terminal::Divert(cause)
            }
            // Whatever stops the lookup, nobody knows whether the batch
            // is stored: the divert says so, and replay settles each line.
            ActionKind::Divert if self.resolving && !d.sticky => {
                self.last = Some((Cause::OutcomeUnknown, Operation::AppendBatch));
                Terminal::Divert(Cause::OutcomeUnknown)
            }
            ActionKind::Divert => Terminal::Divert(cause),
            ActionKind::FailClosed => Terminal::HandBack,
        };
        // The retired generation is captured once per handle, from a live
        // store, before the batch goes anywhere.
        if d.capture && handle.capture.is_none() && handle.open {
            return Phase::Capturing { then: terminal };
        }
        phase_after(terminal)
    }

    /// The outcome of this flush, which takes the flush's own data. A
    /// flush that is not done yet ends here as abandoned (see
    /// [`super::Handle::abandon`]).
    pub(super) fn into_report(self, handle: &HandleState) -> FlushReport {
        let Phase::Done(ending) = self.phase else {
            return super::abandoned(self.start);
        };
        let (cause, operation) = match self.last {
            Some((c, op)) => (Some(c), Some(op)),
            None => (None, None),
        };
        let cause = cause.or(handle.sticky);
        let operation = match (operation, handle.sticky) {
            (Some(op), _) => Some(op),
            // A sticky handle's batch never reached the database.
            (None, Some(_)) => Some(Operation::AppendBatch),
            (None, None) => None,
        };
        report::build(report::Parts {
            start: self.start,
            attempts: self.attempts,
            operation,
            cause,
            action: self.action,
            errno: self.errno,
            tls: self.tls,
            lease: self.lease,
            written: self.written,
            capture_now: self.capture,
            capture_known: handle.capture.as_ref(),
            engine: handle.engine,
            ending,
        })
    }
}

fn phase_after(t: Terminal) -> Phase {
    match t {
        Terminal::Divert(cause) => Phase::Diverting { cause },
        Terminal::HandBack => Phase::Done(Ending::HandedBack),
    }
}

fn phase_label(p: &Phase) -> &'static str {
    match p {
        Phase::Opening => "open",
        Phase::Writing => "write",
        Phase::Resolving => "resolve",
        Phase::Waiting { .. } => "wait",
        Phase::Capturing { .. } => "capture",
        Phase::Diverting { .. } => "divert",
        Phase::Done(_) => "done",
    }
}
