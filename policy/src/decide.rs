//! The action table: classification -> what the host does next.

use crate::classify::classify;
use crate::model::{
    ActionKind, Cause, Classification, CopyContext, Decision, Observation, Operation, Outcome, is_sticky, needs_capture,
};
#[allow(unused_imports)]
use crate::prelude::*;
use crate::retry::RetryPlan;

/// Decide with the default retry plan.
pub fn decide(obs: &Observation) -> Decision {
    decide_with(obs, &RetryPlan::DEFAULT)
}

/// Decide with an explicit retry plan (hosts use the default; tests may not).
pub fn decide_with(obs: &Observation, plan: &RetryPlan) -> Decision {
    let classification = classify(obs);
    let (action, delay_ms) = action_for(obs, classification, plan);
    Decision {
        classification,
        action,
        delay_ms,
        sticky: is_sticky(classification.cause),
        capture: needs_capture(classification.cause),
    }
}

fn action_for(obs: &Observation, c: Classification, plan: &RetryPlan) -> (ActionKind, Option<u64>) {
    // A failed divert is never diverted again, and replay reads diverted
    // lines, so for both the fallback is to keep the data where it is.
    let fallback = match obs.operation {
        Operation::Open | Operation::AppendBatch | Operation::Checkpoint => ActionKind::Divert,
        Operation::Divert | Operation::Replay => ActionKind::FailClosed,
    };
    if obs.operation == Operation::Divert {
        return (ActionKind::FailClosed, None);
    }
    // One-shot remedies run on the first failure only; a second failure of
    // the same kind means the remedy did not help.
    let first = obs.attempt <= 1;
    match c.cause {
        Cause::Locked | Cause::Compression | Cause::Unavailable | Cause::ReadOnly => {
            match plan.next_delay(obs.attempt, obs.elapsed_ms, obs.seed) {
                Some(d) => (ActionKind::Retry, Some(d)),
                None => (fallback, None),
            }
        }
        // Only a live connection can say whether the COMMIT took effect;
        // within patience one is made, past it the batch is kept.
        Cause::OutcomeUnknown
            if obs.operation == Operation::AppendBatch
                && plan.next_delay(obs.attempt, obs.elapsed_ms, obs.seed).is_some() =>
        {
            (ActionKind::Resolve, None)
        }
        Cause::FtsIndex if first => (ActionKind::DegradeFts, None),
        Cause::CompressionClosed if first => (ActionKind::AdoptContinuation, None),
        Cause::SessionRowMissing if first => (ActionKind::RecreateSession, None),
        Cause::TurnLease | Cause::UidConflict => (ActionKind::FailClosed, None),
        Cause::FtsIndex
        | Cause::CompressionClosed
        | Cause::SessionRowMissing
        | Cause::Disk
        | Cause::DiskFull
        | Cause::Replaced
        | Cause::DeletedWal
        | Cause::Corrupt
        | Cause::OutcomeUnknown
        | Cause::Unknown => (fallback, None),
    }
}

/// Every action a batch-carrying operation (`open`, `append_batch`) can get
/// for a cause, in the order the host meets them.
pub fn possible_actions(cause: Cause) -> &'static [ActionKind] {
    match cause {
        Cause::Locked | Cause::Compression | Cause::Unavailable | Cause::ReadOnly => {
            &[ActionKind::Retry, ActionKind::Divert]
        }
        Cause::OutcomeUnknown => &[ActionKind::Resolve, ActionKind::Divert],
        Cause::FtsIndex => &[ActionKind::DegradeFts, ActionKind::Divert],
        Cause::CompressionClosed => &[ActionKind::AdoptContinuation, ActionKind::Divert],
        Cause::SessionRowMissing => &[ActionKind::RecreateSession, ActionKind::Divert],
        Cause::TurnLease | Cause::UidConflict => &[ActionKind::FailClosed],
        Cause::Disk | Cause::DiskFull | Cause::Replaced | Cause::DeletedWal | Cause::Corrupt | Cause::Unknown => {
            &[ActionKind::Divert]
        }
    }
}

/// The outcomes an action can end in.
pub fn outcomes_of(action: ActionKind) -> &'static [Outcome] {
    match action {
        ActionKind::Retry
        | ActionKind::DegradeFts
        | ActionKind::AdoptContinuation
        | ActionKind::RecreateSession
        | ActionKind::Resolve => &[Outcome::Persisted],
        ActionKind::Divert => &[Outcome::Diverted, Outcome::DivertFailed],
        ActionKind::FailClosed => &[Outcome::HandedBack],
    }
}

/// Whether the action table can produce this (cause, outcome) pair.
pub fn is_producible(cause: Cause, outcome: Outcome) -> bool {
    possible_actions(cause)
        .iter()
        .any(|a| outcomes_of(*a).contains(&outcome))
}

/// Every producible (cause, outcome) pair, in table order.
pub fn producible_pairs() -> Vec<(Cause, Outcome)> {
    Cause::ALL
        .into_iter()
        .flat_map(|c| Outcome::ALL.into_iter().map(move |o| (c, o)))
        .filter(|(c, o)| is_producible(*c, *o))
        .collect()
}

/// The outcome a decision ends in given what the host reports of its
/// effects, or `None` when there is no user outcome: a divert not yet
/// tried, or a replay (whose lines simply stay pending). Remedies (retry
/// and the one-shot fixes) are described by the copy shown once they
/// succeed. A failed `divert` operation is a `divert_failed` outcome.
pub fn outcome_for(operation: Operation, action: ActionKind, ctx: &CopyContext) -> Option<Outcome> {
    match operation {
        Operation::Replay => return None,
        Operation::Divert => return Some(Outcome::DivertFailed),
        Operation::Open | Operation::AppendBatch | Operation::Checkpoint => {}
    }
    match action {
        ActionKind::Retry
        | ActionKind::DegradeFts
        | ActionKind::AdoptContinuation
        | ActionKind::RecreateSession
        | ActionKind::Resolve => Some(Outcome::Persisted),
        ActionKind::Divert => {
            if ctx.divert_failure.is_some() {
                Some(Outcome::DivertFailed)
            } else if ctx.receipt.is_some() {
                Some(Outcome::Diverted)
            } else {
                None
            }
        }
        ActionKind::FailClosed => Some(Outcome::HandedBack),
    }
}
