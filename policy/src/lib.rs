//! # turnsafe-policy
//!
//! **Contract: this crate performs no I/O.** It reads no files, no clock, no
//! environment and no randomness. It is a pure function from what a host
//! observed when a storage operation failed to what the host must do and
//! what the user must be told. Anything time- or chance-like (attempt
//! number, elapsed milliseconds, a jitter seed) is an input. The same
//! inputs give the same outputs natively, in the WASM component, and in
//! every runtime that embeds that component.
//!
//! The pipeline, in the order a host calls it:
//!
//! 1. [`classify`]: [`Observation`] -> [`Classification`] (cause and basis),
//!    by the precedence evidence > FTS-scoped corruption > codes > message > none;
//! 2. [`decide`]: the [`Decision`]: an [`ActionKind`], a retry delay from the
//!    [`RetryPlan`], and whether the handle turns sticky and must capture the
//!    retired WAL generation;
//! 3. the host carries out the action and learns the [`Outcome`];
//! 4. [`explain`]: the user [`Copy`] for (cause, outcome, context).
//!
//! The flush protocol itself (attempts, waits, one-shot remedies, capture,
//! divert, stickiness across batches, and the outcome with its copy) is the
//! sans-IO state machine in [`machine`]: a host performs the steps it asks
//! for and feeds back what happened.
//!
//! [`json`] holds the string-in, string-out entry points the `turnsafe` CLI
//! and the component's `*-json` functions share, so their outputs are
//! byte-identical. [`table`] renders the decision table (`docs/POLICY.md`).

// The component is built without std: no allocator of std's, no panic
// formatting, a smaller module. Native builds keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

mod classify;
pub mod codes;
mod collect;
mod copy;
mod decide;
mod edit_copy;
pub mod errno;
mod fields;
pub mod json;
mod jsontext;
mod lease;
pub mod machine;
mod model;
mod prelude;
mod retry;
pub mod table;
mod text;
mod value;
mod written;

/// The component's own JSON value, parser and writer, for the tests that
/// hold them to serde_json. Native builds only: the component gains nothing.
#[doc(hidden)]
#[cfg(not(target_arch = "wasm32"))]
pub mod jsontext_api {
    pub use crate::jsontext::{Json, parse};
}

#[cfg(target_arch = "wasm32")]
mod component;

pub use classify::classify;
/// Every text the phrase fallback knows, for the tests that pin each one
/// down. Native builds only: the component gains nothing.
#[doc(hidden)]
#[cfg(not(target_arch = "wasm32"))]
pub use classify::known_phrases;
pub use copy::{
    CopyError, KNOWN_CAPTURE_OPS, KNOWN_DIVERT_OPS, TLS_REMEDIATION, cause_remediation, explain, parse_capture_failure,
    parse_divert_failure,
};
pub use decide::{decide, decide_with, is_producible, outcome_for, outcomes_of, possible_actions, producible_pairs};
pub use edit_copy::{EditCopy, explain_edit};
pub use lease::{HolderPlace, LeaseHolder, LeaseProbe, LeaseVerdict, LocalProbe, ServerProbe, lease_verdict};
pub use model::{
    ActionKind, Basis, CaptureFailure, CaptureReceipt, CapturedFile, Cause, Classification, Copy, CopyContext,
    Decision, DivertFailure, DivertResidue, Durability, Engine, Evidence, Observation, Operation, Outcome, TlsFailure,
    is_sticky, needs_capture,
};
pub use retry::RetryPlan;
pub use written::possibly_written;

/// The WIT package this crate implements.
pub const WIT_PACKAGE: &str = "turnsafe:policy@0.4.0";
