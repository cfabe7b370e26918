//! `turnsafe doctor`: findings about a turnsafe home.

use std::path::PathBuf;

use crate::exit;

/// Report what is wrong with a turnsafe home, and what to do.
///
/// Findings: the pids holding state.db or its sidecars
/// (deleted ones included), retired generations, pending diverts and
/// quarantined lines, the fd limit, free space, and a quick_check (on a
/// copy when a writer is live). Exit 0 when nothing is wrong, 6 otherwise.
///
/// A capture folder (`state.db.retired-*/`) without a `SETTLED` marker is
/// an error: its rows may be in no database, and replay refuses until it
/// is settled with `turnsafe recover --install` or `--dismiss`. Settled
/// captures are reported with how and when.
///
/// Files in `sessions/` that are not turnsafe's divert files (another
/// runtime's transcripts) are listed as `foreign_files` and are not
/// counted in `pending_divert_files`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home.
    #[arg(long)]
    home: PathBuf,
    /// Rebuild a degraded search index when no writer holds the db.
    #[arg(long)]
    repair_fts: bool,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> i32 {
    if let Some(code) = super::refuse_newer_schema(&args.home.join("state.db")) {
        return code;
    }
    let (findings, facts) = crate::doctor::examine(&args.home, args.repair_fts);
    let problems = findings.iter().any(|f| f.severity == "error");
    for f in &findings {
        if args.json {
            super::emit(&super::envelope("finding", serde_json::to_value(f).unwrap_or_default()));
        } else {
            super::emit(&format!("[{}] {}: {}", f.severity, f.kind, f.message));
            for step in &f.remediation {
                super::emit(&format!("        - {step}"));
            }
        }
    }
    if args.json {
        super::emit(&super::envelope("facts", facts));
    }
    if problems { exit::PROBLEMS } else { exit::OK }
}
