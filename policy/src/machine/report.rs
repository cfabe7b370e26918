//! The outcome of a flush, built once, here: the counts, the cause, the
//! action, the receipt or the divert's failure, the capture, and the copy.
//! Its JSON is exactly what `turnsafe append` prints for the batch.

#[allow(unused_imports)]
use crate::prelude::*;
use serde::{Deserialize, Serialize};

use crate::jsontext::Json;

use super::DivertReceipt;
use super::start::FlushStart;
use crate::copy::{Facts, FailedOp, explain_facts};
use crate::model::{
    ActionKind, CaptureFailure, CaptureReceipt, Cause, Copy, DivertFailure, DivertResidue, Operation, Outcome,
};
use crate::value as v;

/// How the flush ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(super) enum Ending {
    Committed,
    Diverted(DivertReceipt),
    DivertFailed {
        error: DivertErrorReport,
        residue: Option<DivertResidue>,
    },
    HandedBack,
}

/// A capture that was tried: its receipt, or how it failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CaptureReport {
    Captured(CaptureReceipt),
    Failed {
        failure: CaptureFailure,
        /// The host's whole error text.
        error: String,
    },
}

impl CaptureReport {
    fn to_json(&self) -> Json {
        match self {
            CaptureReport::Captured(r) => v::capture_receipt(r),
            CaptureReport::Failed { failure, error } => {
                let mut o = v::Obj::new();
                o.str("error", error);
                o.str("operation", &failure.operation);
                o.opt_int("errno", failure.errno);
                o.done()
            }
        }
    }

    /// What the copy may say of this capture: where it is, or how it failed.
    fn facts(&self) -> Facts<'_> {
        match self {
            CaptureReport::Captured(r) => Facts {
                capture_path: Some(&r.path),
                ..Facts::default()
            },
            CaptureReport::Failed { failure, .. } => Facts {
                capture_failure: Some(FailedOp {
                    operation: &failure.operation,
                    errno: failure.errno,
                }),
                ..Facts::default()
            },
        }
    }
}

/// A failed divert as the outcome shows it: the operation and errno, and a
/// readable error; never a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DivertErrorReport {
    pub operation: String,
    pub errno: Option<i64>,
    pub error: String,
}

impl DivertErrorReport {
    pub fn new(failure: DivertFailure, message: String) -> DivertErrorReport {
        let error = failure.errno.map(crate::errno::human).unwrap_or(message);
        DivertErrorReport {
            operation: failure.operation,
            errno: failure.errno,
            error,
        }
    }

    fn failed_op(&self) -> FailedOp<'_> {
        FailedOp {
            operation: &self.operation,
            errno: self.errno,
        }
    }
}

/// How one flush ended. `committed + diverted + handed_back` is always the
/// batch size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushReport {
    pub persisted: bool,
    /// The operation whose failure shaped the outcome; `None` on a first-try commit.
    pub operation: Option<Operation>,
    /// The cause that shaped the outcome; `None` on a first-try commit.
    pub cause: Option<Cause>,
    /// The last action taken; `None` on a first-try commit.
    pub action: Option<ActionKind>,
    /// Opens and writes tried against the database in this flush.
    pub attempts: u32,
    pub committed: usize,
    pub diverted: usize,
    pub handed_back: usize,
    pub receipt: Option<DivertReceipt>,
    pub divert_error: Option<DivertErrorReport>,
    pub divert_residue: Option<DivertResidue>,
    /// The capture this flush made, or its failure.
    pub capture: Option<CaptureReport>,
    pub copy: Option<Copy>,
    /// `session_persistence_failed:<cause>` when not persisted.
    pub error: Option<String>,
    pub uids: Vec<String>,
    pub minted_uids: Vec<String>,
    /// The unsettled capture that kept this batch from the database.
    pub pending_capture: Option<super::start::PendingCapture>,
    /// Whether everything this outcome says is stored would survive a power
    /// cut now: `false` only when messages were committed under
    /// [`crate::Durability::Unsynced`]. A receipt is always durable (it is
    /// made after the divert's fsync).
    pub durable: bool,
}

impl FlushReport {
    /// The outcome object `turnsafe append` prints.
    pub(crate) fn json(&self) -> Json {
        let mut o = v::Obj::new();
        o.bool("persisted", self.persisted);
        o.opt_str("operation", self.operation.map(Operation::label));
        o.opt_str("cause", self.cause.map(Cause::label));
        o.opt_str("action", self.action.map(ActionKind::label));
        o.uint("attempts", u64::from(self.attempts));
        o.uint("committed", self.committed as u64);
        o.uint("diverted", self.diverted as u64);
        o.uint("handed_back", self.handed_back as u64);
        o.field(
            "receipt",
            match &self.receipt {
                Some(r) => v::divert_receipt(r),
                None => Json::Null,
            },
        );
        o.field(
            "divert_error",
            match &self.divert_error {
                Some(e) => {
                    let mut d = v::Obj::new();
                    d.str("operation", &e.operation);
                    d.opt_int("errno", e.errno);
                    d.str("error", &e.error);
                    d.done()
                }
                None => Json::Null,
            },
        );
        o.field(
            "copy",
            match &self.copy {
                Some(c) => crate::value::copy_json(c),
                None => Json::Null,
            },
        );
        o.opt_str("error", self.error.as_deref());
        o.strs("uids", &self.uids);
        o.strs("minted_uids", &self.minted_uids);
        o.field(
            "capture",
            match &self.capture {
                Some(c) => c.to_json(),
                None => Json::Null,
            },
        );
        o.field("divert_residue", v::residue(self.divert_residue.as_ref()));
        o.field(
            "pending_capture",
            match &self.pending_capture {
                Some(c) => {
                    let mut d = v::Obj::new();
                    d.str("path", &c.path);
                    d.str("cause", c.cause.label());
                    d.done()
                }
                None => Json::Null,
            },
        );
        o.bool("durable", self.durable);
        o.done()
    }

    /// The outcome object as one line of JSON: what `turnsafe append`
    /// prints, and what the component's `done` step carries.
    pub fn to_json(&self) -> String {
        self.json().to_text()
    }

    /// The outcome object as a `serde_json::Value`, for native hosts.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.to_json()).unwrap_or(serde_json::Value::Null)
    }
}

pub(super) struct Parts<'a> {
    pub start: FlushStart,
    pub attempts: u32,
    pub operation: Option<Operation>,
    pub cause: Option<Cause>,
    pub action: Option<ActionKind>,
    pub errno: Option<i64>,
    pub tls: Option<crate::model::TlsFailure>,
    /// The holder of the lease that fenced the write.
    pub lease: Option<Box<crate::lease::LeaseHolder>>,
    /// An attempt failed at or after its COMMIT's write.
    pub written: bool,
    pub capture_now: Option<CaptureReport>,
    pub capture_known: Option<&'a CaptureReport>,
    /// The engine the handle's failures came from.
    pub engine: crate::model::Engine,
    pub ending: Ending,
}

/// The outcome, built from what the flush owns: the copy first, from
/// borrowed facts, then the report takes the batch's uids, the receipt and
/// the failures without copying them.
pub(super) fn build(p: Parts<'_>) -> FlushReport {
    // Only the artifacts that exist shape the copy.
    let known = p.capture_known.map(CaptureReport::facts).unwrap_or_default();
    let session = Some(p.start.session.as_str());
    let failed = Facts {
        session,
        errno: p.errno,
        // A TLS reason speaks only for `disk`, the cause a failed
        // handshake gets (not for a lost COMMIT whose lookup then failed).
        tls: p.tls.filter(|_| p.cause == Some(Cause::Disk)),
        pending_capture: p.start.pending_capture.as_ref().map(|c| c.path.as_str()),
        engine: p.engine,
        lease: p.lease.as_deref(),
        ..known
    };
    let (outcome, facts) = match &p.ending {
        Ending::Committed => (
            Outcome::Persisted,
            Facts {
                session,
                durability: p.start.durability,
                engine: p.engine,
                ..Facts::default()
            },
        ),
        Ending::Diverted(receipt) => (
            Outcome::Diverted,
            Facts {
                receipt_path: Some(&receipt.path),
                ..failed
            },
        ),
        Ending::DivertFailed { error, residue } => (
            Outcome::DivertFailed,
            Facts {
                divert_failure: Some(error.failed_op()),
                divert_residue: residue.is_some(),
                ..failed
            },
        ),
        Ending::HandedBack => (Outcome::HandedBack, failed),
    };
    let copy = p.cause.and_then(|c| explain_facts(c, outcome, &facts, p.written).ok());
    let n = p.start.uids.len();
    let pending_capture = match p.ending {
        Ending::Committed => None,
        _ => p.start.pending_capture,
    };
    let durable = !matches!(
        (&p.ending, p.start.durability),
        (Ending::Committed, crate::model::Durability::Unsynced)
    );
    let mut report = FlushReport {
        persisted: false,
        operation: p.operation,
        cause: p.cause,
        action: p.action,
        attempts: p.attempts,
        committed: 0,
        diverted: 0,
        handed_back: 0,
        receipt: None,
        divert_error: None,
        divert_residue: None,
        capture: p.capture_now,
        copy,
        error: None,
        uids: p.start.uids,
        minted_uids: p.start.minted_uids,
        pending_capture,
        durable,
    };
    match p.ending {
        Ending::Committed => {
            report.persisted = true;
            report.committed = n;
        }
        Ending::Diverted(receipt) => {
            report.diverted = n;
            report.receipt = Some(receipt);
        }
        Ending::DivertFailed { error, residue } => {
            report.handed_back = n;
            report.divert_error = Some(error);
            report.divert_residue = residue;
        }
        Ending::HandedBack => report.handed_back = n,
    }
    if !report.persisted {
        report.error = p.cause.map(Cause::failure_label);
    }
    report
}
