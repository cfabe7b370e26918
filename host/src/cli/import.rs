//! `turnsafe import`: another runtime's history into a turnsafe home.

use std::path::PathBuf;

use crate::exit;
use crate::import_hermes::{ImportError, ImportOptions, LineKind, Report, import};
use crate::target::DbChoice;

/// Bring another agent runtime's history into a turnsafe home.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    Hermes(HermesArgs),
}

/// Import a Hermes home (`HERMES_HOME`: `state.db` and `sessions/`) into a
/// turnsafe home's `state.db`, or with `--db` (or `TURNSAFE_DB`) into a
/// PostgreSQL database.
///
/// The Hermes home is never written to, and its `state.db` is never opened:
/// `state.db` and its `-wal` are copied, the copy is kept only if no file
/// changed during it, and the copy is read. While a Hermes process keeps
/// writing, the copy is tried again a few times, then the import refuses
/// (exit 5). `--home` may be neither the Hermes home nor inside it. With
/// `--db`, the rows go to the server (the same tables, keys, counts and
/// report, idempotent the same way) and `--home` keeps only the
/// quarantine; a dry run there runs the import in transactions rolled
/// back (connecting as a writer does, which brings an older schema to the
/// current version first).
///
/// Every Hermes session becomes a session; its Hermes record (title,
/// source, parent, model, token counts...) is kept in `session_meta`. A
/// Hermes id that is not a valid turnsafe session id is stored under
/// `<safe prefix>-h<hash>`, as `TurnsafeSession` maps free-form ids, and
/// reported. Active rows become the history in Hermes' order (uid
/// `hermes:<message id>`); inactive rows go to the archive with reason
/// `compaction` (compacted) or `rewind`. Each message keeps its Hermes
/// fields, `content` and `tool_calls` decoded as Hermes decodes them.
///
/// Messages in `sessions/<id>.jsonl` (Hermes' diverted batches) and in the
/// snapshot `sessions/session_<id>.json` follow the session's rows, unless
/// the session already holds them, which only their place and bytes tell:
/// a divert line is a duplicate when its bytes equal the row it meets where
/// the run of lines joins the rows; a snapshot entry when it has the role
/// and content (as Hermes cleans it) of the message at its position. The
/// same words elsewhere are another message. A line the evidence cannot
/// settle (the words of the row it meets but other bytes, a line said
/// twice in one file, a snapshot entry whose content differs from its
/// position's, as a redacted secret does) is imported and reported as a
/// possible duplicate, with the uid of the message it may repeat. A line
/// that cannot be read is copied to `<home>/import-quarantine/hermes.jsonl`
/// and counted `quarantined`; a torn last line is counted `torn`. Every
/// row and line has a stable uid, so a second import adds nothing: a uid
/// the session holds is a `duplicate` when the stored row has the same
/// bytes, and a `conflict` when it has others (not written; the stored row
/// stays).
///
/// Output, one line per session:
/// `<hermes id> -> <session>: <rows> rows, <lines> lines: <imported> imported, <archived> archived, <duplicate> duplicate, <quarantined> quarantined[, <torn> torn][, <n> possible duplicate][, refused]`
/// and under it, for each possible duplicate,
/// `  possible duplicate: <file> line|message <line> (<uid>) may repeat <uid>`;
/// then a summary line. With `--json`: one `{"type":"session","data":{...}}`
/// per session (`hermes_id`, `session`, `renamed`, `parent`, `rows`,
/// `lines`, `imported`, `archived`, `duplicate`, `conflict`, `possible_duplicate`,
/// `possible_duplicates`: [{`file`, `kind`, `line`, `uid`, `may_repeat`}],
/// `quarantined`, `torn`, `refused`, `files`), then
/// `{"type":"end","data":{...}}` (`source`, `home`, `dry_run`,
/// `copy_attempts`, `sessions`, the same counts summed, `renamed`: {hermes
/// id: session}, `refused`: [session], `quarantine`: the quarantine file
/// or null). A possible duplicate is among `imported`; `kind` is `divert`
/// or `snapshot`, `line` its line in a divert file (from 1) or its index
/// among a snapshot's messages (from 0).
///
/// Exit 0 when every session was imported (quarantined lines included); 5
/// when the import refused (`--home` is or is inside the Hermes home, Hermes kept
/// writing, or another writer holds a session's live turn lease: the other
/// sessions are imported, that one is not).
#[derive(Debug, clap::Args)]
pub struct HermesArgs {
    /// The Hermes home (`HERMES_HOME`, e.g. `~/.hermes`), holding `state.db`.
    #[arg(long, value_name = "HERMES_HOME")]
    source: PathBuf,
    /// The turnsafe home to import into (`<home>/state.db`; created if missing).
    #[arg(long, value_name = "DIR")]
    home: PathBuf,
    /// Import into PostgreSQL instead of `<home>/state.db` (default: `TURNSAFE_DB`).
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Only this Hermes session (its Hermes id).
    #[arg(long, value_name = "HERMES_ID")]
    session: Option<String>,
    /// Report what would happen; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> i32 {
    match args.what {
        What::Hermes(a) => hermes(a),
    }
}

fn hermes(args: HermesArgs) -> i32 {
    let db = match DbChoice::resolve(args.db.as_deref(), Some(&args.home)) {
        Ok(DbChoice::Sqlite(path)) => {
            if let Some(code) = super::refuse_newer_schema(&path) {
                return code;
            }
            None
        }
        Ok(DbChoice::Postgres(url)) => {
            if let Some(why) = url.writer_refusal() {
                eprintln!("turnsafe import hermes: --db {}: {why}", url.display());
                return exit::USAGE;
            }
            Some(*url)
        }
        Err(e) => {
            eprintln!("turnsafe import hermes: {e}");
            return exit::USAGE;
        }
    };
    let target = match &db {
        Some(url) => url.display().to_string(),
        None => args.home.join("state.db").display().to_string(),
    };
    let opts = ImportOptions {
        session: args.session,
        dry_run: args.dry_run,
        db,
        ..ImportOptions::default()
    };
    let report = match import(&args.source, &args.home, &opts) {
        Ok(r) => r,
        Err(e) => {
            if let ImportError::Edit(edit) = &e {
                // The store refused or failed a write: the policy's copy,
                // as every edit prints it, and where it was going.
                let copy = edit.copy();
                eprintln!("{}\n{}", copy.title, copy.body);
                for step in &copy.remediation {
                    eprintln!("  - {step}");
                }
                eprintln!(
                    "turnsafe import hermes: into {target}: {e} (sessions imported before it stay; a second run \
                     adds only what is missing)"
                );
            } else {
                eprintln!("turnsafe import hermes: {e}");
            }
            return match e {
                e if e.is_refusal() => exit::REFUSED,
                ImportError::NoSource(_) | ImportError::NoSuchSession(_) | ImportError::NotHermes { .. } => exit::USAGE,
                _ => exit::FAILURE,
            };
        }
    };
    print(&report, args.json);
    if report.any_refused() {
        eprintln!(
            "turnsafe import hermes: refused session(s) whose live turn lease another writer holds: {}; \
             import them again once that writer is done",
            report.summary()["refused"]
        );
        return exit::REFUSED;
    }
    exit::OK
}

/// The report, in human form or as JSON Lines.
pub(crate) fn print(report: &Report, json: bool) {
    for s in &report.sessions {
        let line = if json {
            super::envelope("session", serde_json::to_value(s).unwrap_or_default())
        } else {
            let mut line = format!(
                "{} -> {}: {} rows, {} lines: {} imported, {} archived, {} duplicate, {} quarantined",
                s.hermes_id, s.session, s.rows, s.lines, s.imported, s.archived, s.duplicate, s.quarantined
            );
            if s.torn > 0 {
                line.push_str(&format!(", {} torn", s.torn));
            }
            if s.conflict > 0 {
                line.push_str(&format!(", {} conflict", s.conflict));
            }
            if s.possible_duplicate > 0 {
                line.push_str(&format!(", {} possible duplicate", s.possible_duplicate));
            }
            if s.refused {
                line.push_str(", refused");
            }
            for p in &s.possible_duplicates {
                let at = match p.kind {
                    LineKind::Divert => "line",
                    LineKind::Snapshot => "message",
                };
                line.push_str(&format!(
                    "\n  possible duplicate: {} {at} {} ({}) may repeat {}",
                    p.file, p.line, p.uid, p.may_repeat
                ));
            }
            line
        };
        if !super::emit(&line) {
            return;
        }
    }
    let summary = report.summary();
    if json {
        super::emit(&super::envelope("end", summary));
        return;
    }
    let n = |k: &str| summary[k].as_u64().unwrap_or_default();
    let mut last = format!(
        "{}{} sessions, {} rows, {} lines: {} imported, {} archived, {} duplicate, {} quarantined, {} torn",
        if report.dry_run { "dry run: " } else { "" },
        n("sessions"),
        n("rows"),
        n("lines"),
        n("imported"),
        n("archived"),
        n("duplicate"),
        n("quarantined"),
        n("torn"),
    );
    if n("possible_duplicate") > 0 {
        last.push_str(&format!(", {} possible duplicate", n("possible_duplicate")));
    }
    if n("conflict") > 0 {
        last.push_str(&format!(", {} conflict", n("conflict")));
    }
    super::emit(&last);
    if let Some(q) = &report.quarantine {
        super::emit(&format!("unreadable lines copied to {q}"));
    }
}
