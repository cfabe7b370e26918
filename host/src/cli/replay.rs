//! `turnsafe replay`: import diverted transcripts back into state.db.

use std::path::PathBuf;

use crate::exit;
use crate::replay::{ReplayError, ReplayOptions, replay_run};

/// Import diverted transcripts back into state.db (or, with `--db`, PostgreSQL).
///
/// Reads turnsafe's divert files in `sessions/` and imports idempotently by
/// (session, uid), keeping `seq`. A line is a duplicate only when its
/// bytes are stored: its canonical JSON (docs/DIVERT.md) has the stored
/// row's digest. A uid stored with other bytes is a `conflict`, set aside.
///
/// LangGraph lines (`v` 3, `kind` `checkpoint` or `write`, from
/// `turnsafe_store.langgraph`) are settled by their keys: a checkpoint by
/// (thread, namespace, checkpoint id), a write by (thread, namespace,
/// checkpoint id, task, idx). A key stored with other bytes, or marked by
/// a delete, settles as the live call would have when the line was
/// diverted: `applied` (stored over the older version, or brought back
/// from a delete that came before it) or `superseded` (a newer version,
/// a later delete, or a first copy of an ordinary write holds the key),
/// and a `conflict` when the line's time cannot order it.
///
/// Every line ends `replayed`, `duplicate`, `applied`, `superseded`,
/// `conflict` or `quarantined` (with a reason; a conflict also names the
/// line's and the stored row's digests) in `sessions/ledger.jsonl`;
/// settled files move to `sessions/settled/`, every line kept. A second
/// run changes nothing.
///
/// A file is turnsafe's when its name is `<session-id>.jsonl` and at least
/// one of its lines is a divert line (`v` 1 or 2, or a LangGraph line of
/// `v` 3) for that session. Any other
/// file in `sessions/` (another runtime's transcripts) is left in place,
/// byte for byte, and listed as `foreign_files`.
///
/// While a capture of a retired generation (`state.db.retired-*/` in the
/// home) has no `SETTLED` marker, replay refuses and names it: the capture
/// holds rows the database may lack, and importing later lines first
/// would leave holes. Settle it with `turnsafe recover --install` or
/// `turnsafe recover --dismiss`, or pass `--force`.
///
/// Exit 0 when every line is settled (quarantined lines included); 5 when
/// a live turn lease or a pending capture makes replay refuse.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home (its `sessions/` holds the diverted files).
    #[arg(long)]
    home: PathBuf,
    /// Import into PostgreSQL instead of `<home>/state.db` (default: `TURNSAFE_DB`).
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Only this session's divert file.
    #[arg(long)]
    session: Option<String>,
    /// Report what would happen; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Replay even while a live turn lease is held on the session, or a
    /// capture is not settled.
    #[arg(long)]
    force: bool,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> i32 {
    // An id no divert file can have is a mistake to name, not nothing to do.
    if let Some(s) = &args.session
        && let Err(e) = crate::ids::SessionId::new(s)
    {
        eprintln!("error: invalid --session: {e}");
        return exit::USAGE;
    }
    let opts = ReplayOptions {
        session: args.session,
        dry_run: args.dry_run,
        force: args.force,
    };
    let result = match crate::target::DbChoice::resolve(args.db.as_deref(), Some(&args.home)) {
        Ok(crate::target::DbChoice::Sqlite(db)) => {
            if let Some(code) = super::refuse_newer_schema(&db) {
                return code;
            }
            replay_run(&args.home, &opts)
        }
        Ok(crate::target::DbChoice::Postgres(url)) => {
            if let Some(why) = url.writer_refusal() {
                eprintln!("error: --db {}: {why}", url.display());
                return exit::USAGE;
            }
            crate::pg::replay::replay(&args.home, &url, &opts)
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let run = match result {
        Ok(r) => r,
        Err(e @ (ReplayError::LeaseLive { .. } | ReplayError::CapturePending { .. })) => {
            eprintln!("turnsafe replay: {e}");
            return exit::REFUSED;
        }
        // A file of the home it may not read, or not a file: the home's
        // fault, named in the message, as a missing one is.
        Err(e @ ReplayError::Io { .. }) if matches!(&e, ReplayError::Io { source, .. } if crate::lines::is_unreadable_input(source)) =>
        {
            eprintln!("turnsafe replay: {e}");
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("turnsafe replay: {e}");
            return exit::FAILURE;
        }
    };
    let reports = &run.files;
    for r in reports {
        let line = if args.json {
            super::envelope("replay_file", serde_json::to_value(r).unwrap_or_default())
        } else {
            format!(
                "{}: {} lines: {} replayed, {} duplicate, {} applied, {} superseded, {} quarantined ({} conflict)",
                r.file, r.lines, r.replayed, r.duplicate, r.applied, r.superseded, r.quarantined, r.conflict
            )
        };
        super::emit(&line);
    }
    let summary = run.summary(args.dry_run);
    let count = |k: &str| summary[k].as_u64().unwrap_or_default();
    let (lines, replayed, duplicate, quarantined) = (
        count("lines"),
        count("replayed"),
        count("duplicate"),
        count("quarantined"),
    );
    let (applied, superseded, conflict) = (count("applied"), count("superseded"), count("conflict"));
    if args.json {
        super::emit(&super::envelope("summary", summary));
    } else {
        super::emit(&format!(
            "{}{} files, {lines} lines: {replayed} replayed, {duplicate} duplicate, {applied} applied, \
             {superseded} superseded, {quarantined} quarantined ({conflict} conflict)",
            if args.dry_run { "dry run: " } else { "" },
            reports.len()
        ));
        if !run.foreign_files.is_empty() {
            super::emit(&format!(
                "left alone: {} file(s) in sessions/ that are not turnsafe's: {}",
                run.foreign_files.len(),
                run.foreign_files.join(", ")
            ));
        }
    }
    exit::OK
}
