//! `turnsafe recover`: copy what is readable into a fresh database.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::exit;
use crate::recover::{self, RecoverError};

/// Copy what is readable from a damaged or retired database into a fresh one.
///
/// The source is a db file (its sidecars beside it) or a capture folder
/// (`state.db.retired-*`).
///
/// The source is never opened in place: it is copied first, and the copy
/// is aborted if the source changed meanwhile. `--inspect-only` reports
/// what is readable; `--output` copies sessions and messages into a fresh
/// database, rebuilds its search index, and writes `<output>.report.json`.
/// `--install` then publishes it as `<home>/state.db`, setting the old
/// files aside, but refuses (exit 5) while any process holds them open.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["inspect_only", "output"])))]
pub struct Args {
    /// A db file, or a capture folder holding state.db and its sidecars.
    #[arg(long)]
    source: PathBuf,
    /// Only report what is readable.
    #[arg(long)]
    inspect_only: bool,
    /// Write the recovered database here (must not exist).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Install the recovered database as `<home>/state.db`.
    #[arg(long, requires_all = ["output", "home"])]
    install: bool,
    /// The turnsafe home to install into.
    #[arg(long)]
    home: Option<PathBuf>,
    /// JSON output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

fn print(json_mode: bool, kind: &str, data: Value) {
    if json_mode {
        super::emit(&super::envelope(kind, data));
    } else {
        super::emit(&format!(
            "{kind}: {}",
            serde_json::to_string_pretty(&data).unwrap_or_default()
        ));
    }
}

pub fn run(args: Args) -> i32 {
    match run_inner(&args) {
        Ok(()) => exit::OK,
        Err(e @ RecoverError::Refused(_)) => {
            eprintln!("turnsafe recover: {e}");
            exit::REFUSED
        }
        Err(e) => {
            eprintln!("turnsafe recover: {e}");
            exit::FAILURE
        }
    }
}

fn run_inner(args: &Args) -> Result<(), RecoverError> {
    let work = tempfile::tempdir().map_err(|source| RecoverError::Io {
        context: "work folder".into(),
        source,
    })?;
    let copied = recover::copy_source(&args.source, work.path())?;
    let src = work.path().join("state.db");
    let inspected = recover::inspect(&src)?;
    if args.inspect_only {
        print(
            args.json,
            "inspect",
            json!({ "source": args.source.to_string_lossy(), "copied": copied, "readable": inspected }),
        );
        return Ok(());
    }
    let Some(output) = &args.output else { return Ok(()) };
    let result = recover::rebuild(&src, output)?;
    let mut report = json!({
        "source": args.source.to_string_lossy(),
        "copied": copied,
        "readable": inspected,
        "recovered": result,
        "output": output.to_string_lossy(),
    });
    let mut report_path = output.as_os_str().to_owned();
    report_path.push(".report.json");
    std::fs::write(&report_path, serde_json::to_vec_pretty(&report).unwrap_or_default()).map_err(|source| {
        RecoverError::Io {
            context: "write the report".into(),
            source,
        }
    })?;
    print(args.json, "recovered", report.clone());
    if args.install
        && let Some(home) = &args.home
    {
        let installed = recover::install(output, home)?;
        report["installed"] = installed.clone();
        print(args.json, "installed", installed);
    }
    Ok(())
}
