//! The flush protocol as a sans-IO state machine: the policy drives, the
//! host only performs effects.
//!
//! Two machines:
//! - a [`Handle`] owns what lasts across batches: whether the store is
//!   open, the sticky cause that quarantines it, and the capture of its
//!   retired generation;
//! - a [`FlushMachine`] runs one batch inside the handle.
//!
//! # How a host drives them
//!
//! ```text
//! let mut handle = Handle::new();                 // once per store
//! handle.start(FlushStart { .. })?;               // once per batch
//! loop {
//!     match handle.poll() {
//!         Some(Step::Done(report)) => break report,   // the whole outcome
//!         Some(step) => {
//!             let event = perform(step);              // the host's only job
//!             handle.handle(event)?;
//!         }
//!         None => unreachable,                        // no flush started
//!     }
//! }
//! ```
//!
//! The calls, in order:
//! - [`Handle::start`] begins a flush; it refuses while one is running.
//! - [`Handle::poll`] returns the step the machine waits on. Polling again
//!   without an event returns the same step. [`Step::Done`] ends the flush:
//!   the handle forgets it and `poll` returns `None` until the next start.
//! - [`Handle::handle`] feeds back the result of the step just performed.
//!   An event that does not answer that step is refused with a
//!   [`ProtocolError`] and changes nothing.
//!
//! After every `handle`, drain `poll` until it returns a step that needs an
//! effect ([`Step::Wait`] included) or [`Step::Done`].
//!
//! # Contract
//! - No I/O. Time (`elapsed_ms` on events), chance (the seed), uids and
//!   everything else the host made are inputs; two hosts fed the same
//!   inputs build byte-identical outcomes.
//! - Every batch ends in exactly one place: `committed + diverted +
//!   handed_back` is the batch size in every [`FlushReport`].
//! - A copy claims a kept copy only with a divert receipt and a capture only
//!   with a capture receipt.
//! - After a sticky cause, no step opens or writes the database again, in
//!   this flush or a later one; after a failed divert nothing is written.
//! - A one-shot remedy runs at most once per flush, and a retry is asked
//!   only for the causes the decision table makes retryable.

#[allow(unused_imports)]
use crate::prelude::*;
pub mod background;
mod edit;
mod edit_wire;
mod flush;
mod group;
mod report;
mod start;
pub(crate) mod wire;

pub use crate::model::DivertReceipt;
pub use edit::{EditEvent, EditMachine, EditStep};
pub use edit_wire::edit_step_json;
pub use flush::FlushMachine;
pub use group::{Scope, failure_scope};
pub use report::{CaptureReport, DivertErrorReport, FlushReport};
pub use start::{FlushStart, PendingCapture};
pub use wire::{STATE_FORMAT, event_from_text, event_to_text, flush_step_json, step_to_text};

use serde::{Deserialize, Serialize};

use crate::model::{
    CaptureFailure, CaptureReceipt, Cause, DivertFailure, DivertResidue, Evidence, Observation, Operation,
};

/// What the host changes about the write when it runs it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WritePlan {
    /// Clear the full-text-index flag in the same transaction.
    pub degrade_fts: bool,
    /// Recreate the session's row before writing.
    pub recreate_session: bool,
}

/// The next effect the host performs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Open the store; answer [`Event::Opened`] or [`Event::Failed`].
    Open,
    /// Write the batch in one transaction with this plan; answer
    /// [`Event::Committed`] or [`Event::Failed`].
    Write(WritePlan),
    /// Sleep; answer [`Event::Waited`].
    Wait { ms: u64 },
    /// Capture the retired WAL generation; answer [`Event::Captured`] or
    /// [`Event::CaptureFailed`].
    Capture,
    /// Append the batch to the divert file, labelled with `cause`; answer
    /// [`Event::Diverted`] or [`Event::DivertFailed`].
    Divert { cause: Cause },
    /// Look up which of the batch's uids the store holds, on the connection
    /// just opened; answer [`Event::Resolved`] or [`Event::Failed`].
    Resolve,
    /// The flush is over; nothing more to do.
    Done(Box<FlushReport>),
}

/// A failed open or write, as the host saw it. The machine adds the
/// operation, the attempt number and the seed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Failure {
    /// The engine; SQLite unless the host says otherwise.
    pub engine: crate::model::Engine,
    /// PostgreSQL's SQLSTATE, when there is one.
    pub sqlstate: Option<String>,
    pub code: Option<i64>,
    pub extended_code: Option<i64>,
    pub message: String,
    pub errno: Option<i64>,
    pub evidence: Vec<Evidence>,
    /// Milliseconds since the flush started.
    pub elapsed_ms: u64,
    /// The holder of the lease that fenced the write, with
    /// [`Evidence::TurnLeaseLost`]: the copy names it.
    #[serde(default)]
    pub lease: Option<Box<crate::lease::LeaseHolder>>,
}

impl Failure {
    /// What the policy is shown of this failure of `operation`: its first
    /// attempt, seed 0 (the flush machine sets its own attempt and seed).
    pub fn into_observation(self, operation: Operation) -> Observation {
        Observation {
            operation,
            engine: self.engine,
            sqlstate: self.sqlstate,
            code: self.code,
            extended_code: self.extended_code,
            message: self.message,
            errno: self.errno,
            evidence: self.evidence,
            attempt: 1,
            elapsed_ms: self.elapsed_ms,
            seed: 0,
            lease: self.lease,
        }
    }
}

/// The result of the step the machine waits on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Opened,
    Committed,
    /// The open or the write failed.
    Failed(Failure),
    Waited {
        elapsed_ms: u64,
    },
    Captured(CaptureReceipt),
    CaptureFailed {
        failure: CaptureFailure,
        /// The host's whole error text, for the outcome; the copy uses only `failure`.
        error: String,
    },
    Diverted(DivertReceipt),
    /// The uid lookup: every uid of the batch is stored, or not.
    Resolved {
        all_stored: bool,
    },
    DivertFailed {
        failure: DivertFailure,
        /// The host's error text, shown when there is no errno.
        message: String,
        residue: Option<DivertResidue>,
    },
}

impl Event {
    pub fn label(&self) -> &'static str {
        match self {
            Event::Opened => "opened",
            Event::Committed => "committed",
            Event::Failed(_) => "failed",
            Event::Waited { .. } => "waited",
            Event::Captured(_) => "captured",
            Event::CaptureFailed { .. } => "capture_failed",
            Event::Diverted(_) => "diverted",
            Event::Resolved { .. } => "resolved",
            Event::DivertFailed { .. } => "divert_failed",
        }
    }
}

impl Step {
    pub fn label(&self) -> &'static str {
        match self {
            Step::Open => "open",
            Step::Write(_) => "write",
            Step::Wait { .. } => "wait",
            Step::Capture => "capture",
            Step::Divert { .. } => "divert",
            Step::Resolve => "resolve",
            Step::Done(_) => "done",
        }
    }
}

/// A call the protocol does not allow; the machine is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// `start` while a flush is running.
    FlushRunning,
    /// `handle` with no flush running.
    NoFlush,
    /// The event does not answer the step the machine waits on.
    Unexpected { step: &'static str, event: &'static str },
}

impl ProtocolError {
    /// What `Display` prints, built without `core::fmt` for the component.
    pub fn message(&self) -> String {
        match self {
            ProtocolError::FlushRunning => "a flush is already running on this handle".into(),
            ProtocolError::NoFlush => "no flush is running on this handle".into(),
            ProtocolError::Unexpected { step, event } => {
                crate::text::cat(&["event `", event, "` does not answer step `", step, "`"])
            }
        }
    }
}

impl core::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.message())
    }
}

impl core::error::Error for ProtocolError {}

/// What a handle knows across batches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HandleState {
    /// The store is open (the host holds a live connection).
    pub open: bool,
    /// Once set, every batch is diverted without touching the database.
    pub sticky: Option<Cause>,
    /// The capture of the retired generation, once tried: the copy of every
    /// later batch names it (or its failure), and it is never tried twice.
    pub capture: Option<CaptureReport>,
    /// The engine of the last failure seen: the copy of every later batch
    /// names that engine's steps (a sticky PostgreSQL handle's too).
    #[serde(default)]
    pub engine: crate::model::Engine,
}

/// The handle machine: state across batches, and the flush in progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Handle {
    state: HandleState,
    flush: Option<FlushMachine>,
}

impl Handle {
    /// A handle on a store that is not open yet.
    pub fn new() -> Handle {
        Handle::default()
    }

    /// A handle that knows `state` and runs no flush.
    pub fn with_state(state: HandleState) -> Handle {
        Handle { state, flush: None }
    }

    pub fn state(&self) -> &HandleState {
        &self.state
    }

    pub fn is_open(&self) -> bool {
        self.state.open
    }

    pub fn sticky(&self) -> Option<Cause> {
        self.state.sticky
    }

    /// Whether a flush is running.
    pub fn in_flush(&self) -> bool {
        self.flush.is_some()
    }

    /// The start of the running flush.
    pub(crate) fn running(&self) -> Option<&FlushStart> {
        self.flush.as_ref().map(FlushMachine::batch)
    }

    /// Begin the flush of one batch.
    pub fn start(&mut self, start: FlushStart) -> Result<(), ProtocolError> {
        if self.flush.is_some() {
            return Err(ProtocolError::FlushRunning);
        }
        self.flush = Some(FlushMachine::new(start, &self.state));
        Ok(())
    }

    /// The step the running flush waits on; `None` when no flush runs.
    /// [`Step::Done`] ends the flush.
    pub fn poll(&mut self) -> Option<Step> {
        if let Some(step) = self.flush.as_ref()?.effect() {
            return Some(step);
        }
        // Done: the handle forgets the flush, whose data moves into its outcome.
        let flush = self.flush.take()?;
        Some(Step::Done(Box::new(flush.into_report(&self.state))))
    }

    /// Feed back the result of the step just performed.
    pub fn handle(&mut self, event: Event) -> Result<(), ProtocolError> {
        let flush = self.flush.as_mut().ok_or(ProtocolError::NoFlush)?;
        flush.handle(&mut self.state, event)
    }
}

impl Handle {
    /// End the running flush, whatever it waits on, handing the batch back
    /// to the caller. Nothing was committed or kept by this flush's account;
    /// for a host that cannot go on (an event it could not produce).
    pub fn abandon(&mut self) -> FlushReport {
        abandoned(self.flush.take().map(FlushMachine::into_start).unwrap_or_default())
    }
}

/// The outcome of a flush the host gave up on: the whole batch handed
/// back, cause `unknown`.
pub(crate) fn abandoned(start: FlushStart) -> FlushReport {
    FlushReport {
        persisted: false,
        operation: None,
        cause: Some(Cause::Unknown),
        action: Some(crate::model::ActionKind::FailClosed),
        attempts: 0,
        committed: 0,
        diverted: 0,
        handed_back: start.uids.len(),
        receipt: None,
        divert_error: None,
        divert_residue: None,
        capture: None,
        copy: None,
        error: Some(Cause::Unknown.failure_label()),
        uids: start.uids,
        minted_uids: start.minted_uids,
        pending_capture: start.pending_capture,
        // Nothing was committed, so nothing it claims can be lost.
        durable: true,
    }
}
