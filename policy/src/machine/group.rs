//! A group write: several batches in one transaction (one COMMIT, one sync
//! for all), each batch in its own savepoint. When one statement fails the
//! host asks [`failure_scope`] how far the failure reaches and only does
//! that: roll back the batch's savepoint and go on with the others, or roll
//! back the whole transaction, after which every batch of the group settles
//! on that failure through its own flush machine.
//!
//! The rule, strongest first:
//! 1. the engine already ended the transaction (SQLite rolled it back on
//!    its own, autocommit again): the transaction;
//! 2. the host's own evidence about the store or the COMMIT (the guard saw
//!    the file or its WAL replaced, COMMIT failed): the transaction; about
//!    the batch's session (its turn lease is another writer's, a compaction
//!    of it): the batch;
//! 3. the engine's code: SQLite, by the primary code (the low byte of the
//!    extended code): busy, locked, out of memory, read-only, interrupted,
//!    I/O, corruption, full, cannot open, protocol, not a database end the
//!    transaction; PostgreSQL, by the SQLSTATE: classes 08 (connection),
//!    40 (rollback), 53 (resources), 57 (operator intervention), 58
//!    (system), XX (internal), 55 but for 55P03 (a statement's lock wait
//!    timed out, which its savepoint undoes) and 25P02 (the transaction is
//!    already aborted) end it, and so does a failure without a SQLSTATE
//!    (the client library's: nothing says the transaction lives);
//! 4. anything else (a constraint of this batch, an error SQLite did not
//!    return) is the batch's alone.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::codes;
use crate::model::{Engine, Evidence, Observation};

/// How far a failure inside a group's transaction reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Only the failing batch: the host rolls back to its savepoint and
    /// releases it, and the group's other batches go on.
    Batch,
    /// The whole transaction: the host rolls it back (if the engine has
    /// not), and every batch of the group without a failure of its own
    /// fails with this one.
    Transaction,
}

impl Scope {
    pub const ALL: [Scope; 2] = [Scope::Batch, Scope::Transaction];

    /// The labels, in the order of [`Scope::ALL`].
    const LABELS: [&'static str; 2] = ["batch", "transaction"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<Scope> {
        Self::ALL.get(crate::text::position(&Self::LABELS, s)).copied()
    }
}

/// How far the failure `obs` reaches inside a group's transaction.
/// `transaction_open` is whether the engine still holds the transaction
/// open after the failure (SQLite: not autocommit; the JavaScript host's
/// `db.inTransaction`). Total: every observation has one answer.
pub fn failure_scope(obs: &Observation, transaction_open: bool) -> Scope {
    if !transaction_open {
        return Scope::Transaction;
    }
    if let Some(scope) = evidence_scope(&obs.evidence) {
        return scope;
    }
    match obs.engine {
        Engine::Sqlite => sqlite_scope(obs.extended_code.or(obs.code)),
        Engine::Postgres => postgres_scope(obs.sqlstate.as_deref()),
    }
}

/// What the host's own evidence says, if anything: evidence about the
/// store or the COMMIT outweighs evidence about one session.
fn evidence_scope(evidence: &[Evidence]) -> Option<Scope> {
    let mut scope = None;
    for e in evidence {
        match e {
            Evidence::DeletedWalGeneration | Evidence::DbReplaced | Evidence::CommitSent => {
                return Some(Scope::Transaction);
            }
            Evidence::TurnLeaseLost | Evidence::CompressionInProgress | Evidence::CompressionClosed => {
                scope = Some(Scope::Batch);
            }
            // Where the failing statement wrote says nothing of the
            // transaction: its code does.
            Evidence::FtsScope => {}
        }
    }
    scope
}

/// SQLite, by the primary code of `code` (extended or primary).
fn sqlite_scope(code: Option<i64>) -> Scope {
    let Some(code) = code else {
        // Not an error SQLite returned (a bad parameter, say): the
        // transaction is intact.
        return Scope::Batch;
    };
    match codes::primary_of(code) {
        codes::BUSY
        | codes::LOCKED
        | codes::NOMEM
        | codes::READONLY
        | codes::INTERRUPT
        | codes::IOERR
        | codes::CORRUPT
        | codes::FULL
        | codes::CANTOPEN
        | codes::PROTOCOL
        | codes::NOTADB => Scope::Transaction,
        _ => Scope::Batch,
    }
}

/// PostgreSQL, by the SQLSTATE's class.
fn postgres_scope(sqlstate: Option<&str>) -> Scope {
    let Some(state) = sqlstate else {
        return Scope::Transaction;
    };
    match (state.get(..2).unwrap_or(""), state) {
        (_, "55P03") => Scope::Batch,
        (_, "25P02") => Scope::Transaction,
        ("08" | "40" | "53" | "55" | "57" | "58" | "XX", _) => Scope::Transaction,
        _ => Scope::Batch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Operation;

    fn sqlite(extended: i64) -> Observation {
        Observation {
            code: Some(extended & 0xff),
            extended_code: Some(extended),
            ..Observation::new(Operation::AppendBatch)
        }
    }

    fn postgres(state: &str) -> Observation {
        Observation {
            engine: Engine::Postgres,
            sqlstate: Some(state.into()),
            ..Observation::new(Operation::AppendBatch)
        }
    }

    #[test]
    fn a_transaction_the_engine_ended_is_ended_whatever_the_code() {
        assert_eq!(
            failure_scope(&sqlite(codes::CONSTRAINT_UNIQUE), false),
            Scope::Transaction
        );
        assert_eq!(failure_scope(&sqlite(codes::CONSTRAINT_UNIQUE), true), Scope::Batch);
    }

    #[test]
    fn a_fenced_lease_is_the_batchs_and_the_guard_and_commit_the_transactions() {
        let with = |e: Vec<Evidence>| Observation {
            evidence: e,
            ..Observation::new(Operation::AppendBatch)
        };
        assert_eq!(failure_scope(&with(vec![Evidence::TurnLeaseLost]), true), Scope::Batch);
        assert_eq!(
            failure_scope(&with(vec![Evidence::DbReplaced]), true),
            Scope::Transaction
        );
        assert_eq!(
            failure_scope(&with(vec![Evidence::TurnLeaseLost, Evidence::CommitSent]), true),
            Scope::Transaction
        );
        // FTS scope defers to the code.
        let mut o = sqlite(codes::CORRUPT);
        o.evidence = vec![Evidence::FtsScope];
        assert_eq!(failure_scope(&o, true), Scope::Transaction);
    }

    #[test]
    fn sqlite_full_ends_the_transaction_and_a_constraint_does_not() {
        assert_eq!(failure_scope(&sqlite(codes::FULL), true), Scope::Transaction);
        assert_eq!(failure_scope(&sqlite(codes::CONSTRAINT_FOREIGNKEY), true), Scope::Batch);
        assert_eq!(
            failure_scope(&Observation::new(Operation::AppendBatch), true),
            Scope::Batch
        );
    }

    #[test]
    fn postgres_by_class_with_a_lock_timeout_the_batchs() {
        assert_eq!(failure_scope(&postgres("53100"), true), Scope::Transaction);
        assert_eq!(failure_scope(&postgres("55P03"), true), Scope::Batch);
        assert_eq!(failure_scope(&postgres("55006"), true), Scope::Transaction);
        assert_eq!(failure_scope(&postgres("23503"), true), Scope::Batch);
        let mut none = postgres("00000");
        none.sqlstate = None;
        assert_eq!(failure_scope(&none, true), Scope::Transaction);
    }

    #[test]
    fn labels_round_trip() {
        for s in Scope::ALL {
            assert_eq!(Scope::from_label(s.label()), Some(s));
        }
        assert_eq!(Scope::from_label("group"), None);
    }
}
