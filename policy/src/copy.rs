//! User-facing copy, built only from the outcome: cause, outcome, the
//! receipt's path or none, the capture's receipt or its failure, a divert's
//! residue, the session id, and the divert failure if any.
//!
//! Rules that hold by construction and are pinned by snapshots and tests:
//! - "A copy was kept" appears only in a `diverted` copy, which cannot be
//!   built without a receipt path; no other copy names any divert file. A
//!   failed divert is described by its operation and errno, never its path.
//! - A copy says the retired generation was captured, and where, only when
//!   the context carries a capture receipt. A failed capture is told as
//!   failed, with what the operator should do instead.
//! - A failed divert that may have left lines behind never says the
//!   messages are "not stored anywhere".
//! - A `persisted` copy says "saved" only of commits the host syncs
//!   ([`Durability::Synced`]); an unsynced commit is told as written, not
//!   yet safe from a power cut.
//! - The copy of a failure from PostgreSQL ([`Engine::Postgres`]) names no
//!   SQLite command or file (`turnsafe recover`, `turnsafe capture`,
//!   `--repair-fts`, state.db, the fd limit): its steps are PostgreSQL's,
//!   and `turnsafe doctor` and `turnsafe replay` take `--db URL`.
//! - A batch whose COMMIT failed after its write ([`crate::possibly_written`])
//!   is told as not in the database now and possibly written, never as
//!   not saved.

use crate::decide::is_producible;
use crate::errno;
use crate::lease::LeaseHolder;
use crate::model::{CaptureFailure, Cause, Copy, CopyContext, DivertFailure, Durability, Engine, Outcome, TlsFailure};
#[allow(unused_imports)]
use crate::prelude::*;
use crate::text::{cat, find};

/// Why a copy could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyError {
    /// The action table never produces this (cause, outcome) pair.
    NotProducible { cause: Cause, outcome: Outcome },
    /// A `diverted` copy needs the divert receipt.
    MissingReceipt,
    /// The receipt given is not a whole one (why).
    InvalidReceipt(&'static str),
}

impl CopyError {
    /// What `Display` prints, built without `core::fmt` for the component.
    pub fn message(&self) -> String {
        match self {
            CopyError::NotProducible { cause, outcome } => cat(&[
                "the action table never produces outcome `",
                outcome.label(),
                "` for cause `",
                cause.label(),
                "`",
            ]),
            CopyError::MissingReceipt => "a `diverted` copy needs the divert receipt".into(),
            CopyError::InvalidReceipt(why) => cat(&["the divert receipt is not whole: ", why]),
        }
    }
}

impl core::fmt::Display for CopyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.message())
    }
}

impl core::error::Error for CopyError {}

/// A failed file operation, as the copy names it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailedOp<'a> {
    pub(crate) operation: &'a str,
    pub(crate) errno: Option<i64>,
}

/// What a copy may mention: a [`CopyContext`] borrowed. The flush machine
/// builds one from the outcome it owns, so the copy costs no copies of
/// paths, ids or failures (only a capture's path shapes the copy, so that
/// is all it keeps of a capture receipt).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Facts<'a> {
    pub(crate) session: Option<&'a str>,
    pub(crate) receipt_path: Option<&'a str>,
    pub(crate) divert_failure: Option<FailedOp<'a>>,
    pub(crate) errno: Option<i64>,
    pub(crate) capture_path: Option<&'a str>,
    pub(crate) capture_failure: Option<FailedOp<'a>>,
    pub(crate) divert_residue: bool,
    /// The unsettled capture that kept the batch from the database.
    pub(crate) pending_capture: Option<&'a str>,
    /// How the host's commits reach the disk.
    pub(crate) durability: Durability,
    /// Why the connection failed its TLS handshake, for a `disk` copy.
    pub(crate) tls: Option<TlsFailure>,
    /// The engine the failure came from: the steps a copy names are its own.
    pub(crate) engine: Engine,
    /// The holder of the lease that fenced a `turn_lease` write.
    pub(crate) lease: Option<&'a LeaseHolder>,
}

impl<'a> Facts<'a> {
    fn of(ctx: &'a CopyContext) -> Facts<'a> {
        Facts {
            session: ctx.session.as_deref(),
            receipt_path: ctx.receipt.as_ref().map(|r| r.path.as_str()),
            divert_failure: ctx.divert_failure.as_ref().map(|f| FailedOp {
                operation: &f.operation,
                errno: f.errno,
            }),
            errno: ctx.errno,
            capture_path: ctx.capture_receipt.as_ref().map(|r| r.path.as_str()),
            capture_failure: ctx.capture_failure.as_ref().map(|f| FailedOp {
                operation: &f.operation,
                errno: f.errno,
            }),
            divert_residue: ctx.divert_residue.is_some(),
            pending_capture: ctx.pending_capture.as_deref(),
            durability: ctx.durability,
            tls: None,
            engine: ctx.engine,
            lease: ctx.lease.as_ref(),
        }
    }
}

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
        Cause::TurnLease => "another process holds this conversation turn",
        Cause::Compression => "the session was being compacted",
        Cause::CompressionClosed => "compaction closed this session and continued it in a new one",
        Cause::SessionRowMissing => "the session's record was missing from the database",
        Cause::UidConflict => "a message with the same id but different content is already stored",
        Cause::Unavailable => "the database server could not be reached",
        Cause::ReadOnly => "the database server accepted no writes (a standby, as during a failover)",
        Cause::OutcomeUnknown => "the connection to the database server was lost while the save was being committed",
        Cause::Unknown => "an unexpected storage error occurred",
    }
}

/// [`reason`] as a sentence's start.
pub(crate) fn reason_capitalised(cause: Cause) -> String {
    capitalise(reason(cause))
}

/// What turnsafe did that made a `persisted` outcome possible.
// "Wrote", never "saved": whether the write is safe from a power cut is
// the outcome's to say (see `Durability`).
fn remedy(cause: Cause) -> &'static str {
    match cause {
        Cause::Locked | Cause::Compression => "waited and tried again",
        Cause::FtsIndex => "wrote them without updating the search index, which is marked for rebuild",
        Cause::CompressionClosed => "wrote them to the continuation session",
        Cause::SessionRowMissing => "recreated the session record",
        Cause::Unavailable | Cause::ReadOnly => "reconnected and tried again",
        Cause::OutcomeUnknown => "reconnected and looked each message up by its id,",
        _ => "tried again",
    }
}

/// What an operator does about a connection that failed its TLS handshake
/// ([`TlsFailure`]): a `disk` copy's first step, and `turnsafe doctor`'s.
pub const TLS_REMEDIATION: &str = "Set the URL's `sslmode` to fit the server: `require` (the default) needs TLS with a \
                                   certificate that `sslrootcert` (a CA file) verifies; `disable` is plaintext, for \
                                   loopback only.";

/// What an operator can do about a cause, whatever the outcome.
pub fn cause_remediation(cause: Cause) -> Vec<String> {
    crate::collect::map(cause_steps(cause), |s| String::from(*s))
}

/// Static slices, not vectors: the component keeps one table of them
/// instead of code that builds each list.
fn cause_steps(cause: Cause) -> &'static [&'static str] {
    match cause {
        Cause::Locked => &["Check for another process writing the same state.db (`turnsafe doctor`)."],
        Cause::Compression => &["Let the compaction finish before the next turn."],
        Cause::Disk => &[
            "Check that the session directory exists and is writable, and the open-file limit (`ulimit -n`).",
            "Run `turnsafe doctor` for holders, the fd limit and free space.",
        ],
        Cause::DiskFull => &[
            "Free space on the disk that holds state.db.",
            "Run `turnsafe doctor` to see free space.",
        ],
        Cause::Replaced | Cause::DeletedWal => {
            &["Stop every process using this state.db; turnsafe will not write to it again from this handle."]
        }
        Cause::Corrupt => &[
            "Stop writing to this state.db.",
            "Run `turnsafe recover --source state.db --output <new.db>` to copy what is readable into a fresh database.",
        ],
        Cause::FtsIndex => &["Rebuild the search index with `turnsafe doctor --repair-fts` when no writer is running."],
        Cause::TurnLease => &[
            "The turn's lease ends when its holder exits or stops renewing it; send the messages again after that if \
             they are still needed.",
        ],
        Cause::CompressionClosed => &["Continue the conversation in the continuation session."],
        Cause::SessionRowMissing => &["Run `turnsafe doctor` if sessions keep disappearing."],
        Cause::UidConflict => &["Send the message with a new uid, or resend it unchanged."],
        Cause::Unavailable => {
            &["Check that the database server is running and reachable (`turnsafe doctor --db URL`)."]
        }
        Cause::ReadOnly => &[
            "Point the URL at the primary, or list every server with `target_session_attrs=read-write` so a \
             failover is followed.",
        ],
        Cause::OutcomeUnknown => &[
            "Check that the database server is reachable; `turnsafe replay` then stores each kept message once, \
             and settles as a duplicate any message the lost commit did store.",
        ],
        Cause::Unknown => &["Run `turnsafe doctor` and report the details below."],
    }
}

/// [`cause_steps`] for a store on `engine`. PostgreSQL's name no SQLite
/// command or file: no `turnsafe recover` (it reads SQLite files), no
/// `--repair-fts`, no state.db, no fd limit (a connection is one socket),
/// and `turnsafe doctor` with `--db`, which examines the server instead.
fn steps_on(cause: Cause, engine: Engine) -> &'static [&'static str] {
    if engine == Engine::Sqlite {
        return cause_steps(cause);
    }
    match cause {
        Cause::Locked => &[
            "Check for another process writing the same sessions (`turnsafe doctor --db URL` lists the \
             live turn leases).",
        ],
        Cause::Disk => &[
            "Check that the URL names a database that exists, a user that may connect and a readable \
             `sslrootcert`, then run `turnsafe doctor --db URL`.",
        ],
        Cause::DiskFull => &["Free space on the disk or tablespace that holds the PostgreSQL database."],
        Cause::Replaced | Cause::DeletedWal => &[
            "Check which database the URL leads to now (a failover to a fresh server, a restore); turnsafe will not \
             write to it again from this handle.",
        ],
        Cause::Corrupt => &[
            "Stop writing to this database.",
            "Have its administrator restore it from a backup, or rebuild a damaged index with `REINDEX`.",
        ],
        Cause::FtsIndex => {
            &["Run `turnsafe doctor --db URL` to see the messages the search index has not caught up with."]
        }
        Cause::SessionRowMissing => &["Run `turnsafe doctor --db URL` if sessions keep disappearing."],
        Cause::OutcomeUnknown => &[
            "Check that the database server is reachable; `turnsafe replay --db URL` then stores each kept message \
             once, and settles as a duplicate any message the lost commit did store.",
        ],
        Cause::Unknown => &["Run `turnsafe doctor --db URL` and report the details below."],
        _ => cause_steps(cause),
    }
}

/// `written`: an attempt failed at or after its COMMIT's write.
fn remediation(cause: Cause, outcome: Outcome, ctx: &Facts<'_>, written: bool) -> Vec<String> {
    if outcome == Outcome::Persisted {
        return match ctx.durability {
            Durability::Synced => Vec::new(),
            Durability::Unsynced => alloc::vec![String::from(match ctx.engine {
                Engine::Sqlite => {
                    "To keep turns across a power cut, use synchronous=FULL (the default; PostgreSQL: \
                     synchronous_commit=on)."
                }
                Engine::Postgres => "To keep turns across a power cut, use synchronous_commit=on (the default).",
            })],
        };
    }
    if let Some(path) = ctx.pending_capture {
        return pending_capture_steps(outcome, path);
    }
    if cause == Cause::TurnLease
        && let Some(holder) = ctx.lease
    {
        return alloc::vec![holder.remedy()];
    }
    // With the capture failed, the retired frames live only in the writer's
    // open files: stopping it first would destroy them, so that step comes
    // after the one that keeps them. (Not on PostgreSQL: no frames there.)
    let sqlite = ctx.engine == Engine::Sqlite;
    let capture_lost = sqlite && ctx.capture_path.is_none() && ctx.capture_failure.is_some();
    let mut steps = if capture_lost && crate::model::needs_capture(cause) {
        Vec::new()
    } else {
        // Not the disk's steps when the server and the URL disagree on TLS.
        let steps = if ctx.tls.is_some() {
            &[TLS_REMEDIATION]
        } else {
            steps_on(cause, ctx.engine)
        };
        crate::collect::map(steps, |s| String::from(*s))
    };
    // What the operator does about the retired generation depends on what
    // is really on disk: a receipt, a failed capture, or nothing known. A
    // PostgreSQL store keeps no generation on the host's disk: nothing to
    // capture, so nothing to say of one unless one was captured.
    match (ctx.capture_path, ctx.capture_failure) {
        (Some(path), _) => steps.push(cat(&[
            "The retired generation was captured at ",
            path,
            "; inspect it with `turnsafe recover --source ",
            path,
            " --inspect-only`.",
        ])),
        (None, Some(_)) if sqlite => {
            steps.push(
                "Before you stop any process, run `turnsafe capture --pid <pid> --home <home>` for each pid \
                 `turnsafe doctor` names as holding a deleted state.db file: its open files hold the only copy."
                    .to_string(),
            );
            if crate::model::needs_capture(cause) {
                steps.push("Then stop every process using this state.db.".to_string());
            }
        }
        (None, None) if sqlite && crate::model::needs_capture(cause) => steps.push(
            "Run `turnsafe doctor` to list any capture of the retired generation before anything else touches state.db."
                .to_string(),
        ),
        _ => {}
    }
    match outcome {
        Outcome::Persisted | Outcome::HandedBack => {}
        // Replay refuses while a capture is unsettled: the capture's rows
        // come first, or the diverted ones would leave a hole before them.
        Outcome::Diverted => steps.push(match ctx.capture_path {
            Some(path) => cat(&[
                "Settle the capture first with `turnsafe recover --source ",
                path,
                " --output <new.db> --install --home ",
                home_of(path),
                "` (or `turnsafe recover --source ",
                path,
                " --dismiss` if its frames do not matter), then run `turnsafe replay --home ",
                home_of(path),
                "` to import the kept copy.",
            ]),
            None if !sqlite => "When storage is fixed, run `turnsafe replay --db URL` to import the kept copy.".into(),
            None if crate::model::needs_capture(cause) => "When storage is fixed and every capture `turnsafe doctor` \
                lists is settled, run `turnsafe replay` to import the kept copy."
                .into(),
            // Replay compares each kept message's bytes with what its uid holds.
            None if written => "When storage is fixed, run `turnsafe replay` to import the kept copy: it stores each \
                message once, and settles as a duplicate any message the database holds again."
                .into(),
            None => "When storage is fixed, run `turnsafe replay` to import the kept copy.".into(),
        }),
        Outcome::DivertFailed if ctx.divert_residue => steps.push(cat(&[
            "Some lines of this turn may remain in the session's divert file: when you send the messages again, \
             send them with the uids this outcome lists, so that a later `",
            if sqlite {
                "turnsafe replay"
            } else {
                "turnsafe replay --db URL"
            },
            "` cannot store them twice.",
        ])),
        // Whether the commit was lost (PostgreSQL) or failed after its write
        // (SQLite), a resend with the same uids stores each message once.
        Outcome::DivertFailed if cause == Cause::OutcomeUnknown || written => steps.push(
            "Fix the cause above for the session folder too, then send the messages again with the uids this \
             outcome lists: any the commit stored count as stored, and none is stored twice."
                .into(),
        ),
        Outcome::DivertFailed => {
            steps.push("Fix the cause above for the session folder too, then send the messages again.".into())
        }
    }
    steps
}

/// The folder a capture sits in (its home): the path up to its last `/`.
fn home_of(capture: &str) -> &str {
    // Bytes, not a `char` search: it keeps `memchr` out of the component.
    match capture.bytes().rposition(|b| b == b'/') {
        Some(0) => "/",
        Some(i) => capture.get(..i).unwrap_or("."),
        None => ".",
    }
}

/// What settles an unsettled capture that holds this session's rows, and
/// what then brings the kept copy in.
fn pending_capture_steps(outcome: Outcome, path: &str) -> Vec<String> {
    let home = home_of(path);
    let mut steps = Vec::new();
    steps.push(cat(&[
        "Settle the capture (until then this session's batches stay out of the database): `turnsafe recover \
         --source ",
        path,
        " --output <new.db> --install --home ",
        home,
        "`, or `turnsafe recover --source ",
        path,
        " --dismiss` if its rows do not matter.",
    ]));
    match outcome {
        Outcome::Diverted => steps.push(cat(&["Then run `turnsafe replay --home ", home, "`."])),
        Outcome::DivertFailed => steps.push("Then send the messages again.".into()),
        Outcome::Persisted | Outcome::HandedBack => {}
    }
    steps
}

/// A failure's operation is a short word (`open`, `fsync`, ...).
/// Anything else could carry a path, so it is not repeated.
fn safe_operation(op: &str) -> &str {
    let ok = !op.is_empty() && op.len() <= 32 && op.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    if ok { op } else { "write" }
}

/// `op: human errno`, or just `op`, for a failed file operation.
fn failed_step(operation: &str, errno: Option<i64>) -> String {
    match errno {
        Some(e) => cat(&[safe_operation(operation), ": ", &errno::human(e)]),
        None => safe_operation(operation).to_string(),
    }
}

/// The digits after `marker` in `lower`, if any.
fn number_after(lower: &str, marker: &str) -> Option<i64> {
    let i = find(lower, marker)?;
    // `get`, not indexing: a slice that cannot fail needs no panic path.
    let rest = lower.get(i + marker.len()..)?;
    // The spaces skipped by bytes: `trim_start_matches(' ')` decodes chars.
    let start = rest.bytes().position(|b| b != b' ').unwrap_or(rest.len());
    let end = rest
        .bytes()
        .skip(start)
        .position(|b| !b.is_ascii_digit())
        .map_or(rest.len(), |n| start + n);
    crate::text::parse_i64(rest.get(start..end)?)
}

/// Read a host's free-form divert error (`"open: EMFILE"`, `"fsync:28"`,
/// `"Permission denied (os error 13)"`, Python's `"[Errno 24] Too many open
/// files: '/x'"`) down to operation and errno. Any path or other text in it
/// is dropped.
pub fn parse_divert_failure(text: &str) -> DivertFailure {
    let (operation, errno) = parse_failure(text, KNOWN_DIVERT_OPS);
    DivertFailure { operation, errno }
}

/// Read a host's free-form capture error (`"mkdir: ENOENT"`,
/// `"capture of the retired generation failed at fsync: EIO"`) down to the
/// step and errno, as [`parse_divert_failure`] does for diverts.
pub fn parse_capture_failure(text: &str) -> CaptureFailure {
    let (operation, errno) = parse_failure(text, KNOWN_CAPTURE_OPS);
    CaptureFailure { operation, errno }
}

fn parse_failure(text: &str, known: &[&str]) -> (String, Option<i64>) {
    let lower = text.to_ascii_lowercase();
    let operation = first_word(&lower, Word::Operation(known))
        .unwrap_or("write")
        .to_string();
    // Rust's io::Error and Python's OSError say which number is the errno;
    // a path in the rest of the text does not matter then.
    let mut errno_value = number_after(&lower, "os error ").or_else(|| number_after(&lower, "[errno "));
    if errno_value.is_none() {
        errno_value = first_word(text, Word::ErrnoName).and_then(errno::from_name);
    }
    // Bytes, not `contains('/')`: a `char` search brings `memchr` along.
    if errno_value.is_none() && !text.bytes().any(|b| b == b'/') {
        errno_value = first_word(text, Word::Number).and_then(crate::text::parse_i64);
    }
    (operation, errno_value)
}

/// The words [`first_word`] looks for.
#[derive(Clone, Copy)]
enum Word<'a> {
    /// One of these operations, in lower case (`a-z` and `_`).
    Operation(&'a [&'a str]),
    /// A known errno's name (`EMFILE`), among letters and digits.
    ErrnoName,
    /// One to four digits.
    Number,
}

/// The first word of `text` of the kind `word` says: a longest run of the
/// bytes the kind is made of, which it then accepts. Bytes, not `split`
/// with a `char` predicate: one loop instead of a decoding iterator per
/// predicate in the component. Every byte a word is made of is ASCII, so
/// each word starts and ends on a `char` boundary, and the words are those
/// `split` gives.
fn first_word<'t>(text: &'t str, word: Word<'_>) -> Option<&'t str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    // `+ 1`, not `..=`: a `RangeInclusive` costs the component its own iterator.
    for end in 0..bytes.len() + 1 {
        let part = bytes.get(end).is_some_and(|&b| match word {
            Word::Operation(_) => b.is_ascii_lowercase() || b == b'_',
            Word::ErrnoName => b.is_ascii_alphanumeric(),
            Word::Number => b.is_ascii_digit(),
        });
        if part {
            continue;
        }
        let picked = text.get(start..end).filter(|w| match word {
            _ if w.is_empty() => false,
            Word::Operation(known) => known.contains(w),
            Word::ErrnoName => {
                w.len() > 1
                    && w.starts_with('E')
                    && w.bytes().all(|b| b.is_ascii_uppercase())
                    && errno::from_name(w).is_some()
            }
            Word::Number => w.len() <= 4,
        });
        if picked.is_some() {
            return picked;
        }
        start = end + 1;
    }
    None
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
    "truncate",
];

/// The steps of a capture, by the names hosts report them with.
pub const KNOWN_CAPTURE_OPS: &[&str] = &[
    "mkdir",
    "read",
    "create",
    "write",
    "fsync",
    "rename",
    "manifest",
    "fsync_dir",
];

/// The reason with its first letter in capitals. Every reason is ASCII,
/// so an ASCII upper-case is enough, and it keeps the Unicode case tables
/// (several kilobytes) out of the component.
fn capitalise(s: &str) -> String {
    let mut out = String::from(s);
    if let Some(first) = out.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    out
}

/// The copy's details, in a fixed order: only what this outcome may name.
/// `written`: an attempt failed at or after its COMMIT's write.
fn details(outcome: Outcome, ctx: &Facts<'_>, written: bool) -> Vec<(String, String)> {
    let mut details = Vec::new();
    let mut add = |key: &str, value: &str| details.push((String::from(key), String::from(value)));
    if let Some(s) = ctx.session {
        add("session", s);
    }
    if outcome == Outcome::Diverted
        && let Some(p) = ctx.receipt_path
    {
        add("receipt_path", p);
    }
    if outcome == Outcome::DivertFailed
        && let Some(f) = ctx.divert_failure
    {
        add("divert_operation", safe_operation(f.operation));
        if let Some(e) = f.errno {
            add("divert_errno", &errno::human(e));
        }
    }
    if outcome == Outcome::DivertFailed && ctx.divert_residue {
        add("divert_residue", "possible");
    }
    if outcome != Outcome::Persisted
        && let Some(p) = ctx.pending_capture
    {
        add("pending_capture", p);
    }
    if outcome != Outcome::Persisted {
        if let Some(path) = ctx.capture_path {
            add("capture_path", path);
        } else if let Some(f) = ctx.capture_failure {
            add("capture_operation", safe_operation(f.operation));
            if let Some(e) = f.errno {
                add("capture_errno", &errno::human(e));
            }
        }
    }
    if let Some(e) = ctx.errno
        && outcome != Outcome::Persisted
    {
        add("errno", &errno::human(e));
    }
    if let Some(t) = ctx.tls {
        add("tls", t.text());
    }
    if written && outcome != Outcome::Persisted {
        add("commit", "possibly written");
    }
    if let Some(holder) = ctx.lease {
        holder.details(&mut add);
    }
    details
}

/// Build the copy for an outcome.
pub fn explain(cause: Cause, outcome: Outcome, ctx: &CopyContext) -> Result<Copy, CopyError> {
    explain_tls(cause, outcome, ctx, None, false)
}

/// [`explain`] for a failure whose message named a TLS reason (see
/// [`TlsFailure::of`]; it shapes only a `disk` copy), or that came at or
/// after its COMMIT's write (`possibly_written`, see [`crate::possibly_written`]).
pub(crate) fn explain_tls(
    cause: Cause,
    outcome: Outcome,
    ctx: &CopyContext,
    tls: Option<TlsFailure>,
    possibly_written: bool,
) -> Result<Copy, CopyError> {
    if let Some(r) = &ctx.receipt {
        r.check().map_err(CopyError::InvalidReceipt)?;
    }
    let facts = Facts {
        tls: tls.filter(|_| cause == Cause::Disk),
        ..Facts::of(ctx)
    };
    explain_facts(cause, outcome, &facts, possibly_written)
}

/// [`explain`] from borrowed facts; `possibly_written`: an attempt failed
/// at or after its COMMIT's write (see [`crate::possibly_written`]).
pub(crate) fn explain_facts(
    cause: Cause,
    outcome: Outcome,
    ctx: &Facts<'_>,
    possibly_written: bool,
) -> Result<Copy, CopyError> {
    if !is_producible(cause, outcome) {
        return Err(CopyError::NotProducible { cause, outcome });
    }
    // A lease's holder is named only by the copy of the lease that fenced.
    let facts = Facts {
        lease: ctx.lease.filter(|_| cause == Cause::TurnLease),
        ..*ctx
    };
    let ctx = &facts;
    let holder = ctx.lease.filter(|_| cause == Cause::TurnLease).map(LeaseHolder::reason);
    let why = capitalise(match (ctx.tls, &holder) {
        (Some(_), _) => "the TLS handshake with the database server failed",
        (None, Some(held)) => held,
        (None, None) => reason(cause),
    });
    // After a lost COMMIT nobody can say the messages are not stored: the
    // copy says what is known instead. The same after a COMMIT that failed
    // after its write, though its messages are not in the database now.
    let unknown = cause == Cause::OutcomeUnknown;
    let maybe = unknown || possibly_written;
    let held = ctx.pending_capture.map(|path| {
        cat(&[
            ". The unsettled capture at ",
            path,
            " holds messages of this session that the database lacks, so this turn's messages were not saved \
             after a history without them.",
        ])
    });
    let not_saved = match &held {
        Some(held) => held.as_str(),
        None if unknown => ", and turnsafe could not tell whether this turn's messages reached the session database.",
        None if maybe => {
            ", and COMMIT failed after writing this turn's messages: they are not in the session database now, but \
             its next open may bring them back."
        }
        None => ", so this turn's messages were not saved to the session database.",
    };
    let (title, body) = match outcome {
        Outcome::Persisted => {
            let (title, end) = match ctx.durability {
                Durability::Synced => ("Messages saved after a retry", " and this turn's messages were saved."),
                Durability::Unsynced => (
                    "Messages written after a retry, not yet synced",
                    " and this turn's messages were written, but not yet synced to disk: a power cut may still \
                     lose them.",
                ),
            };
            (title, cat(&[&why, "; turnsafe ", remedy(cause), end]))
        }
        Outcome::Diverted => {
            let path = ctx.receipt_path.ok_or(CopyError::MissingReceipt)?;
            (
                if maybe {
                    "Messages possibly not saved; a copy was kept"
                } else {
                    "Messages not saved to the database; a copy was kept"
                },
                cat(&[&why, not_saved, " A copy was kept at ", path, "."]),
            )
        }
        Outcome::DivertFailed => {
            let failure = match ctx.divert_failure {
                Some(f) => cat(&[" (", &failed_step(f.operation, f.errno), ")"]),
                None => String::new(),
            };
            let whereabouts = if ctx.divert_residue {
                "Some lines of this turn may remain in the session's divert file, but that copy is \
                 incomplete and has no receipt. The messages were handed back to the caller."
            } else if maybe {
                "The messages were handed back to the caller; the database may or may not hold them."
            } else {
                "The messages were handed back to the caller; they are not stored anywhere."
            };
            (
                if maybe {
                    "Messages possibly not saved, and no copy could be kept"
                } else {
                    "Messages not saved, and no copy could be kept"
                },
                cat(&[
                    &why,
                    not_saved,
                    " Writing a backup copy failed too",
                    &failure,
                    ". ",
                    whereabouts,
                ]),
            )
        }
        Outcome::HandedBack => (
            "Messages not saved",
            cat(&[
                &why,
                ", so this turn's messages were not saved and no copy was made. They were handed back to the \
                 caller.",
            ]),
        ),
    };
    let body = match (ctx.capture_path, ctx.capture_failure, outcome) {
        (_, _, Outcome::Persisted) => body,
        (Some(path), _, _) => cat(&[&body, " The retired database generation was captured at ", path, "."]),
        // On PostgreSQL there was no generation on this host to capture.
        (None, Some(f), _) if ctx.engine == Engine::Sqlite => cat(&[
            &body,
            " Capturing the retired database generation failed (",
            &failed_step(f.operation, f.errno),
            "), so it exists only in the files still open in the writing process.",
        ]),
        _ => body,
    };
    Ok(Copy {
        code: cat(&[cause.label(), ".", outcome.label()]),
        cause,
        outcome,
        title: String::from(title),
        body,
        remediation: remediation(cause, outcome, ctx, possibly_written),
        details: details(outcome, ctx, possibly_written),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `capitalise` upper-cases ASCII only: every reason must start with an
    /// ASCII letter for the titles and bodies to read right.
    #[test]
    fn every_reason_is_ascii_and_starts_with_a_letter() {
        for cause in Cause::ALL {
            let r = reason(cause);
            assert!(r.is_ascii(), "{r}");
            assert!(r.as_bytes()[0].is_ascii_lowercase(), "{r}");
            assert!(capitalise(r).as_bytes()[0].is_ascii_uppercase());
        }
    }
}
