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
///
/// With `--db URL` (or `TURNSAFE_DB`) the PostgreSQL store is examined
/// instead of `state.db`: whether it can be reached (shown as
/// `postgres://user@host:port/db`), its schema version, live turn leases
/// and the messages the search index has not caught up with; the home's
/// pending diverts and captures are examined too when `--home` is given.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home (optional with `--db`).
    #[arg(long)]
    home: Option<PathBuf>,
    /// Examine a PostgreSQL store (default: `TURNSAFE_DB`).
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Rebuild a degraded search index when no writer holds the db.
    #[arg(long)]
    repair_fts: bool,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> i32 {
    let (findings, facts) = match crate::target::DbChoice::resolve(args.db.as_deref(), args.home.as_deref()) {
        Ok(crate::target::DbChoice::Postgres(url)) => crate::doctor::examine_postgres(&url, args.home.as_deref()),
        Ok(crate::target::DbChoice::Sqlite(db)) => {
            if let Some(code) = super::refuse_newer_schema(&db) {
                return code;
            }
            match &args.home {
                Some(home) => crate::doctor::examine(home, args.repair_fts),
                None => return exit::USAGE,
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
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
