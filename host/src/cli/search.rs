//! `turnsafe search`: full-text search over the committed messages.

use std::path::PathBuf;

use crate::exit;
use crate::store::search::{IndexHealth, SearchError, SearchOptions};

/// Search the stored messages; never misses a committed one.
///
/// First indexes every committed message past the index's watermark, then
/// queries. The query is plain words, each matched as a quoted token (all
/// must appear); `--fts5` takes raw FTS5 syntax instead. When the index
/// cannot be brought up to date (read-only home, a lock held past the
/// policy's patience, a full disk) or is damaged, the messages it lacks are
/// scanned with `LIKE` and counted as `unindexed`.
///
/// Output: one line per hit. With `--json`,
/// `{"type":"hit","data":{"session","uid","seq","role","snippet"}}` per hit,
/// then `{"type":"end","data":{"hits","unindexed"}}`. While an unsettled
/// capture holds rows of a session searched (any session, without
/// `--session`) that the database lacks, the hits are printed but the
/// history is not complete: the end line adds `"complete": false` and
/// `pending_captures` (each `{path, cause, rows}`), stderr says so, and the
/// exit code is 7. Exit 2 for an empty
/// query, an FTS5 syntax error (with SQLite's reason) or a database written
/// by a newer turnsafe.
///
/// With `--archived`, the archive (what `pop`, `clear`, compaction and
/// `prune` took out) is searched too: its hits come after the transcripts'
/// within `--limit`, most recently archived first, and each adds
/// `"archived": true`, `archived_at` (RFC 3339) and `reason` to its JSON
/// (human lines end with `[archived <reason> <archived_at>]`). Archived
/// rows are matched without the index.
///
/// With `--db URL` (or `TURNSAFE_DB`) PostgreSQL is searched: its
/// `tsvector` index is brought up to date first (off the commit path), the
/// words are matched with `plainto_tsquery('simple', ...)` (all must
/// appear), and any message the index lacks is matched without it and
/// counted as `unindexed`. The output is the same.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home holding `state.db` (not needed with `--db`).
    #[arg(long)]
    home: Option<PathBuf>,
    /// Search PostgreSQL (default: `TURNSAFE_DB`); see `turnsafe append --help`.
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// What to look for: plain words, or FTS5 syntax with `--fts5`.
    query: String,
    /// Only this session's messages.
    #[arg(long)]
    session: Option<String>,
    /// At most N hits.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
    /// The query is raw FTS5 syntax (operators, phrases, prefixes).
    #[arg(long)]
    fts5: bool,
    /// Search the archived rows too (after the transcripts').
    #[arg(long)]
    archived: bool,
}

pub fn run(args: Args) -> i32 {
    let home = match crate::target::DbChoice::resolve(args.db.as_deref(), args.home.as_deref()) {
        Ok(crate::target::DbChoice::Postgres(url)) => return run_postgres(*url, &args),
        Ok(crate::target::DbChoice::Sqlite(_)) => args.home.clone().unwrap_or_default(),
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let opts = SearchOptions {
        session: args.session.clone(),
        limit: args.limit as usize,
        fts5: args.fts5,
        read_only: false,
        archived: args.archived,
    };
    let report = match crate::store::search::search(&home, &args.query, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return match e {
                // A home without a store is a wrong `--home`, the user's to fix.
                SearchError::EmptyQuery
                | SearchError::Syntax(_)
                | SearchError::NewerSchema(_)
                | SearchError::NoDatabase(_) => exit::USAGE,
                SearchError::Sqlite(_) => exit::FAILURE,
            };
        }
    };
    match report.index {
        IndexHealth::Current => {}
        IndexHealth::Behind(cause) => eprintln!(
            "turnsafe search: {} committed message(s) are not indexed yet (the index could not be written: {}); \
             they were scanned without it",
            report.unindexed,
            cause.map_or("unknown", |c| c.label())
        ),
        IndexHealth::Damaged => eprintln!(
            "turnsafe search: the search index is damaged or marked for rebuild (fts_index); all {} message(s) \
             were scanned without it. Rebuild it with `turnsafe doctor --home {} --repair-fts`.",
            report.unindexed,
            home.display()
        ),
    }
    let holds = match super::holds_for(&home, args.session.as_deref()) {
        Ok(h) => h,
        Err(code) => return code,
    };
    let code = print(
        &report.hits,
        report.unindexed,
        &holds,
        args.session.as_deref(),
        args.json,
    );
    if code != exit::OK {
        return code;
    }
    super::incomplete(&holds, args.session.as_deref())
}

/// Search PostgreSQL: the same output, from its `tsvector` index.
fn run_postgres(url: crate::pg::DbUrl, args: &Args) -> i32 {
    use crate::backend::BackendError;
    if args.fts5 {
        eprintln!("error: --fts5 takes SQLite's FTS5 syntax; with --db the query is plain words");
        return exit::USAGE;
    }
    let mut pg = crate::pg::Postgres::new(url, crate::pg::PgOptions::default());
    let report = match pg.search(&args.query, args.session.as_deref(), args.limit as usize, args.archived) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return match e {
                BackendError::EmptyQuery | BackendError::NewerSchema { .. } => exit::USAGE,
                BackendError::Unavailable { .. } | BackendError::Refused(_) => exit::FAILURE,
            };
        }
    };
    if report.unindexed > 0 {
        eprintln!(
            "turnsafe search: {} committed message(s) are not indexed yet (the index could not be written); \
             they were matched without it",
            report.unindexed
        );
    }
    print(&report.hits, report.unindexed, &[], args.session.as_deref(), args.json)
}

fn print(
    hits: &[crate::store::search::Hit],
    unindexed: u64,
    holds: &[crate::captures::Hold],
    session: Option<&str>,
    json: bool,
) -> i32 {
    for hit in hits {
        let line = if json {
            super::envelope("hit", serde_json::to_value(hit).unwrap_or_default())
        } else {
            let mut line = format!(
                "{}  {:>6}  {:<10} {}",
                hit.session,
                hit.seq,
                hit.role.as_deref().unwrap_or("-"),
                hit.snippet
            );
            if let Some(a) = &hit.archived {
                line.push_str(&format!("  [archived {} {}]", a.reason, a.archived_at));
            }
            line
        };
        if !super::emit(&line) {
            return exit::OK;
        }
    }
    let end = if json {
        let mut end = serde_json::json!({ "hits": hits.len(), "unindexed": unindexed });
        // Only an incomplete history adds to the end line.
        if !holds.is_empty() {
            let pending: Vec<serde_json::Value> = holds.iter().map(|h| h.to_value(session)).collect();
            end["complete"] = false.into();
            end["pending_captures"] = pending.into();
        }
        super::envelope("end", end)
    } else {
        format!(
            "{} hit(s); {} message(s) scanned without the index",
            hits.len(),
            unindexed
        )
    };
    super::emit(&end);
    exit::OK
}
