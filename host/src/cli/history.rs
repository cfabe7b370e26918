//! `turnsafe pop`, `clear`, `restore` and `fork`: history rewrites that
//! lose nothing (see [`crate::history`]). Each is one transaction that
//! follows the policy; a failed edit changes nothing, prints what
//! happened and exits 1 (5 when another writer holds the session's lease).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::backend::EditError;
use crate::backend::{Engine, LeaseOptions};
use crate::exit;
use crate::history::{Reason, Selector};
use crate::ids::SessionId;
use crate::store::{SessionStore, StoreOptions};
use crate::target::DbChoice;

/// Where the session lives.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The turnsafe home (`state.db`, and `sessions/` for pending diverts).
    #[arg(long)]
    home: PathBuf,
    /// Use PostgreSQL (default: `TURNSAFE_DB`); see `turnsafe append --help`.
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// The session id.
    #[arg(long)]
    session: String,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

/// Move the newest message of a session to the archive and print it.
///
/// With `--json`: `{"type":"popped","data":{"uid","seq","message"}}`, or
/// `{"type":"popped","data":null}` when the session has no message.
#[derive(Debug, clap::Args)]
pub struct PopArgs {
    #[command(flatten)]
    target: Target,
}

/// Move every message of a session, and its pending divert lines, to the
/// archive, and print what was archived.
///
/// Exactly the lines read are settled: `cleared` in `sessions/ledger.jsonl`,
/// or `quarantined` (with the reason) for a line that cannot be read; a
/// line diverted after the read stays pending. If the lines cannot be read
/// at all, the clear fails (exit 1) and nothing changes.
///
/// With `--json`: one `{"type":"archived","data":{"uid","seq","message"}}`
/// per row (the pending lines with `"pending": true`), then
/// `{"type":"end","data":{"rows","pending_lines"}}`. `turnsafe restore
/// --reason clear` brings them back.
#[derive(Debug, clap::Args)]
pub struct ClearArgs {
    #[command(flatten)]
    target: Target,
}

/// Bring archived messages back into a session, at their seqs, in one
/// transaction: each uid's newest archived copy. A uid that is active
/// again is skipped and reported, never overwritten.
///
/// `--reason delete` brings back what a LangGraph `delete_thread` marked
/// of the thread whose safe id is `--session` (its file in `sessions/`):
/// its checkpoints and writes, the pending divert lines the delete stored
/// with them included.
///
/// With `--json`: one `{"type":"restored","data":{"uid","seq"}}` per row,
/// then `{"type":"end","data":{"restored","skipped_active","not_archived",
/// "checkpoints_restored","writes_restored"}}`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["uid", "reason"])))]
pub struct RestoreArgs {
    #[command(flatten)]
    target: Target,
    /// A uid to restore (repeatable).
    #[arg(long)]
    uid: Vec<String>,
    /// Restore every row archived for this reason.
    #[arg(long, value_enum)]
    reason: Option<Reason>,
    /// With `--reason`: only rows archived at or after this time (RFC 3339,
    /// e.g. `2026-12-03T10:00:00Z`) or this long ago (`30m`, `2h`, `1d`).
    #[arg(long, requires = "reason")]
    since: Option<String>,
}

/// Copy a session's messages up to and including a seq into a new
/// session, in one transaction, keeping the lineage (`show` prints it).
/// A retried fork stores nothing twice: each copy's uid derives from the
/// new session and the source uid.
///
/// With `--json`: `{"type":"forked","data":{"source","at_seq","session","copied","already"}}`.
#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    #[command(flatten)]
    target: Target,
    /// The last seq copied.
    #[arg(long)]
    at: i64,
    /// The new session's id.
    #[arg(long)]
    to: String,
}

/// A store on the target, for one edit.
fn open(t: &Target) -> Result<(Box<dyn Engine>, SessionId), i32> {
    let session = SessionId::new(&t.session).map_err(|e| {
        eprintln!("error: invalid --session: {e}");
        exit::USAGE
    })?;
    match DbChoice::resolve(t.db.as_deref(), Some(&t.home)) {
        Ok(DbChoice::Sqlite(db)) => {
            if !db.is_file() {
                eprintln!("error: no turnsafe store at {}", db.display());
                return Err(exit::USAGE);
            }
            if let Some(code) = super::refuse_newer_schema(&db) {
                return Err(code);
            }
            Ok((Box::new(SessionStore::new(&t.home, StoreOptions::default())), session))
        }
        Ok(DbChoice::Postgres(url)) => {
            if let Some(why) = url.writer_refusal() {
                eprintln!("error: --db {}: {why}", url.display());
                return Err(exit::USAGE);
            }
            let lease = LeaseOptions {
                lease_ttl: Duration::from_secs(30),
                ..LeaseOptions::default()
            };
            Ok((Box::new(crate::pg::open_store(*url, &t.home, lease)), session))
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(exit::USAGE)
        }
    }
}

/// A failed edit: what happened, in one line (and one JSON record).
fn failed(e: &EditError, json: bool) -> i32 {
    let copy = e.copy();
    if json {
        let data = json!({
            "edit": e.edit, "session": e.session, "cause": e.cause.label(),
            "action": e.action.label(), "message": e.message, "attempts": e.attempts,
            "copy": edit_copy_value(&copy),
        });
        super::emit(&super::envelope("error", data));
    }
    eprintln!("{}\n{}", copy.title, copy.body);
    for step in &copy.remediation {
        eprintln!("  - {step}");
    }
    eprintln!("turnsafe {}: {e}", e.edit);
    if e.cause == turnsafe_policy::Cause::TurnLease {
        exit::REFUSED
    } else {
        exit::FAILURE
    }
}

/// An edit's copy as JSON: the fields of a flush outcome's copy, without
/// an outcome (an edit either happened or did not).
pub(crate) fn edit_copy_value(c: &turnsafe_policy::EditCopy) -> Value {
    json!({
        "code": c.code,
        "cause": c.cause.label(),
        "title": c.title,
        "body": c.body,
        "remediation": c.remediation,
        "details": c.details.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

fn row(m: &crate::transcript::StoredMessage, pending: bool) -> Value {
    let mut v = m.to_value();
    if pending {
        v["pending"] = Value::Bool(true);
    }
    v
}

fn human(m: &crate::transcript::StoredMessage) -> String {
    let kind = m
        .role()
        .or_else(|| m.message.get("type").and_then(Value::as_str))
        .unwrap_or("-");
    let text = m
        .message
        .get("content")
        .and_then(crate::message::text_of)
        .unwrap_or_else(|| Value::Object(m.message.clone()).to_string());
    format!("{:>6}  {:<10} {}", m.seq, kind, text)
}

pub fn pop(args: PopArgs) -> i32 {
    let (mut store, session) = match open(&args.target) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match store.pop_last(&session) {
        Ok(popped) => {
            let line = if args.target.json {
                super::envelope("popped", popped.as_ref().map_or(Value::Null, |m| row(m, false)))
            } else {
                popped
                    .as_ref()
                    .map_or_else(|| "(the session has no message)".to_string(), human)
            };
            super::emit(&line);
            exit::OK
        }
        Err(e) => failed(&e, args.target.json),
    }
}

pub fn clear(args: ClearArgs) -> i32 {
    let (mut store, session) = match open(&args.target) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The pending lines read are archived with the rows, then settled as
    // cleared, so replay does not bring them back into the cleared session.
    let cleared = match crate::clear::clear(store.as_mut(), &args.target.home, &session) {
        Ok(report) => report.cleared,
        Err(crate::clear::ClearError::Edit(e)) => return failed(&e, args.target.json),
        Err(e @ crate::clear::ClearError::Read { .. }) => {
            if args.target.json {
                let data = json!({"edit": "clear", "session": session.as_str(), "message": e.to_string()});
                super::emit(&super::envelope("error", data));
            }
            eprintln!("turnsafe clear: {e}");
            return exit::FAILURE;
        }
        Err(e @ crate::clear::ClearError::Settle { .. }) => {
            eprintln!(
                "turnsafe clear: {e}; the lines are archived and stay pending: `turnsafe replay` settles them as \
                 cleared"
            );
            return exit::FAILURE;
        }
    };
    for (m, pending) in cleared
        .rows
        .iter()
        .map(|m| (m, false))
        .chain(cleared.pending.iter().map(|m| (m, true)))
    {
        let line = if args.target.json {
            super::envelope("archived", row(m, pending))
        } else {
            human(m) + if pending { "  (pending divert line)" } else { "" }
        };
        if !super::emit(&line) {
            return exit::OK;
        }
    }
    let end = json!({"rows": cleared.rows.len(), "pending_lines": cleared.pending.len()});
    let line = if args.target.json {
        super::envelope("end", end)
    } else {
        format!(
            "archived {} messages and {} pending divert lines of {} (restore them with `turnsafe restore --reason clear`)",
            cleared.rows.len(),
            cleared.pending.len(),
            session.as_str()
        )
    };
    super::emit(&line);
    exit::OK
}

/// `--since`: an RFC 3339 time, or a duration ago.
fn since_ms(s: &str) -> Result<i64, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        let d = t.duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?;
        return i64::try_from(d.as_millis()).map_err(|e| e.to_string());
    }
    let ago =
        humantime::parse_duration(s).map_err(|e| format!("`{s}` is neither an RFC 3339 time nor a duration ({e})"))?;
    let ms = i64::try_from(ago.as_millis()).map_err(|e| e.to_string())?;
    Ok(crate::ids::now_ms().saturating_sub(ms))
}

pub fn restore(args: RestoreArgs) -> i32 {
    let selector = match (args.reason, args.uid.is_empty()) {
        (Some(reason), true) => {
            let since_ms = match args.since.as_deref().map(since_ms).transpose() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: --since: {e}");
                    return exit::USAGE;
                }
            };
            Selector::Reason { reason, since_ms }
        }
        (None, false) => Selector::Uids(args.uid.clone()),
        _ => {
            eprintln!("error: give --uid U ... or --reason R, not both");
            return exit::USAGE;
        }
    };
    let (mut store, session) = match open(&args.target) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let report = match store.restore(&session, &selector) {
        Ok(r) => r,
        Err(e) => return failed(&e, args.target.json),
    };
    for (uid, seq) in &report.restored {
        let line = if args.target.json {
            super::envelope("restored", json!({"uid": uid, "seq": seq}))
        } else {
            format!("{seq:>6}  restored {uid}")
        };
        if !super::emit(&line) {
            return exit::OK;
        }
    }
    let line = if args.target.json {
        super::envelope("end", report.to_value())
    } else {
        let mut s = format!("restored {} messages", report.restored.len());
        if args.reason == Some(Reason::Delete) {
            s += &format!(
                ", {} LangGraph checkpoint(s) and {} write(s)",
                report.checkpoints_restored, report.writes_restored
            );
        }
        if !report.skipped_active.is_empty() {
            s += &format!("; skipped (active again): {}", report.skipped_active.join(", "));
        }
        if !report.not_archived.is_empty() {
            s += &format!("; not in the archive: {}", report.not_archived.join(", "));
        }
        s
    };
    super::emit(&line);
    exit::OK
}

pub fn fork(args: ForkArgs) -> i32 {
    let new = match SessionId::new(&args.to) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: invalid --to: {e}");
            return exit::USAGE;
        }
    };
    let (mut store, session) = match open(&args.target) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match store.fork(&session, args.at, &new) {
        Ok(Ok(report)) => {
            let line = if args.target.json {
                super::envelope("forked", report.to_value())
            } else {
                format!(
                    "forked {} at seq {} into {}: {} messages copied{}",
                    report.source,
                    report.at_seq,
                    report.session,
                    report.copied,
                    if report.already > 0 {
                        format!(", {} already there", report.already)
                    } else {
                        String::new()
                    }
                )
            };
            super::emit(&line);
            exit::OK
        }
        Ok(Err(refused)) => {
            eprintln!("turnsafe fork: {refused}");
            exit::REFUSED
        }
        Err(e) => failed(&e, args.target.json),
    }
}

/// Retention: keep what is recent, archive the rest, and delete what has
/// sat in the archive long enough.
///
/// For each session (or `--session ID`): the active messages that
/// `--older-than` (stored more than DURATION ago) or `--keep-last` (all but
/// the newest N) selects move to the archive (reason `prune`), still
/// restorable; and the archived rows it selects (archived more than
/// DURATION ago; all but the newest N archived) are deleted for good. With
/// `--archived-only`, only the archive is pruned. The archive is pruned
/// first, so what a prune moves there stays restorable at least until the
/// next prune. To delete at once: prune, then
/// `prune --archived-only --older-than 0s`.
///
/// A session whose live turn lease another writer holds is skipped and
/// named, and the exit code is then 5. The search index stays consistent.
/// SQLite gives the freed pages back to the file system (the first prune
/// that frees pages switches `state.db` to incremental vacuum with one full
/// `VACUUM`, only when about twice its size is free); PostgreSQL's `VACUUM`
/// makes the space reusable.
///
/// Without `--session`, it also removes for good the LangGraph checkpoints
/// and writes that `delete_thread`, `delete_for_runs` or `prune` of
/// `turnsafe_store.langgraph` marked: with `--older-than`, those marked
/// more than DURATION ago; with `--keep-last`, all of them.
///
/// With `--json`: one `{"type":"session","data":{"session","archived","deleted"}}`
/// per session, then `{"type":"end","data":{"archived","deleted","skipped",
/// "reclaimed_bytes","space","dry_run","checkpoints_purged","writes_purged"}}`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("keep").required(true).args(["older_than", "keep_last"])))]
pub struct PruneArgs {
    /// The turnsafe home.
    #[arg(long)]
    home: PathBuf,
    /// Use PostgreSQL (default: `TURNSAFE_DB`).
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Prune what is older than this (`30d`, `12h`, `0s`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Keep the newest N messages of each session (and N archived rows).
    #[arg(long, value_name = "N")]
    keep_last: Option<u64>,
    /// Only delete archived rows; leave the transcripts alone.
    #[arg(long)]
    archived_only: bool,
    /// Only this session.
    #[arg(long)]
    session: Option<String>,
    /// Count what would go; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

pub fn prune(args: PruneArgs) -> i32 {
    if let Some(s) = &args.session
        && let Err(e) = SessionId::new(s)
    {
        eprintln!("error: invalid --session: {e}");
        return exit::USAGE;
    }
    let keep = match (args.older_than, args.keep_last) {
        (Some(d), None) => crate::history::Keep::NewerThanMs(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        (None, Some(n)) => crate::history::Keep::Last(n),
        _ => {
            eprintln!("error: give --older-than DURATION or --keep-last N");
            return exit::USAGE;
        }
    };
    let target = Target {
        home: args.home.clone(),
        db: args.db.clone(),
        session: args.session.clone().unwrap_or_else(|| "prune".into()),
        json: args.json,
    };
    let (mut store, _) = match open(&target) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let opts = crate::history::PruneOptions {
        keep,
        archived_only: args.archived_only,
        session: args.session.clone(),
        dry_run: args.dry_run,
    };
    let report = match store.prune(&opts) {
        Ok(r) => r,
        Err(e) => return failed(&e, args.json),
    };
    for s in &report.sessions {
        let line = if args.json {
            super::envelope("session", serde_json::to_value(s).unwrap_or_default())
        } else {
            format!(
                "{}: {} archived, {} deleted{}",
                s.session,
                s.archived,
                s.deleted,
                if args.dry_run { " (dry run)" } else { "" }
            )
        };
        if !super::emit(&line) {
            return exit::OK;
        }
    }
    for s in &report.skipped {
        eprintln!("turnsafe prune: skipped {s}: another writer holds its live turn lease");
    }
    let end = json!({
        "archived": report.archived(),
        "deleted": report.deleted(),
        "skipped": report.skipped,
        "reclaimed_bytes": report.reclaimed_bytes,
        "space": report.space,
        "dry_run": report.dry_run,
        "checkpoints_purged": report.checkpoints_purged,
        "writes_purged": report.writes_purged,
    });
    let line = if args.json {
        super::envelope("end", end)
    } else {
        format!(
            "{} archived, {} deleted, {} LangGraph checkpoint(s) and {} write(s) purged; space: {}{}",
            report.archived(),
            report.deleted(),
            report.checkpoints_purged,
            report.writes_purged,
            report.space,
            report
                .reclaimed_bytes
                .map_or(String::new(), |b| format!(" ({b} bytes)"))
        )
    };
    super::emit(&line);
    if report.skipped.is_empty() {
        exit::OK
    } else {
        exit::REFUSED
    }
}
