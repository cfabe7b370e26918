//! `turnsafe recover`: copy what is readable into a fresh database, install
//! it, or dismiss a capture.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::exit;
use crate::recover::{self, RecoverError};

/// Copy what is readable from a damaged or retired database into a fresh
/// one, install it, or dismiss a capture.
///
/// The source is a db file (its sidecars beside it) or a capture folder
/// (`state.db.retired-*`).
///
/// The source is never opened in place: it is copied first, and the copy
/// is aborted if the source changed meanwhile. `--inspect-only` reports
/// what is readable; `--output` copies sessions and messages into a fresh
/// database, rebuilds its search index, and writes `<output>.report.json`.
///
/// `--install` then publishes it as `<home>/state.db`, but refuses (exit 5)
/// while any process holds the old files. Before that, every row of the
/// old state.db whose (session, uid) the rebuilt database lacks (lines
/// replay imported meanwhile, say) is copied in, keeping its `seq`; the
/// report says how many as `carried_over`. The old files are set aside,
/// never deleted. Installing from a capture (the folder, or its
/// `state.db`) writes `<capture>/SETTLED`.
///
/// A capture without `SETTLED` is pending: `turnsafe replay` refuses and
/// `turnsafe doctor` reports an error until it is settled. `--dismiss`
/// settles it without installing, once you decide its frames do not
/// matter; it refuses (exit 5) while the process that made the capture is
/// alive (it may still hold frames the capture lacks). Writers that only
/// divert do not block it.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["inspect_only", "output", "dismiss"])))]
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
    /// Install the recovered database as `<home>/state.db`, carrying over
    /// the old state.db's rows it lacks; settles a capture source.
    #[arg(long, requires_all = ["output", "home"])]
    install: bool,
    /// Settle the capture folder given as --source without installing:
    /// write its SETTLED marker so replay and doctor stop waiting on it.
    #[arg(long)]
    dismiss: bool,
    /// The turnsafe home to install into (--install), or whose state.db
    /// must be free (--dismiss; default: the capture's parent folder).
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
    let result = if args.dismiss {
        run_dismiss(&args)
    } else {
        run_recover(&args)
    };
    match result {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("turnsafe recover: {e}");
            match e {
                RecoverError::Refused(_) => exit::REFUSED,
                RecoverError::NotACapture(_) | RecoverError::NoSource(_) => exit::USAGE,
                _ => exit::FAILURE,
            }
        }
    }
}

fn io_error(context: &str) -> impl FnOnce(std::io::Error) -> RecoverError {
    let context = context.to_string();
    move |source| RecoverError::Io { context, source }
}

fn run_dismiss(args: &Args) -> Result<(), RecoverError> {
    let capture = std::path::absolute(&args.source).map_err(io_error("resolve --source"))?;
    let home = match &args.home {
        Some(h) => h.clone(),
        None => capture.parent().unwrap_or(Path::new("/")).to_path_buf(),
    };
    let dismissed = recover::dismiss(&capture, &home)?;
    if args.json {
        print(true, "dismissed", serde_json::to_value(&dismissed).unwrap_or_default());
    } else if dismissed.already_settled {
        super::emit(&format!(
            "already settled: {} was {} at {}; {} left as it was",
            dismissed.capture,
            dismissed.marker.how.label(),
            dismissed.marker.settled_at,
            dismissed.settled
        ));
    } else {
        super::emit(&format!(
            "dismissed: {} is settled without installing ({})",
            dismissed.capture, dismissed.settled
        ));
    }
    Ok(())
}

fn run_recover(args: &Args) -> Result<(), RecoverError> {
    let work = tempfile::tempdir().map_err(io_error("work folder"))?;
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
    let report_path = PathBuf::from(report_path);
    write_report(&report_path, &report)?;
    print(args.json, "recovered", report.clone());
    if args.install
        && let Some(home) = &args.home
    {
        let installed = recover::install(output, home)?;
        // A capture is settled once a database rebuilt from it is in place,
        // whether the source named the folder or its `state.db`.
        let settled = match recover::capture_of(&args.source) {
            Some(capture) => Some(recover::settle_installed(&capture, &installed)?),
            None => None,
        };
        let mut data = serde_json::to_value(&installed).unwrap_or_default();
        data["settled"] = json!(settled.as_ref().map(|p| p.to_string_lossy()));
        report["installed"] = data.clone();
        report["carried_over"] = installed.carried_over.into();
        write_report(&report_path, &report)?;
        print(args.json, "installed", data);
        if !args.json {
            super::emit(&format!(
                "carried_over: {} row(s) of the old state.db that the recovered database lacked",
                installed.carried_over
            ));
            if let Some(p) = &settled {
                super::emit(&format!("settled: {}", p.display()));
            }
        }
    }
    Ok(())
}

fn write_report(path: &Path, report: &Value) -> Result<(), RecoverError> {
    let text = serde_json::to_vec_pretty(report).map_err(|e| RecoverError::Io {
        context: "encode the report".into(),
        source: std::io::Error::other(e),
    })?;
    crate::durable::write_file(path, &text).map_err(io_error("write the report"))
}
