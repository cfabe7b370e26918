//! `turnsafe replay`: import diverted transcripts back into state.db.

use std::path::PathBuf;

use crate::exit;
use crate::replay::{ReplayError, ReplayOptions, replay};

/// Import diverted transcripts back into state.db.
///
/// Reads `sessions/*.jsonl` and imports idempotently by (session, uid),
/// keeping `seq`.
///
/// Every line ends `replayed`, `duplicate` or `quarantined` (with a
/// reason) in `sessions/ledger.jsonl`; settled files move to
/// `sessions/settled/`. A second run changes nothing. Exit 0 when every
/// line is settled (quarantined lines included); 5 when a live turn lease
/// makes replay refuse.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home.
    #[arg(long)]
    home: PathBuf,
    /// Only this session's divert file.
    #[arg(long)]
    session: Option<String>,
    /// Report what would happen; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Replay even while a live turn lease is held on the session.
    #[arg(long)]
    force: bool,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> i32 {
    let opts = ReplayOptions {
        session: args.session,
        dry_run: args.dry_run,
        force: args.force,
    };
    let reports = match replay(&args.home, &opts) {
        Ok(r) => r,
        Err(e @ ReplayError::LeaseLive { .. }) => {
            eprintln!("turnsafe replay: {e}");
            return exit::REFUSED;
        }
        Err(e) => {
            eprintln!("turnsafe replay: {e}");
            return exit::FAILURE;
        }
    };
    let (mut lines, mut replayed, mut duplicate, mut quarantined) = (0, 0, 0, 0);
    for r in &reports {
        lines += r.lines;
        replayed += r.replayed;
        duplicate += r.duplicate;
        quarantined += r.quarantined;
        let line = if args.json {
            super::envelope("replay_file", serde_json::to_value(r).unwrap_or_default())
        } else {
            format!(
                "{}: {} lines: {} replayed, {} duplicate, {} quarantined",
                r.file, r.lines, r.replayed, r.duplicate, r.quarantined
            )
        };
        super::emit(&line);
    }
    let summary = serde_json::json!({
        "files": reports.len(), "lines": lines, "replayed": replayed, "duplicate": duplicate,
        "quarantined": quarantined, "dry_run": args.dry_run,
    });
    if args.json {
        super::emit(&super::envelope("summary", summary));
    } else {
        super::emit(&format!(
            "{}{} files, {lines} lines: {replayed} replayed, {duplicate} duplicate, {quarantined} quarantined",
            if args.dry_run { "dry run: " } else { "" },
            reports.len()
        ));
    }
    exit::OK
}
