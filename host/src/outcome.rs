//! What one flush did, as the caller and the `append` command see it.
//!
//! The policy's flush machine builds the outcome ([`FlushReport`]), its
//! JSON and its copy; this type adds the host's own values of the same
//! effects (the divert error with its path for logs, the capture error)
//! for callers in Rust.

use serde_json::Value;
use turnsafe_policy::machine::{Failure, FlushReport};
use turnsafe_policy::{ActionKind, Cause, Copy, DivertResidue, Operation};

use crate::capture::{Capture, CaptureError};
use crate::divert::{DivertError, Receipt};

/// The result of `append_batch`. `committed + diverted + handed_back` is
/// always the batch size.
#[derive(Debug)]
pub struct FlushOutcome {
    pub persisted: bool,
    /// The operation whose failure shaped the outcome (`open` when the store
    /// could not be opened); `None` on a first-try commit.
    pub operation: Option<Operation>,
    /// The cause of the failure that shaped the outcome; `None` on a first-try commit.
    pub cause: Option<Cause>,
    /// The last action the policy asked for; `None` on a first-try commit.
    pub action: Option<ActionKind>,
    /// Opens and writes tried against the database in this flush.
    pub attempts: u32,
    pub committed: usize,
    pub diverted: usize,
    pub handed_back: usize,
    pub receipt: Option<Receipt>,
    pub divert_error: Option<DivertError>,
    pub copy: Option<Copy>,
    /// The uid of every message, in batch order.
    pub uids: Vec<String>,
    /// The uids turnsafe minted for messages that came without one.
    pub minted_uids: Vec<String>,
    /// Why the flush failed: `session_persistence_failed:<cause>`.
    pub error: Option<String>,
    /// The capture of a retired generation this flush made, or why it failed.
    pub capture: Option<Result<Capture, CaptureError>>,
    /// A failed divert that could not be cut back: some of its lines may
    /// remain in the divert file, from `offset` on.
    pub divert_residue: Option<DivertResidue>,
    /// Whether what this outcome says is stored survives a power cut now:
    /// `false` for a commit under `synchronous=NORMAL` (or PostgreSQL's
    /// `synchronous_commit=off`).
    pub durable: bool,
    /// The machine's outcome, which the JSON is made from.
    pub report: FlushReport,
    /// The last failed open or write of this flush, as the host observed it
    /// and handed it to the policy (with `operation`, the attempt number and
    /// the seed, the machine makes it the policy's observation); `None` when
    /// nothing failed or a sticky handle never touched the database.
    pub failure: Option<Failure>,
}

impl FlushOutcome {
    /// The machine's outcome, with the host's values of the same effects.
    pub fn new(
        report: FlushReport,
        divert_error: Option<DivertError>,
        capture: Option<Result<Capture, CaptureError>>,
    ) -> FlushOutcome {
        FlushOutcome {
            persisted: report.persisted,
            operation: report.operation,
            cause: report.cause,
            action: report.action,
            attempts: report.attempts,
            committed: report.committed,
            diverted: report.diverted,
            handed_back: report.handed_back,
            receipt: report.receipt.clone(),
            divert_error,
            copy: report.copy.clone(),
            uids: report.uids.clone(),
            minted_uids: report.minted_uids.clone(),
            error: report.error.clone(),
            capture,
            divert_residue: report.divert_residue.clone(),
            durable: report.durable,
            report,
            failure: None,
        }
    }

    /// The JSON object `turnsafe append` prints for this batch, exactly as
    /// the policy built it.
    pub fn to_value(&self) -> Value {
        self.report.to_value()
    }
}
