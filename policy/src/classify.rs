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
//! A message is read only from SQLite and only without a SQLSTATE (see
//! [`said`]): with a SQLSTATE, the SQLSTATE and the codes the host
//! translated it onto decide alone.
//!
//! `deleted_wal` never comes from a code or a message, and `replaced` comes
//! only from evidence or `SQLITE_READONLY_DBMOVED`.

use crate::codes::*;
use crate::errno::{EDQUOT, ENOSPC};
use crate::model::{Basis, Cause, Classification, Engine, Evidence, Observation, Operation};
#[allow(unused_imports)]
use crate::prelude::*;
use crate::text::find;

/// Classify one observation. Total: every input gets a cause.
pub fn classify(obs: &Observation) -> Classification {
    if let Some(cause) = from_evidence(obs) {
        return Classification {
            cause,
            basis: Basis::Evidence,
        };
    }
    let said = said(obs);
    if let Some(c) = fts_scoped_corruption(obs, said) {
        return c;
    }
    if let Some(cause) = obs.sqlstate.as_deref().and_then(from_sqlstate) {
        return Classification {
            cause,
            basis: Basis::Code,
        };
    }
    if let Some((cause, basis)) = from_codes(obs, said) {
        return Classification { cause, basis };
    }
    if let Some(cause) = from_message(obs.operation, said) {
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

fn fts_scoped_corruption(obs: &Observation, said: u8) -> Option<Classification> {
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
    let corrupt_text = primary.is_none() && said & (says::CORRUPT | says::FTS5_CORRUPT) != 0;
    (corrupt_code || corrupt_text).then_some(Classification {
        cause: Cause::FtsIndex,
        basis: Basis::Evidence,
    })
}

/// The cause the codes give, and what it rests on: `code`, or `message`
/// where a generic code is refined by its text.
fn from_codes(obs: &Observation, said: u8) -> Option<(Cause, Basis)> {
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
    if primary == CANTOPEN && ext.is_none_or(|e| e == CANTOPEN) && said & says::IS_LOCKED != 0 {
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
    !(crate::model::is_sticky(cause) || cause == Cause::FtsIndex)
}

/// What a message's parts name (see [`said`]), one bit each.
mod says {
    pub const LOCK: u8 = 1;
    /// `database is locked` itself: the one lock CANTOPEN's text may name.
    pub const IS_LOCKED: u8 = 2;
    pub const CORRUPT: u8 = 4;
    /// FTS5's label, then a corruption text.
    pub const FTS5_CORRUPT: u8 = 8;
    pub const FULL: u8 = 16;
    pub const FOREIGN_KEY: u8 = 32;
    pub const UNIQUE: u8 = 64;
    pub const DISK: u8 = 128;
}

/// The texts SQLite and the OS give, lower-cased, and what each names.
/// Each is matched as a whole part of a message (see [`said`]), never as
/// a substring: a path, a file or a table may carry any of these words.
/// Which one wins is [`from_message`]'s order, not this table's.
const TEXTS: &[(&str, u8)] = &[
    ("database is locked", says::LOCK | says::IS_LOCKED),
    ("database table is locked", says::LOCK),
    ("database schema is locked", says::LOCK),
    ("locking protocol", says::LOCK),
    ("database disk image is malformed", says::CORRUPT),
    ("file is not a database", says::CORRUPT),
    // SQLite's JSON functions' text, kept from the fallback of hosts
    // without codes.
    ("malformed json", says::CORRUPT),
    ("database or disk is full", says::FULL),
    ("disk is full", says::FULL),
    ("no space left on device", says::FULL),
    ("disk quota exceeded", says::FULL),
    // Read on `append_batch` only; `UNIQUE constraint failed:
    // <table>.<column>` has its detail after the colon.
    ("foreign key constraint failed", says::FOREIGN_KEY),
    ("unique constraint failed", says::UNIQUE),
    ("disk i/o error", says::DISK),
    ("unable to open database file", says::DISK),
    ("attempt to write a readonly database", says::DISK),
    ("access permission denied", says::DISK),
    ("authorization denied", says::DISK),
    ("read-only file system", says::DISK),
    ("permission denied", says::DISK),
    ("too many open files", says::DISK),
    ("no such file or directory", says::DISK),
    ("is a directory", says::DISK),
    ("not a directory", says::DISK),
    // better-sqlite3 checks the folder itself and throws without a code.
    ("cannot open database because the directory does not exist", says::DISK),
];

/// Every text the phrase fallback knows, with the cause it names alone on
/// `append_batch`: for `docs/POLICY.md` (the component never renders it).
pub(crate) fn phrase_causes() -> impl Iterator<Item = (&'static str, Cause)> {
    TEXTS
        .iter()
        .filter_map(|(text, names)| Some((*text, from_message(Operation::AppendBatch, *names)?)))
}

/// Every text the phrase fallback knows, for the vectors that pin each one
/// down inside a path, a table name and a SQLSTATE's message.
#[cfg(not(target_arch = "wasm32"))]
pub fn known_phrases() -> Vec<&'static str> {
    phrase_causes().map(|(text, _)| text).collect()
}

/// What the message says, read in parts as SQLite's texts and the hosts'
/// messages are shaped: the text between `": "` separators, each trimmed.
/// Hosts put their own label before SQLite's text (`sqlite3.OperationalError:
/// database is locked`), SQLite puts a detail after it (`database table is
/// locked: messages`), and a host may add the reason after its own (`unable
/// to open database file: database is locked`). So parts are read from the
/// start while each is a label (one word) or a text of [`TEXTS`]; the first
/// other part is read too, as the sentence it is (`fts5: corruption found
/// ...`), and ends the reading: what follows it is its detail (`no such
/// table: <a table's name>`). A part that names a path (a `/` or `\` in it)
/// ends the reading unread: a path comes after SQLite's text, and may
/// itself hold `": "`.
///
/// Only SQLite's messages are read, and only without a SQLSTATE: with one,
/// the SQLSTATE (and the codes the host translated it onto) decides, and
/// PostgreSQL's texts (`permission denied for table
/// checkpoints_corrupt_backup`) name tables and values no phrase may be
/// read into.
fn said(obs: &Observation) -> u8 {
    if obs.sqlstate.is_some() || obs.engine != Engine::Sqlite {
        return 0;
    }
    let lowered = obs.message.to_ascii_lowercase();
    let mut rest = lowered.as_str();
    let mut said = 0;
    let mut after_fts5 = false;
    loop {
        let (part, next) = match find(rest, ": ") {
            Some(i) => (rest.get(..i).unwrap_or_default(), rest.get(i + 2..)),
            None => (rest, None),
        };
        let part = part.trim_ascii();
        let named = TEXTS.iter().find(|(t, _)| *t == part).map_or(0, |(_, n)| *n);
        // One pass over the part's bytes for both: a plain loop, where two
        // `any` calls would each bring their own search into the component.
        let (mut path, mut label) = (false, true);
        for b in part.bytes() {
            path |= b == b'/' || b == b'\\';
            label &= !b.is_ascii_whitespace();
        }
        if named == 0 && path {
            break;
        }
        // FTS5's texts: `corruption found reading blob ...`, `corruption on page ...`.
        if after_fts5 && (named == says::CORRUPT || part.starts_with("corruption ")) {
            said |= says::FTS5_CORRUPT;
        }
        said |= named;
        after_fts5 = part == "fts5";
        match next {
            Some(n) if named != 0 || label => rest = n,
            _ => break,
        }
    }
    said
}

/// Phrase fallback for hosts without codes. Order matters: a lock first
/// (it is retryable), then corruption, which outranks anything that merely
/// says "disk", then fullness, then the generic storage texts.
fn from_message(operation: Operation, said: u8) -> Option<Cause> {
    let batch = operation == Operation::AppendBatch;
    // A blank message says nothing, so it ends in `None`.
    Some(if said & says::LOCK != 0 {
        Cause::Locked
    } else if said & says::FTS5_CORRUPT != 0 {
        Cause::FtsIndex
    } else if said & says::CORRUPT != 0 {
        Cause::Corrupt
    } else if said & says::FULL != 0 {
        Cause::DiskFull
    } else if batch && said & says::FOREIGN_KEY != 0 {
        Cause::SessionRowMissing
    } else if batch && said & says::UNIQUE != 0 {
        Cause::UidConflict
    } else if said & says::DISK != 0 {
        Cause::Disk
    } else {
        return None;
    })
}
