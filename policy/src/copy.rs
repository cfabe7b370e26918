//! User-facing copy, built only from the outcome: cause, outcome, the
//! receipt's path or none, the session id, and the divert failure if any.
//!
//! Two rules hold by construction and are pinned by snapshots and tests:
//! "A copy was kept" appears only in a `diverted` copy, which cannot be
//! built without a receipt path; and no other copy names any divert file.
//! A failed divert is described by its operation and errno, never its path.

use crate::decide::is_producible;
use crate::errno;
use crate::model::{Cause, Copy, CopyContext, DivertFailure, Outcome};

/// Why a copy could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyError {
    /// The action table never produces this (cause, outcome) pair.
    NotProducible { cause: Cause, outcome: Outcome },
    /// A `diverted` copy needs the receipt's path.
    MissingReceipt,
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::NotProducible { cause, outcome } => write!(
                f,
                "the action table never produces outcome `{}` for cause `{}`",
                outcome.label(),
                cause.label()
            ),
            CopyError::MissingReceipt => f.write_str("a `diverted` copy needs the receipt path"),
        }
    }
}

impl std::error::Error for CopyError {}

/// What happened, in words a user of an agent runtime understands.
fn reason(cause: Cause) -> &'static str {
    match cause {
        Cause::Locked => "another process kept the session database locked",
        Cause::Disk => "the session database could not be opened or written",
        Cause::DiskFull => "the disk holding the session database is full",
        Cause::Replaced => "the session database file was moved or replaced while it was open",
        Cause::DeletedWal => "the session database's write-ahead log was deleted or replaced while it was open",
        Cause::Corrupt => "the session database is damaged",
        Cause::FtsIndex => "the search index of the session database is damaged",
        Cause::TurnLease => "another process took over this conversation turn",
        Cause::Compression => "the session was being compacted",
        Cause::CompressionClosed => "compaction closed this session and continued it in a new one",
        Cause::SessionRowMissing => "the session's record was missing from the database",
        Cause::UidConflict => "a message with the same id but different content is already stored",
        Cause::Unknown => "an unexpected storage error occurred",
    }
}

/// What turnsafe did that made a `persisted` outcome possible.
fn remedy(cause: Cause) -> &'static str {
    match cause {
        Cause::Locked | Cause::Compression => "waited and tried again",
        Cause::FtsIndex => "saved them without updating the search index, which is marked for rebuild",
        Cause::CompressionClosed => "saved them to the continuation session",
        Cause::SessionRowMissing => "recreated the session record",
        _ => "tried again",
    }
}

/// What an operator can do about a cause, whatever the outcome.
pub fn cause_remediation(cause: Cause) -> Vec<String> {
    cause_steps(cause).into_iter().map(String::from).collect()
}

fn cause_steps(cause: Cause) -> Vec<&'static str> {
    match cause {
        Cause::Locked => {
            vec!["Check for another process writing the same state.db (`turnsafe doctor`)."]
        }
        Cause::Compression => vec!["Let the compaction finish before the next turn."],
        Cause::Disk => vec![
            "Check that the session directory exists and is writable, and the open-file limit (`ulimit -n`).",
            "Run `turnsafe doctor` for holders, the fd limit and free space.",
        ],
        Cause::DiskFull => vec![
            "Free space on the disk that holds state.db.",
            "Run `turnsafe doctor` to see free space.",
        ],
        Cause::Replaced | Cause::DeletedWal => vec![
            "Stop every process using this state.db; turnsafe will not write to it again from this handle.",
            "The retired generation was captured next to state.db; inspect it with `turnsafe recover --source <capture> --inspect-only`.",
        ],
        Cause::Corrupt => vec![
            "Stop writing to this state.db.",
            "Run `turnsafe recover --source state.db --output <new.db>` to copy what is readable into a fresh database.",
        ],
        Cause::FtsIndex => {
            vec!["Rebuild the search index with `turnsafe doctor --repair-fts` when no writer is running."]
        }
        Cause::TurnLease => vec![
            "Let the process that now holds this turn finish; send the messages again in a later turn if they are still needed.",
        ],
        Cause::CompressionClosed => vec!["Continue the conversation in the continuation session."],
        Cause::SessionRowMissing => vec!["Run `turnsafe doctor` if sessions keep disappearing."],
        Cause::UidConflict => vec!["Send the message with a new uid, or resend it unchanged."],
        Cause::Unknown => vec!["Run `turnsafe doctor` and report the details below."],
    }
}

fn remediation(cause: Cause, outcome: Outcome) -> Vec<String> {
    let mut steps = cause_steps(cause);
    match outcome {
        Outcome::Persisted => steps.clear(),
        Outcome::Diverted => steps.push("When storage is fixed, run `turnsafe replay` to import the kept copy."),
        Outcome::DivertFailed => {
            steps.push("Fix the cause above for the session folder too, then send the messages again.")
        }
        Outcome::HandedBack => {}
    }
    steps.into_iter().map(String::from).collect()
}

/// A divert failure's operation is a short word (`open`, `fsync`, ...).
/// Anything else could carry a path, so it is not repeated.
fn safe_operation(op: &str) -> &str {
    let ok = !op.is_empty() && op.len() <= 32 && op.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    if ok { op } else { "write" }
}

/// Read a host's free-form divert error (`"open: EMFILE"`, `"fsync:28"`,
/// `"Permission denied (os error 13)"`) down to operation and errno. Any
/// path or other text in it is dropped.
pub fn parse_divert_failure(text: &str) -> DivertFailure {
    let lower = text.to_ascii_lowercase();
    let operation = lower
        .split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
        .find(|w| KNOWN_DIVERT_OPS.contains(w))
        .unwrap_or("write")
        .to_string();
    let mut errno_value = None;
    if let Some(i) = lower.find("os error ") {
        let digits: String = lower[i + 9..].chars().take_while(|c| c.is_ascii_digit()).collect();
        errno_value = digits.parse().ok();
    }
    if errno_value.is_none() {
        errno_value = text.split(|c: char| !c.is_ascii_alphanumeric()).find_map(|w| {
            if w.len() > 1 && w.starts_with('E') && w.bytes().all(|b| b.is_ascii_uppercase()) {
                errno::from_name(w)
            } else {
                None
            }
        });
    }
    if errno_value.is_none() && !text.contains('/') {
        errno_value = text
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty() && w.len() <= 4)
            .find_map(|w| w.parse().ok());
    }
    DivertFailure {
        operation,
        errno: errno_value,
    }
}

/// The effects of a divert, by the names hosts report them with.
pub const KNOWN_DIVERT_OPS: &[&str] = &[
    "validate",
    "mkdir",
    "open",
    "lock",
    "stat",
    "encode",
    "write",
    "fsync",
    "fsync_dir",
];

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Build the copy for an outcome.
pub fn explain(cause: Cause, outcome: Outcome, ctx: &CopyContext) -> Result<Copy, CopyError> {
    if !is_producible(cause, outcome) {
        return Err(CopyError::NotProducible { cause, outcome });
    }
    let why = capitalise(reason(cause));
    let (title, body) = match outcome {
        Outcome::Persisted => (
            "Messages saved after a retry".to_string(),
            format!("{why}; turnsafe {} and this turn's messages were saved.", remedy(cause)),
        ),
        Outcome::Diverted => {
            let path = ctx.receipt_path.as_deref().ok_or(CopyError::MissingReceipt)?;
            (
                "Messages not saved to the database; a copy was kept".to_string(),
                format!(
                    "{why}, so this turn's messages were not saved to the session database. \
                     A copy was kept at {path}."
                ),
            )
        }
        Outcome::DivertFailed => {
            let failure = match &ctx.divert_failure {
                Some(f) => match f.errno {
                    Some(e) => format!(" ({}: {})", safe_operation(&f.operation), errno::human(e)),
                    None => format!(" ({})", safe_operation(&f.operation)),
                },
                None => String::new(),
            };
            (
                "Messages not saved, and no copy could be kept".to_string(),
                format!(
                    "{why}, so this turn's messages were not saved to the session database. \
                     Writing a backup copy failed too{failure}. The messages were handed back \
                     to the caller; they are not stored anywhere."
                ),
            )
        }
        Outcome::HandedBack => (
            "Messages not saved".to_string(),
            format!(
                "{why}, so this turn's messages were not saved and no copy was made. \
                 They were handed back to the caller."
            ),
        ),
    };
    let mut details = Vec::new();
    if let Some(s) = &ctx.session {
        details.push(("session".to_string(), s.clone()));
    }
    if outcome == Outcome::Diverted
        && let Some(p) = &ctx.receipt_path
    {
        details.push(("receipt_path".to_string(), p.clone()));
    }
    if outcome == Outcome::DivertFailed
        && let Some(f) = &ctx.divert_failure
    {
        details.push(("divert_operation".to_string(), safe_operation(&f.operation).to_string()));
        if let Some(e) = f.errno {
            details.push(("divert_errno".to_string(), errno::human(e)));
        }
    }
    if let Some(e) = ctx.errno
        && outcome != Outcome::Persisted
    {
        details.push(("errno".to_string(), errno::human(e)));
    }
    Ok(Copy {
        code: format!("{}.{}", cause.label(), outcome.label()),
        cause,
        outcome,
        title,
        body,
        remediation: remediation(cause, outcome),
        details,
    })
}
