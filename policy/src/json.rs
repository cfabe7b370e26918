//! JSON entry points (string in, string out), for runtimes with weak
//! component support and for the `turnsafe` CLI. Every function here is
//! total: malformed input yields `{"error": "..."}`, never a panic.
//!
//! Field rules for an observation object: `operation` defaults to
//! `append_batch`; `code`, `extended_code` and `errno` take any integer,
//! `null` or missing means absent; `evidence` is a list of labels and
//! unknown labels are ignored; `attempt`, `elapsed_ms` and `seed` are
//! integers (negative `attempt`/`elapsed_ms` read as 0); extra fields are
//! ignored. A field of the wrong type is an error, not a guess.

#[allow(unused_imports)]
use crate::prelude::*;
use serde_json::{Map, Value};

use crate::value as v;

use crate::copy::{explain, parse_capture_failure, parse_divert_failure};
use crate::decide::{decide, outcome_for};
use crate::model::{
    CaptureFailure, CaptureReceipt, CapturedFile, Cause, Copy, CopyContext, Decision, DivertFailure, DivertResidue,
    Evidence, Observation, Operation, Outcome,
};

/// Parse an observation from a JSON value.
pub fn observation_from_value(v: &Value) -> Result<Observation, String> {
    let obj = v.as_object().ok_or("observation must be a JSON object")?;
    let operation = match obj.get("operation") {
        None | Some(Value::Null) => Operation::AppendBatch,
        Some(Value::String(s)) => Operation::from_label(s).ok_or_else(|| {
            format!(
                "unknown operation `{}`: expected open, append_batch, checkpoint, divert or replay",
                clip(s)
            )
        })?,
        Some(_) => return Err("field `operation` must be a string".into()),
    };
    let evidence = match obj.get("evidence") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut out: Vec<Evidence> = items
                .iter()
                .filter_map(|i| i.as_str().and_then(Evidence::from_label))
                .collect();
            out.sort();
            out.dedup();
            out
        }
        Some(_) => return Err("field `evidence` must be a list of strings".into()),
    };
    let message = match obj.get("message") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("field `message` must be a string".into()),
    };
    Ok(Observation {
        operation,
        code: int_field(obj, "code")?,
        extended_code: int_field(obj, "extended_code")?,
        message,
        errno: int_field(obj, "errno")?,
        evidence,
        attempt: int_field(obj, "attempt")?.map_or(1, |a| a.clamp(1, i64::from(u32::MAX)) as u32),
        elapsed_ms: int_field(obj, "elapsed_ms")?.map_or(0, |e| e.max(0) as u64),
        seed: seed_field(obj)?,
    })
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Any JSON integer, saturated to i64; `null` or missing is `None`.
fn int_field(obj: &Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                Ok(Some(i))
            } else if n.as_u64().is_some() {
                Ok(Some(i64::MAX))
            } else {
                match n.as_f64() {
                    Some(f) if is_integral(f) => Ok(Some(f as i64)),
                    _ => Err(format!("field `{key}` must be an integer")),
                }
            }
        }
        Some(_) => Err(format!("field `{key}` must be an integer or null")),
    }
}

/// A finite float with no fractional part (every float of magnitude
/// 2^53 or more is one). `f64::fract` needs std.
fn is_integral(f: f64) -> bool {
    f.is_finite() && (f.abs() >= 9_007_199_254_740_992.0 || (f as i64) as f64 == f)
}

/// The seed is a u64; negative values are taken modulo 2^64.
fn seed_field(obj: &Map<String, Value>) -> Result<u64, String> {
    match obj.get("seed") {
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or(0)),
        _ => Ok(int_field(obj, "seed")?.map_or(0, |s| s as u64)),
    }
}

/// The JSON that `turnsafe classify` prints for one observation.
pub fn decision_to_value(d: &Decision) -> Value {
    let mut m = Map::new();
    m.insert("cause".into(), d.classification.cause.label().into());
    m.insert("basis".into(), d.classification.basis.label().into());
    m.insert("action".into(), d.action.label().into());
    if let Some(delay) = d.delay_ms {
        m.insert("delay_ms".into(), delay.into());
    }
    m.insert("sticky".into(), d.sticky.into());
    m.insert("capture".into(), d.capture.into());
    m.insert("failure".into(), d.classification.cause.failure_label().into());
    Value::Object(m)
}

pub fn copy_to_value(c: &Copy) -> Value {
    let details: Map<String, Value> = c
        .details
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    v::obj(vec![
        ("code", v::s(&c.code)),
        ("cause", v::s(c.cause.label())),
        ("outcome", v::s(c.outcome.label())),
        ("title", v::s(&c.title)),
        ("body", v::s(&c.body)),
        ("remediation", v::strs(&c.remediation)),
        ("details", Value::Object(details)),
    ])
}

fn error_value(msg: impl Into<String>) -> Value {
    v::obj(vec![("error", Value::String(msg.into()))])
}

/// `classify-json`: one observation object in, the classify object out.
pub fn classify_json(observation: &str) -> String {
    let out = match serde_json::from_str::<Value>(observation) {
        Ok(v) => match observation_from_value(&v) {
            Ok(obs) => decision_to_value(&decide(&obs)),
            Err(e) => error_value(e),
        },
        Err(e) => error_value(format!("invalid JSON: {e}")),
    };
    out.to_string()
}

/// Read the copy context: `session`, `receipt_path`, `errno`;
/// `divert_failed` / `divert_error` as `true`, a string such as
/// `"open: EMFILE"`, or `{operation, errno}`; `capture_receipt` as the
/// capture folder's path or `{path, files?, manifest_sha256?}`;
/// `capture_failure` / `capture_error` as `true`, a string or
/// `{operation, errno}`; `divert_residue` as `{path, offset}`.
pub fn context_from_value(v: Option<&Value>) -> Result<CopyContext, String> {
    let Some(v) = v else {
        return Ok(CopyContext::default());
    };
    if v.is_null() {
        return Ok(CopyContext::default());
    }
    let obj = v.as_object().ok_or("context must be a JSON object")?;
    let string = |key: &str| -> Result<Option<String>, String> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("field `{key}` must be a string")),
        }
    };
    let failure_value = obj.get("divert_failed").or_else(|| obj.get("divert_error"));
    let divert_failure = match failure_value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(DivertFailure {
            operation: "write".into(),
            errno: None,
        }),
        Some(Value::String(s)) => Some(parse_divert_failure(s)),
        Some(Value::Object(f)) => Some(DivertFailure {
            operation: f
                .get("operation")
                .and_then(Value::as_str)
                .unwrap_or("write")
                .to_string(),
            errno: int_field(f, "errno")?,
        }),
        Some(_) => return Err("field `divert_failed` must be true, a string or an object".into()),
    };
    Ok(CopyContext {
        session: string("session")?,
        receipt_path: string("receipt_path")?,
        divert_failure,
        errno: int_field(obj, "errno")?,
        capture_receipt: capture_receipt(obj.get("capture_receipt"))?,
        capture_failure: capture_failure(obj.get("capture_failure").or_else(|| obj.get("capture_error")))?,
        divert_residue: divert_residue(obj.get("divert_residue"))?,
    })
}

fn capture_receipt(v: Option<&Value>) -> Result<Option<CaptureReceipt>, String> {
    let bad = "field `capture_receipt` must be a path or {path, files, manifest_sha256}";
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(path)) => Ok(Some(CaptureReceipt {
            path: path.clone(),
            files: Vec::new(),
            manifest_sha256: String::new(),
        })),
        Some(Value::Object(r)) => {
            let path = r.get("path").and_then(Value::as_str).ok_or(bad)?.to_string();
            let files = match r.get("files") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|f| {
                        let name = f.get("name").and_then(Value::as_str).ok_or(bad)?;
                        let size = f.get("size").and_then(Value::as_u64).ok_or(bad)?;
                        Ok(CapturedFile {
                            name: name.to_string(),
                            size,
                        })
                    })
                    .collect::<Result<_, &str>>()?,
                Some(_) => return Err(bad.into()),
            };
            let manifest_sha256 = match r.get("manifest_sha256") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err(bad.into()),
            };
            Ok(Some(CaptureReceipt {
                path,
                files,
                manifest_sha256,
            }))
        }
        Some(_) => Err(bad.into()),
    }
}

fn capture_failure(v: Option<&Value>) -> Result<Option<CaptureFailure>, String> {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(CaptureFailure {
            operation: "write".into(),
            errno: None,
        })),
        Some(Value::String(s)) => Ok(Some(parse_capture_failure(s))),
        Some(Value::Object(f)) => Ok(Some(CaptureFailure {
            operation: f
                .get("operation")
                .and_then(Value::as_str)
                .unwrap_or("write")
                .to_string(),
            errno: int_field(f, "errno")?,
        })),
        Some(_) => Err("field `capture_failure` must be true, a string or an object".into()),
    }
}

fn divert_residue(v: Option<&Value>) -> Result<Option<DivertResidue>, String> {
    let bad = "field `divert_residue` must be {path, offset}";
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Object(r)) => Ok(Some(DivertResidue {
            path: r.get("path").and_then(Value::as_str).ok_or(bad)?.to_string(),
            offset: r.get("offset").and_then(Value::as_u64).ok_or(bad)?,
        })),
        Some(_) => Err(bad.into()),
    }
}

/// `explain-json`: `{cause, outcome, session?, receipt_path?, divert_error?,
/// capture_receipt?, capture_failure?, divert_residue?}` in, the copy object out (or `{"error"}` for a pair the table never makes).
pub fn explain_json(request: &str) -> String {
    let run = || -> Result<Value, String> {
        let v: Value = serde_json::from_str(request).map_err(|e| format!("invalid JSON: {e}"))?;
        let obj = v.as_object().ok_or("request must be a JSON object")?;
        let cause = obj
            .get("cause")
            .and_then(Value::as_str)
            .and_then(Cause::from_label)
            .ok_or("field `cause` must be a cause label")?;
        let outcome = obj
            .get("outcome")
            .and_then(Value::as_str)
            .and_then(Outcome::from_label)
            .ok_or("field `outcome` must be persisted, diverted, divert_failed or handed_back")?;
        let ctx = context_from_value(Some(&v))?;
        explain(cause, outcome, &ctx)
            .map(|c| copy_to_value(&c))
            .map_err(|e| e.to_string())
    };
    run().unwrap_or_else(error_value).to_string()
}

/// `evaluate-json`: `{observation, context?}` in; the classify object plus
/// `outcome` and `copy` out. `context.outcome` may name the outcome; else it
/// follows from the action and the context (see [`outcome_for`]), and is
/// `null` for a divert whose result is not given.
pub fn evaluate_json(request: &str) -> String {
    let run = || -> Result<Value, String> {
        let v: Value = serde_json::from_str(request).map_err(|e| format!("invalid JSON: {e}"))?;
        let obj = v.as_object().ok_or("request must be a JSON object")?;
        let obs = observation_from_value(obj.get("observation").unwrap_or(&Value::Null))?;
        let ctx_value = obj.get("context");
        let mut ctx = context_from_value(ctx_value)?;
        if ctx.errno.is_none() {
            ctx.errno = obs.errno;
        }
        let d = decide(&obs);
        let cause = d.classification.cause;
        let copy = match ctx_value.and_then(|c| c.get("outcome")).and_then(Value::as_str) {
            Some(label) => {
                let o = Outcome::from_label(label).ok_or("unknown `context.outcome`")?;
                Some(explain(cause, o, &ctx).map_err(|e| e.to_string())?)
            }
            // A derived outcome the table cannot pair with this cause (a
            // fenced write that reached the divert step) has no user copy.
            None => outcome_for(obs.operation, d.action, &ctx).and_then(|o| explain(cause, o, &ctx).ok()),
        };
        let mut out = decision_to_value(&d);
        let (outcome_v, copy_v) = match copy {
            Some(c) => (Value::from(c.outcome.label()), copy_to_value(&c)),
            None => (Value::Null, Value::Null),
        };
        if let Value::Object(m) = &mut out {
            m.insert("outcome".into(), outcome_v);
            m.insert("copy".into(), copy_v);
        }
        Ok(out)
    };
    run().unwrap_or_else(error_value).to_string()
}
