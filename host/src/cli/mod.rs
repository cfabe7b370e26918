//! The `turnsafe` command line.
//!
//! Output contracts: `classify` and `append` print one bare JSON object per
//! input line; every other `--json` output is JSON Lines in a
//! `{"type": ..., "data": ...}` envelope.

mod append;
mod capture;
mod classify;
pub mod codes;
mod component;
#[cfg(feature = "fault-vfs")]
mod demo;
mod doctor;
mod evaluate;
mod explain;
mod history;
mod import;
mod recover;
mod replay;
mod schema;
mod search;
mod show;

use clap::{Parser, Subcommand};

use crate::exit;

#[derive(Debug, Parser)]
#[command(
    name = "turnsafe",
    version,
    about = "Keep every agent turn: SQLite session storage that never loses a batch silently",
    long_about = "turnsafe decides what to do when saving a conversation turn to state.db fails \
                  (retry, divert to a durable JSONL copy, or fail closed) and says so truthfully.\n\n\
                  Exit codes: 0 ok; 1 internal error; 2 usage; 3 a batch was not persisted; \
                  4 verification failed; 5 refused (a live lease, a capture not yet settled, a process holds a file it would \
                  replace, or a source that kept changing while it was copied); 6 doctor found problems; 7 a history read is not complete (an unsettled capture \
                  holds rows of it); 65 unreadable input lines."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Append(append::Args),
    Capture(capture::Args),
    Show(show::Args),
    Pop(history::PopArgs),
    Clear(history::ClearArgs),
    Restore(history::RestoreArgs),
    Fork(history::ForkArgs),
    Prune(history::PruneArgs),
    Search(search::Args),
    Replay(replay::Args),
    Import(import::Args),
    Recover(recover::Args),
    Doctor(doctor::Args),
    Classify(classify::Args),
    Explain(explain::Args),
    Evaluate(evaluate::Args),
    Codes(codes::Args),
    Component(component::Args),
    #[command(hide = true)]
    Schema(schema::Args),
    #[cfg(feature = "fault-vfs")]
    Demo(demo::Args),
}

/// Parse the command line, run, and return the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { exit::USAGE } else { exit::OK };
        }
    };
    init_logging();
    match cli.command {
        Command::Append(a) => append::run(a),
        Command::Capture(a) => capture::run(a),
        Command::Show(a) => show::run(a),
        Command::Pop(a) => history::pop(a),
        Command::Clear(a) => history::clear(a),
        Command::Restore(a) => history::restore(a),
        Command::Fork(a) => history::fork(a),
        Command::Prune(a) => history::prune(a),
        Command::Search(a) => search::run(a),
        Command::Replay(a) => replay::run(a),
        Command::Import(a) => import::run(a),
        Command::Recover(a) => recover::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Classify(a) => classify::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Evaluate(a) => evaluate::run(a),
        Command::Codes(a) => codes::run(a),
        Command::Component(a) => component::run(a),
        Command::Schema(a) => schema::run(a),
        #[cfg(feature = "fault-vfs")]
        Command::Demo(a) => demo::run(a),
    }
}

/// Logs go to stderr, filtered by `TURNSAFE_LOG` (default `warn`). They
/// carry ids, counts and codes, never message content.
fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("TURNSAFE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Print one JSON line to stdout, ignoring a closed pipe (the reader left).
pub(crate) fn emit(line: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|_| out.flush()).is_ok()
}

/// Feed each non-blank stdin line, trimmed, with its 1-based number, to
/// `f` until input ends or `f` returns false. Invalid UTF-8 is replaced,
/// never fatal: what the policy commands read only shapes an answer.
/// Returns an error only when stdin itself fails.
pub(crate) fn for_each_line(mut f: impl FnMut(u64, Result<&str, String>) -> bool) -> std::io::Result<()> {
    for_each_stdin_line(|line_no, line| match line {
        StdinLine::Text(text) => f(line_no, Ok(text)),
        StdinLine::NotUtf8(bytes) => {
            let text = String::from_utf8_lossy(bytes);
            let text = text.trim();
            text.is_empty() || f(line_no, Ok(text))
        }
        StdinLine::TooLong(n) => f(line_no, Err(crate::lines::too_long(n, MAX_BATCH_LINE))),
    })
}

/// One stdin line as [`for_each_stdin_line`] hands it on.
pub(crate) enum StdinLine<'a> {
    Text(&'a str),
    /// Its bytes, which are not UTF-8.
    NotUtf8(&'a [u8]),
    /// Longer than [`MAX_BATCH_LINE`]: read past, never held; its length.
    TooLong(u64),
}

/// The longest stdin line read (one batch, or one policy request).
pub(crate) use crate::lines::MAX_BATCH_LINE;

/// Each stdin line for a command that stores it: its text, or why it is
/// refused (not UTF-8, or longer than [`MAX_BATCH_LINE`]), naming the
/// line's fault; nothing of a refused line is stored.
pub(crate) fn for_each_exact_line(mut f: impl FnMut(u64, Result<&str, String>) -> bool) -> std::io::Result<()> {
    for_each_stdin_line(|line_no, line| match line {
        StdinLine::Text(text) => f(line_no, Ok(text)),
        StdinLine::NotUtf8(bytes) => f(line_no, Err(not_utf8(bytes))),
        StdinLine::TooLong(n) => f(
            line_no,
            Err(format!(
                "{}; nothing of it was stored",
                crate::lines::too_long(n, MAX_BATCH_LINE)
            )),
        ),
    })
}

/// Feed each stdin line that holds more than ASCII whitespace, trimmed of
/// it, with its 1-based number, to `f` until input ends or `f` returns
/// false: its text, or its bytes when they are not UTF-8 (for lines that
/// are stored, a lossy reading would store other bytes than were given),
/// or its length when it is longer than [`MAX_BATCH_LINE`] (memory stays
/// bounded whatever stdin holds).
fn for_each_stdin_line(mut f: impl FnMut(u64, StdinLine<'_>) -> bool) -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut reader = stdin.lock();
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    while let Some((n, fits)) = crate::lines::read_line(&mut reader, &mut buf, MAX_BATCH_LINE)? {
        line_no += 1;
        let line = if fits == crate::lines::Line::TooLong {
            StdinLine::TooLong(n)
        } else {
            let bytes = buf.trim_ascii();
            if bytes.is_empty() {
                continue;
            }
            std::str::from_utf8(bytes).map_or(StdinLine::NotUtf8(bytes), StdinLine::Text)
        };
        if !f(line_no, line) {
            break;
        }
    }
    Ok(())
}

/// The answer to a stdin line that is not UTF-8: refused, never read.
pub(crate) fn not_utf8(bytes: &[u8]) -> String {
    let at = std::str::from_utf8(bytes).err().map_or(0, |e| e.valid_up_to());
    format!("the line is not UTF-8 (byte {at} of the line); nothing of it was stored")
}

/// Answer one JSON Lines request with `answer`; an `{"error"}` answer gets
/// the line number, and marks the run as failed.
pub(crate) fn answer_line(line_no: u64, answer: String, failed: &mut bool) -> String {
    match crate::json_in::value(&answer) {
        Ok(serde_json::Value::Object(mut m)) if m.contains_key("error") && !m.contains_key("cause") => {
            *failed = true;
            m.insert("line".into(), line_no.into());
            serde_json::Value::Object(m).to_string()
        }
        _ => answer,
    }
}

/// The streaming policy commands: open an engine, answer each stdin line
/// with `ask`, number the error answers, and exit 65 if there were any.
pub(crate) fn answer_json_lines(
    command: &str,
    kind: crate::engine::EngineKind,
    mut ask: impl FnMut(&mut dyn crate::engine::PolicyEngine, &str) -> Result<String, crate::engine::EngineError>,
) -> i32 {
    let mut policy = match crate::engine::open(kind) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("turnsafe {command}: {e}");
            return exit::FAILURE;
        }
    };
    let mut failed = false;
    let read = for_each_line(|line_no, text| {
        let answer = match text {
            Ok(text) => {
                ask(policy.as_mut(), text).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string())
            }
            Err(refused) => serde_json::json!({ "error": refused }).to_string(),
        };
        emit(&answer_line(line_no, answer, &mut failed))
    });
    if let Err(e) = read {
        eprintln!("turnsafe {command}: reading stdin: {e}");
        return exit::FAILURE;
    }
    if failed { exit::DATAERR } else { exit::OK }
}

/// Refuse a `state.db` written by a newer turnsafe (exit 2), before
/// anything opens it for writing. `None` when the command may go on.
pub(crate) fn refuse_newer_schema(db: &std::path::Path) -> Option<i32> {
    match crate::store::schema::check_not_newer(db) {
        Ok(()) => None,
        Err(e) => {
            eprintln!("error: {e}");
            Some(exit::USAGE)
        }
    }
}

/// A `{"type": kind, "data": data}` envelope line.
/// The unsettled captures under `home` that hold rows of `session` (of any
/// session, with `None`); exit 1 with a message when the home cannot be
/// read, since a read must not claim a complete history it cannot check.
pub(crate) fn holds_for(home: &std::path::Path, session: Option<&str>) -> Result<Vec<crate::captures::Hold>, i32> {
    match crate::captures::holds(home) {
        Ok(all) => Ok(all.into_iter().filter(|h| session.is_none_or(|s| h.holds(s))).collect()),
        Err(e) => {
            eprintln!("error: cannot list the captures under {}: {e}", home.display());
            Err(exit::FAILURE)
        }
    }
}

/// Exit 0 for a complete history; otherwise say on stderr what it lacks,
/// and exit 7.
pub(crate) fn incomplete(holds: &[crate::captures::Hold], session: Option<&str>) -> i32 {
    if holds.is_empty() {
        return exit::OK;
    }
    let whose = match session {
        Some(s) => format!("session {s}'s history"),
        None => "the history searched".to_string(),
    };
    eprintln!("warning: {whose} is not complete: unsettled captures hold rows the database lacks:");
    for h in holds {
        let rows = match (&h.sessions, session) {
            (Some(by), Some(s)) => format!("{} row(s)", by.get(s).copied().unwrap_or(0)),
            (Some(by), None) => format!("{} row(s)", by.values().sum::<u64>()),
            (None, _) => "an unknown number of rows".to_string(),
        };
        eprintln!("  {} (cause {}): {rows}", h.path, h.cause.label());
    }
    eprintln!(
        "Settle each with `turnsafe recover --source <capture> --output <new.db> --install --home <home>` \
         (or `--dismiss` if its rows do not matter); `turnsafe doctor` lists them."
    );
    exit::INCOMPLETE
}

pub(crate) fn envelope(kind: &str, data: serde_json::Value) -> String {
    serde_json::json!({ "type": kind, "data": data }).to_string()
}
