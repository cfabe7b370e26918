//! `turnsafe explain`: the user copy for one (cause, outcome).

use serde_json::{Value, json};
use turnsafe_policy::{Cause, Outcome};

use crate::divert::{Receipt, verify_receipt};
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
    /// The divert receipt, as JSON in FILE, or on stdin with `-` (required
    /// for `diverted`): the receipt object `{path, offset, length, count,
    /// sha256}`, or an `append` outcome that carries one. The copy claims a
    /// kept copy only after the file's byte range is read back and matches.
    #[arg(long, value_name = "FILE|-")]
    receipt_json: Option<String>,
    /// The divert failure, e.g. `open: EMFILE`; only operation and errno are shown.
    #[arg(long)]
    divert_error: Option<String>,
    /// The capture folder of the retired generation, when its capture
    /// finished; only then does the copy say it was captured, and where.
    /// The folder's manifest is read and every file it lists is checked
    /// (size, sha256) first: a folder that does not hold its capture is
    /// refused.
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
    if args.outcome == Outcome::Diverted && args.receipt_json.is_none() {
        eprintln!("error: `--outcome diverted` needs `--receipt-json`: a copy is only claimed with a receipt");
        return exit::USAGE;
    }
    let receipt = match args.receipt_json.as_deref().map(read_receipt).transpose() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let capture = match args.capture_path.as_deref().map(read_capture).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let mut request = json!({ "cause": args.cause.label(), "outcome": args.outcome.label() });
    if let Value::Object(m) = &mut request {
        if let Some(r) = &receipt {
            m.insert("receipt".into(), json!(r));
        }
        if let Some(d) = &args.divert_error {
            m.insert("divert_error".into(), d.clone().into());
        }
        if let Some(c) = &capture {
            m.insert("capture_receipt".into(), json!(c));
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

/// The receipt named by `--receipt-json`, read back from its divert file:
/// a receipt that does not hold there is refused, so the copy never claims
/// a copy that is not on disk.
fn read_receipt(source: &str) -> Result<Receipt, String> {
    let text = if source == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("--receipt-json -: cannot read stdin: {e}"))?
    } else {
        std::fs::read_to_string(source).map_err(|e| format!("--receipt-json {source}: {e}"))?
    };
    let value: Value =
        crate::json_in::value(text.trim()).map_err(|e| format!("--receipt-json {source}: not JSON: {e}"))?;
    // An outcome line carries its receipt in `receipt`; a `--json` envelope in `data`.
    let inner = value.get("data").unwrap_or(&value);
    let inner = match inner.get("receipt") {
        Some(r) if r.is_object() => r,
        Some(_) => {
            return Err(format!(
                "--receipt-json {source}: its `receipt` is not a receipt object"
            ));
        }
        None => inner,
    };
    let receipt: Receipt = serde_json::from_value(inner.clone()).map_err(|e| {
        format!("--receipt-json {source}: not a divert receipt {{path, offset, length, count, sha256}}: {e}")
    })?;
    receipt
        .check()
        .map_err(|why| format!("--receipt-json {source}: not a whole divert receipt: {why}"))?;
    match verify_receipt(&receipt) {
        Ok(true) => Ok(receipt),
        Ok(false) => Err(format!(
            "the receipt does not hold: bytes {}..{} of {} are not its {} line(s) with sha256 {}",
            receipt.offset,
            receipt.offset + receipt.length,
            receipt.path,
            receipt.count,
            receipt.sha256
        )),
        Err(e) => Err(format!("the receipt does not hold: cannot read {}: {e}", receipt.path)),
    }
}

/// The capture receipt of the folder at `path`, from its manifest, once
/// every file the manifest lists is there with its size and sha256.
fn read_capture(path: &str) -> Result<turnsafe_policy::CaptureReceipt, String> {
    use sha2::Digest;
    let dir = std::path::absolute(path).map_err(|e| format!("--capture-path {path}: {e}"))?;
    let refuse = |why: String| format!("the capture does not hold: {}: {why}", dir.display());
    let text = std::fs::read(dir.join("manifest.json")).map_err(|e| refuse(format!("manifest.json: {e}")))?;
    let manifest = crate::json_in::value_bytes(&text).map_err(|e| refuse(format!("manifest.json: {e}")))?;
    let listed = manifest["files"].as_array().cloned().unwrap_or_default();
    if listed.is_empty() {
        return Err(refuse("its manifest lists no file".into()));
    }
    let mut files = Vec::new();
    for f in listed {
        let name = f["name"].as_str().unwrap_or_default();
        if name.is_empty() || name.contains('/') {
            return Err(refuse(format!("its manifest lists a bad file name {name:?}")));
        }
        let data = std::fs::read(dir.join(name)).map_err(|e| refuse(format!("{name}: {e}")))?;
        let sha = hex::encode(sha2::Sha256::digest(&data));
        if Some(data.len() as u64) != f["size"].as_u64() || Some(sha.as_str()) != f["sha256"].as_str() {
            return Err(refuse(format!("{name} is not the file its manifest describes")));
        }
        files.push(turnsafe_policy::CapturedFile {
            name: name.to_string(),
            size: data.len() as u64,
        });
    }
    Ok(turnsafe_policy::CaptureReceipt {
        path: dir.to_string_lossy().into_owned(),
        files,
        manifest_sha256: hex::encode(sha2::Sha256::digest(&text)),
    })
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
