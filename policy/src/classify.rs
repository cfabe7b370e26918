//! Classification: observation -> (cause, basis).
//!
//! Precedence (invariant 5), first match wins:
//! 1. typed evidence from the host's probes (`commit_sent` only with a
//!    lost connection: then the outcome of the COMMIT is unknown);
//! 2. FTS-scoped corruption (`SQLITE_CORRUPT_VTAB`, or corruption or a
//!    constraint failure with `fts_scope`);
//! 3. PostgreSQL's SQLSTATE, for the classes whose meaning is known;
//! 4. extended, then primary result codes (errno counts only with IOERR);
//! 5. message phrases, only when the codes say nothing; with a code
//!    present, a phrase never yields a sticky cause or `fts_index`;
//! 6. `unknown`.
//!
//! `deleted_wal` never comes from a code or a message, and `replaced` comes
//! only from evidence or `SQLITE_READONLY_DBMOVED`.

use crate::codes::*;
use crate::errno::{EDQUOT, ENOSPC};
use crate::model::{Basis, Cause, Classification, Engine, Evidence, Observation, Operation};
#[allow(unused_imports)]
use crate::prelude::*;
use crate::text::contains;

/// Classify one observation. Total: every input gets a cause.
pub fn classify(obs: &Observation) -> Classification {
    if let Some(cause) = from_evidence(obs) {
        return Classification {
            cause,
            basis: Basis::Evidence,
        };
    }
    if let Some(c) = fts_scoped_corruption(obs) {
        return c;
    }
    if let Some(cause) = obs.sqlstate.as_deref().and_then(from_sqlstate) {
        return Classification {
            cause,
            basis: Basis::Code,
        };
    }
    if let Some((cause, basis)) = from_codes(obs) {
        return Classification { cause, basis };
    }
    if let Some(cause) = from_message(obs) {
        // With a result code present, a phrase only refines that code to a
        // cause it may carry without proof: never a sticky one (which would
        // quarantine the handle for good), and never the index (its scope
        // comes from the statement the host ran). Such text is `unknown`.
        let has_code = obs.code.is_some() || obs.extended_code.is_some();
        if has_code && !phrase_may_refine_code(cause) {
            return Classification {
                cause: Cause::Unknown,
                basis: Basis::None,
            };
        }
        return Classification {
            cause,
            basis: Basis::Message,
        };
    }
    Classification {
        cause: Cause::Unknown,
        basis: Basis::None,
    }
}

/// Storage-identity evidence outranks fencing: a retired generation must be
/// captured whoever owns the turn.
fn from_evidence(obs: &Observation) -> Option<Cause> {
    if obs.has(Evidence::CommitSent) && connection_lost(obs) {
        return Some(Cause::OutcomeUnknown);
    }
    const ORDER: [(Evidence, Cause); 5] = [
        (Evidence::DeletedWalGeneration, Cause::DeletedWal),
        (Evidence::DbReplaced, Cause::Replaced),
        (Evidence::TurnLeaseLost, Cause::TurnLease),
        (Evidence::CompressionClosed, Cause::CompressionClosed),
        (Evidence::CompressionInProgress, Cause::Compression),
    ];
    ORDER.iter().find(|(e, _)| obs.has(*e)).map(|(_, c)| *c)
}

/// The connection itself failed: no SQLSTATE at all from a PostgreSQL
/// host (the socket closed), class 08 (connection exception), or the
/// server terminating the session (57P01-57P03). A server that answered
/// with any other SQLSTATE said what happened to the transaction.
fn connection_lost(obs: &Observation) -> bool {
    match obs.sqlstate.as_deref() {
        None => obs.engine == Engine::Postgres,
        Some(s) => s.starts_with("08") || matches!(s, "57P01" | "57P02" | "57P03"),
    }
}

/// The causes PostgreSQL's SQLSTATE classes name directly. Anything else
/// falls through to the codes the host translated it onto.
fn from_sqlstate(s: &str) -> Option<Cause> {
    Some(match s {
        // serialization failure, deadlock, lock not available
        "40001" | "40P01" | "55P03" => Cause::Locked,
        // disk full
        "53100" => Cause::DiskFull,
        // data corrupted, index corrupted
        "XX001" | "XX002" => Cause::Corrupt,
        // admin, crash or cannot-connect-now shutdown; too many connections
        "57P01" | "57P02" | "57P03" | "53300" => Cause::Unavailable,
        // read-only SQL transaction: a standby
        "25006" => Cause::ReadOnly,
        _ if s.starts_with("08") => Cause::Unavailable,
        _ => return None,
    })
}

/// The code pair reduced to (primary, extended). An extended code is trusted
/// over a `code` that disagrees with its low byte.
fn codes(obs: &Observation) -> (Option<i64>, Option<i64>) {
    match (obs.code, obs.extended_code) {
        (_, Some(ext)) => (Some(primary_of(ext)), Some(ext)),
        (Some(code), None) => {
            // A host that only has one code may pass an extended one here.
            if code > 0xff {
                (Some(primary_of(code)), Some(code))
            } else {
                (Some(code), None)
            }
        }
        (None, None) => (None, None),
    }
}

fn fts_scoped_corruption(obs: &Observation) -> Option<Classification> {
    let (primary, ext) = codes(obs);
    if ext == Some(CORRUPT_VTAB) {
        return Some(Classification {
            cause: Cause::FtsIndex,
            basis: Basis::Code,
        });
    }
    if !obs.has(Evidence::FtsScope) {
        return None;
    }
    // A constraint failure inside the index's shadow tables is index damage too.
    let corrupt_code = primary == Some(CORRUPT) || primary == Some(CONSTRAINT);
    let corrupt_text = primary.is_none() && phrase_is_corrupt(&lower(&obs.message));
    (corrupt_code || corrupt_text).then_some(Classification {
        cause: Cause::FtsIndex,
        basis: Basis::Evidence,
    })
}

/// The cause the codes give, and what it rests on: `code`, or `message`
/// where a generic code is refined by its text.
fn from_codes(obs: &Observation) -> Option<(Cause, Basis)> {
    let (primary, ext) = codes(obs);
    if let Some(ext) = ext {
        let by_ext = match ext {
            READONLY_DBMOVED => Some(Cause::Replaced),
            CORRUPT_SEQUENCE | CORRUPT_INDEX | IOERR_CORRUPTFS => Some(Cause::Corrupt),
            BUSY_RECOVERY | BUSY_SNAPSHOT | BUSY_TIMEOUT => Some(Cause::Locked),
            CONSTRAINT_FOREIGNKEY if obs.operation == Operation::AppendBatch => Some(Cause::SessionRowMissing),
            CONSTRAINT_UNIQUE if obs.operation == Operation::AppendBatch => Some(Cause::UidConflict),
            _ => None,
        };
        if let Some(c) = by_ext {
            return Some((c, Basis::Code));
        }
    }
    let primary = primary?;
    if primary == CANTOPEN && ext.is_none_or(|e| e == CANTOPEN) && contains(&lower(&obs.message), "database is locked")
    {
        // Generic CANTOPEN is `disk` whatever errno says; only a lock named
        // in the text makes it retryable, and then the text is the basis.
        return Some((Cause::Locked, Basis::Message));
    }
    let cause = match primary {
        BUSY | LOCKED | PROTOCOL => Cause::Locked,
        FULL => Cause::DiskFull,
        CORRUPT | NOTADB => Cause::Corrupt,
        IOERR => match obs.errno {
            Some(ENOSPC) | Some(EDQUOT) => Cause::DiskFull,
            _ => Cause::Disk,
        },
        CANTOPEN | READONLY | PERM | AUTH | NOLFS => Cause::Disk,
        // SQLITE_ERROR and the rest say nothing about storage: let the text speak.
        _ => return None,
    };
    Some((cause, Basis::Code))
}

/// Whether a message phrase may refine a result code that says nothing by
/// itself (`SQLITE_ERROR` and the like) into `cause`.
fn phrase_may_refine_code(cause: Cause) -> bool {
    !(crate::decide::is_sticky(cause) || cause == Cause::FtsIndex)
}

fn lower(s: &str) -> String {
    s.to_ascii_lowercase()
}

fn phrase_is_corrupt(m: &str) -> bool {
    ["malformed", "file is not a database", "corrupt"]
        .iter()
        .any(|p| contains(m, p))
}

/// Phrase fallback for hosts without codes. Order matters: a lock first (it
/// is retryable), then corruption, which outranks anything that merely says
/// "disk", then fullness, then the generic storage phrases.
fn from_message(obs: &Observation) -> Option<Cause> {
    // A blank message matches no phrase below, so it ends in `None`.
    let m = lower(&obs.message);
    let any = |ps: &[&str]| ps.iter().any(|p| contains(&m, p));
    if any(&[
        "database is locked",
        "database table is locked",
        "database schema is locked",
        "locking protocol",
    ]) {
        return Some(Cause::Locked);
    }
    if contains(&m, "fts5") && phrase_is_corrupt(&m) {
        return Some(Cause::FtsIndex);
    }
    if phrase_is_corrupt(&m) {
        return Some(Cause::Corrupt);
    }
    if any(&[
        "database or disk is full",
        "disk is full",
        "no space left on device",
        "disk quota exceeded",
    ]) {
        return Some(Cause::DiskFull);
    }
    if obs.operation == Operation::AppendBatch {
        if contains(&m, "foreign key constraint failed") {
            return Some(Cause::SessionRowMissing);
        }
        if contains(&m, "unique constraint failed") {
            return Some(Cause::UidConflict);
        }
    }
    if any(&[
        "disk i/o error",
        "unable to open database file",
        "readonly database",
        "read-only file system",
        "permission denied",
        "too many open files",
        "no such file or directory",
        "is a directory",
        "not a directory",
        "authorization denied",
        // better-sqlite3 checks the folder itself and throws without a code.
        "directory does not exist",
        "cannot open database",
    ]) {
        return Some(Cause::Disk);
    }
    None
}
