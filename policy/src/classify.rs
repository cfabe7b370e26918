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
//! [`Text`]): with a SQLSTATE, the SQLSTATE and the codes the host
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
    let lowered = Text::lowered(obs);
    let text = Text::of(&lowered);
    if let Some(c) = fts_scoped_corruption(obs, &text) {
        return c;
    }
    if let Some(cause) = obs.sqlstate.as_deref().and_then(from_sqlstate) {
        return Classification {
            cause,
            basis: Basis::Code,
        };
    }
    if let Some((cause, basis)) = from_codes(obs, &text) {
        return Classification { cause, basis };
    }
    if let Some(cause) = from_message(obs.operation, &text) {
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

fn fts_scoped_corruption(obs: &Observation, text: &Text<'_>) -> Option<Classification> {
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
    let corrupt_text = primary.is_none() && text.says_corrupt();
    (corrupt_code || corrupt_text).then_some(Classification {
        cause: Cause::FtsIndex,
        basis: Basis::Evidence,
    })
}

/// The cause the codes give, and what it rests on: `code`, or `message`
/// where a generic code is refined by its text.
fn from_codes(obs: &Observation, text: &Text<'_>) -> Option<(Cause, Basis)> {
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
    if primary == CANTOPEN && ext.is_none_or(|e| e == CANTOPEN) && text.has("database is locked") {
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

/// The texts SQLite and the OS give, lower-cased, by the cause each names.
/// Each is matched as a whole part of a message (see [`Text`]), never as a
/// substring: a path, a file or a table may carry any of these words.
/// Order matters: a lock first (it is retryable), then corruption, which
/// outranks anything that merely says "disk", then fullness, then the
/// generic storage texts.
const LOCK_TEXTS: &[&str] = &[
    "database is locked",
    "database table is locked",
    "database schema is locked",
    "locking protocol",
];

/// SQLite's texts for a damaged file. "malformed JSON" is SQLite's JSON
/// functions' text, kept from the phrase fallback of hosts without codes.
const CORRUPT_TEXTS: &[&str] = &[
    "database disk image is malformed",
    "file is not a database",
    "malformed json",
];

const FULL_TEXTS: &[&str] = &[
    "database or disk is full",
    "disk is full",
    "no space left on device",
    "disk quota exceeded",
];

const DISK_TEXTS: &[&str] = &[
    "disk i/o error",
    "unable to open database file",
    "attempt to write a readonly database",
    "access permission denied",
    "authorization denied",
    "read-only file system",
    "permission denied",
    "too many open files",
    "no such file or directory",
    "is a directory",
    "not a directory",
    // better-sqlite3 checks the folder itself and throws without a code.
    "cannot open database because the directory does not exist",
];

/// On `append_batch`: SQLite's constraint texts (`UNIQUE constraint
/// failed: <table>.<column>` has its detail after the colon).
const FOREIGN_KEY_TEXT: &str = "foreign key constraint failed";
const UNIQUE_TEXT: &str = "unique constraint failed";

/// FTS5's own label before its texts (`fts5: corruption found reading blob
/// 17 from table "messages_fts"`), and the start of its corruption texts.
const FTS5: &str = "fts5";
const FTS5_CORRUPTION_START: &str = "corruption ";

/// Every text the phrase fallback knows, for the vectors that pin each one
/// down inside a path, a table name and a SQLSTATE's message.
#[cfg(not(target_arch = "wasm32"))]
pub fn known_phrases() -> Vec<&'static str> {
    let mut all = Vec::new();
    for list in [LOCK_TEXTS, CORRUPT_TEXTS, FULL_TEXTS, DISK_TEXTS] {
        all.extend_from_slice(list);
    }
    all.extend_from_slice(&[FOREIGN_KEY_TEXT, UNIQUE_TEXT]);
    all
}

/// A message's parts, as SQLite's texts and the hosts' messages are shaped:
/// the text between `": "` separators, each trimmed. Hosts put their own
/// label before SQLite's text (`sqlite3.OperationalError: database is
/// locked`), SQLite puts a detail after it (`database table is locked:
/// messages`), and a host may add the reason after its own (`unable to open
/// database file: database is locked`). So parts are read from the start
/// while each is a label (one word) or a text the fallback knows; the first
/// other part is read too, as the sentence it is, and ends the reading:
/// what follows it is its detail (`no such table: <a table's name>`). A
/// part that names a path (a `/` or `\` in it) ends the reading unread: a
/// path comes after SQLite's text, and may itself hold `": "`.
///
/// Only SQLite's messages are read, and only without a SQLSTATE: with one,
/// the SQLSTATE (and the codes the host translated it onto) decides, and
/// PostgreSQL's texts (`permission denied for table
/// checkpoints_corrupt_backup`) name tables and values no phrase may be
/// read into.
pub(crate) struct Text<'a> {
    parts: Vec<&'a str>,
}

impl<'a> Text<'a> {
    /// The message, lower-cased, if it may speak; else nothing to read.
    fn lowered(obs: &Observation) -> String {
        if obs.sqlstate.is_none() && obs.engine == Engine::Sqlite {
            obs.message.to_ascii_lowercase()
        } else {
            String::new()
        }
    }

    fn of(lowered: &'a str) -> Text<'a> {
        let mut parts = Vec::new();
        let mut rest = lowered;
        loop {
            let (part, next) = match find(rest, ": ") {
                Some(i) => (rest.get(..i).unwrap_or_default(), rest.get(i + 2..)),
                None => (rest, None),
            };
            let part = part.trim_ascii();
            let known = known(part);
            if !known && part.bytes().any(|b| b == b'/' || b == b'\\') {
                break;
            }
            parts.push(part);
            let label = !part.bytes().any(|b| b.is_ascii_whitespace());
            match next {
                Some(n) if known || label => rest = n,
                _ => break,
            }
        }
        Text { parts }
    }

    /// Whether `phrase` is a whole part.
    fn has(&self, phrase: &str) -> bool {
        self.parts.contains(&phrase)
    }

    fn any(&self, phrases: &[&str]) -> bool {
        phrases.iter().any(|p| self.has(p))
    }

    fn says_corrupt(&self) -> bool {
        self.any(CORRUPT_TEXTS) || self.fts5_corruption()
    }

    /// `fts5: corruption ...`, or FTS5's label before a corruption text.
    fn fts5_corruption(&self) -> bool {
        self.parts.windows(2).any(|w| match w {
            [label, text] => {
                *label == FTS5 && (text.starts_with(FTS5_CORRUPTION_START) || CORRUPT_TEXTS.contains(text))
            }
            _ => false,
        })
    }
}

/// Whether a part is one of the texts the fallback knows (so a `/` in it,
/// as in `disk i/o error`, is no path).
fn known(part: &str) -> bool {
    [LOCK_TEXTS, CORRUPT_TEXTS, FULL_TEXTS, DISK_TEXTS]
        .iter()
        .any(|l| l.contains(&part))
}

/// Phrase fallback for hosts without codes, in the order of the lists.
fn from_message(operation: Operation, text: &Text<'_>) -> Option<Cause> {
    // A blank message has one blank part, which names nothing.
    if text.any(LOCK_TEXTS) {
        return Some(Cause::Locked);
    }
    if text.fts5_corruption() {
        return Some(Cause::FtsIndex);
    }
    if text.says_corrupt() {
        return Some(Cause::Corrupt);
    }
    if text.any(FULL_TEXTS) {
        return Some(Cause::DiskFull);
    }
    if operation == Operation::AppendBatch {
        if text.has(FOREIGN_KEY_TEXT) {
            return Some(Cause::SessionRowMissing);
        }
        if text.has(UNIQUE_TEXT) {
            return Some(Cause::UidConflict);
        }
    }
    if text.any(DISK_TEXTS) {
        return Some(Cause::Disk);
    }
    None
}
