//! `turnsafe explain`: the user copy for one (cause, outcome).

use serde_json::{Value, json};
use turnsafe_policy::{Cause, Outcome};

use crate::engine::{self, EngineKind};
use crate::exit;

/// Print the copy a user sees for a cause and an outcome.
///
/// Only pairs the action table can produce are accepted; any other pair is
/// a usage error (exit 2).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cause label (locked, disk, disk_full, replaced, deleted_wal, corrupt,
    /// fts_index, turn_lease, compression, compression_closed,
    /// session_row_missing, uid_conflict, unknown).
    #[arg(long, value_parser = parse_cause)]
    cause: Cause,
    /// How the flush ended.
    #[arg(long, value_parser = parse_outcome)]
    outcome: Outcome,
    /// The divert receipt's path (required for `diverted`).
    #[arg(long)]
    receipt_path: Option<String>,
    /// The divert failure, e.g. `open: EMFILE`; only operation and errno are shown.
    #[arg(long)]
    divert_error: Option<String>,
    /// The capture folder of the retired generation, when its capture
    /// finished; only then does the copy say it was captured, and where.
    #[arg(long, value_name = "P", conflicts_with = "capture_error")]
    capture_path: Option<String>,
    /// The capture failure, e.g. `mkdir: ENOENT`; only step and errno are shown.
    #[arg(long, value_name = "MSG")]
    capture_error: Option<String>,
    /// The divert file that may still hold lines of a failed divert
    /// (`divert_failed` only); the copy says lines may remain, never the path.
    #[arg(long, value_name = "PATH")]
    divert_residue: Option<String>,
    /// The session id.
    #[arg(long)]
    session: Option<String>,
    /// Print the copy as a JSON envelope line.
    #[arg(long)]
    json: bool,
    /// Which implementation of the policy answers.
    #[arg(long, value_enum, default_value = "native")]
    engine: EngineKind,
}

fn parse_cause(s: &str) -> Result<Cause, String> {
    Cause::from_label(s).ok_or_else(|| {
        let all: Vec<&str> = Cause::ALL.iter().map(|c| c.label()).collect();
        format!("unknown cause `{s}`; expected one of: {}", all.join(", "))
    })
}

fn parse_outcome(s: &str) -> Result<Outcome, String> {
    Outcome::from_label(s)
        .ok_or_else(|| format!("unknown outcome `{s}`; expected persisted, diverted, divert_failed or handed_back"))
}

pub fn run(args: Args) -> i32 {
    if !turnsafe_policy::is_producible(args.cause, args.outcome) {
        let possible: Vec<&str> = Outcome::ALL
            .into_iter()
            .filter(|o| turnsafe_policy::is_producible(args.cause, *o))
            .map(|o| o.label())
            .collect();
        eprintln!(
            "error: the action table never produces outcome `{}` for cause `{}` (it can produce: {})",
            args.outcome.label(),
            args.cause.label(),
            possible.join(", ")
        );
        return exit::USAGE;
    }
    if args.outcome == Outcome::Diverted && args.receipt_path.is_none() {
        eprintln!("error: `--outcome diverted` needs `--receipt-path`: a copy is only claimed with a receipt");
        return exit::USAGE;
    }
    let mut request = json!({ "cause": args.cause.label(), "outcome": args.outcome.label() });
    if let Value::Object(m) = &mut request {
        if let Some(p) = &args.receipt_path {
            m.insert("receipt_path".into(), p.clone().into());
        }
        if let Some(d) = &args.divert_error {
            m.insert("divert_error".into(), d.clone().into());
        }
        if let Some(p) = &args.capture_path {
            m.insert("capture_receipt".into(), p.clone().into());
        }
        if let Some(e) = &args.capture_error {
            m.insert("capture_failure".into(), e.clone().into());
        }
        if let Some(p) = &args.divert_residue {
            m.insert("divert_residue".into(), json!({ "path": p, "offset": 0 }));
        }
        if let Some(s) = &args.session {
            m.insert("session".into(), s.clone().into());
        }
    }
    let answer = match engine::open(args.engine).and_then(|mut e| e.explain_json(&request.to_string())) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("turnsafe explain: {e}");
            return exit::FAILURE;
        }
    };
    let copy: Value = match serde_json::from_str(&answer) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("turnsafe explain: the policy answered invalid JSON: {e}");
            return exit::FAILURE;
        }
    };
    if let Some(err) = copy.get("error").and_then(Value::as_str) {
        eprintln!("error: {err}");
        return exit::USAGE;
    }
    let ok = if args.json {
        super::emit(&super::envelope("copy", copy))
    } else {
        super::emit(&render(&copy))
    };
    if ok { exit::OK } else { exit::FAILURE }
}

/// Plain-text rendering of a copy object.
pub fn render(copy: &Value) -> String {
    let s = |k: &str| copy.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut out = format!("{}\n\n{}\n", s("title"), s("body"));
    if let Some(steps) = copy.get("remediation").and_then(Value::as_array)
        && !steps.is_empty()
    {
        out.push_str("\nWhat to do:\n");
        for step in steps {
            out.push_str(&format!("  - {}\n", step.as_str().unwrap_or_default()));
        }
    }
    if let Some(details) = copy.get("details").and_then(Value::as_object)
        && !details.is_empty()
    {
        out.push('\n');
        for (k, v) in details {
            out.push_str(&format!("{k}: {}\n", v.as_str().unwrap_or_default()));
        }
    }
    out.push_str(&format!("[{}]", s("code")));
    out
}
