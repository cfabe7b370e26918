//! What one flush did, as the caller and the `append` command see it.
//!
//! The policy's flush machine builds the outcome ([`FlushReport`]), its
//! JSON and its copy. [`FlushOutcome`] is that report, read through
//! `Deref` (`outcome.persisted`, `outcome.cause`, ...), plus the host's
//! own values of the same effects that the report keeps only as data: the
//! divert error with its `io::Error` for logs, the capture with its files,
//! and the failure handed to the machine.

use std::ops::Deref;

use serde_json::Value;
use turnsafe_policy::machine::{Failure, FlushReport};

use crate::capture::{Capture, CaptureError};
use crate::divert::DivertError;

/// The result of `append_batch`. `committed + diverted + handed_back` is
/// always the batch size.
#[derive(Debug)]
pub struct FlushOutcome {
    /// The machine's outcome, which the JSON is made from; every field of
    /// it reads through this outcome.
    pub report: FlushReport,
    /// The divert's own error (the report keeps its errno and text).
    pub divert_error: Option<DivertError>,
    /// The capture of a retired generation this flush made, or why it failed.
    pub capture: Option<Result<Capture, CaptureError>>,
    /// The last failed open or write of this flush, as the host observed it
    /// and handed it to the policy (with `operation`, the attempt number and
    /// the seed, the machine makes it the policy's observation); `None` when
    /// nothing failed or a sticky handle never touched the database.
    pub failure: Option<Failure>,
}

impl Deref for FlushOutcome {
    type Target = FlushReport;
    fn deref(&self) -> &FlushReport {
        &self.report
    }
}

impl FlushOutcome {
    /// The machine's outcome, with the host's values of the same effects.
    pub fn new(
        report: FlushReport,
        divert_error: Option<DivertError>,
        capture: Option<Result<Capture, CaptureError>>,
    ) -> FlushOutcome {
        FlushOutcome {
            report,
            divert_error,
            capture,
            failure: None,
        }
    }

    /// The JSON object `turnsafe append` prints for this batch, exactly as
    /// the policy built it.
    pub fn to_value(&self) -> Value {
        self.report.to_value()
    }
}
