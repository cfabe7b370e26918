//! What one flush did, as the caller and the `append` command see it.

use serde_json::{Value, json};
use turnsafe_policy::{ActionKind, Cause, Copy, Operation};

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
    /// The cause of the first failure that shaped the outcome; `None` on a first-try commit.
    pub cause: Option<Cause>,
    /// The last action the policy asked for; `None` on a first-try commit.
    pub action: Option<ActionKind>,
    /// Write attempts made against the database in this flush.
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
    pub divert_residue: Option<turnsafe_policy::DivertResidue>,
}

impl FlushOutcome {
    /// The JSON object `turnsafe append` prints for this batch.
    pub fn to_value(&self) -> Value {
        json!({
            "persisted": self.persisted,
            "operation": self.operation.map(|o| o.label()),
            "cause": self.cause.map(|c| c.label()),
            "action": self.action.map(|a| a.label()),
            "attempts": self.attempts,
            "committed": self.committed,
            "diverted": self.diverted,
            "handed_back": self.handed_back,
            "receipt": self.receipt,
            "divert_error": self.divert_error.as_ref().map(DivertError::to_value),
            "copy": self.copy.as_ref().map(turnsafe_policy::json::copy_to_value),
            "error": self.error,
            "uids": self.uids,
            "minted_uids": self.minted_uids,
            "capture": match &self.capture {
                None => Value::Null,
                Some(Ok(c)) => json!(c),
                Some(Err(e)) => e.to_value(),
            },
            "divert_residue": self.divert_residue,
        })
    }
}
