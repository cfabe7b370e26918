//! JSON entry points (string in, string out), for runtimes with weak
//! component support and for the `turnsafe` CLI. Every function here is
//! total: malformed input yields `{"error": "..."}`, never a panic.
//!
//! Field rules for an observation object: `operation` defaults to
//! `append_batch`; `code`, `extended_code` and `errno` take any integer,
//! `null` or missing means absent; `evidence` is a list of labels and
//! unknown labels are ignored; `attempt`, `elapsed_ms` and `seed` are
//! integers (negative `attempt`/`elapsed_ms` read as 0); `sqlstate` is a
//! five-character SQLSTATE (digits and capitals); `engine` is `sqlite` or
//! `postgres`, and when missing it is `postgres` if a `sqlstate` is given,
//! else `sqlite`; extra fields are ignored. A field of the wrong type is
//! an error, not a guess.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::copy::{explain, explain_tls, parse_capture_failure, parse_divert_failure};
use crate::decide::{decide, outcome_for};
use crate::fields::{Fields, clip, engine_value, evidence_labels, lease_holder, sqlstate_value};
use crate::jsontext::{Json, parse};
use crate::lease::{LeaseProbe, LocalProbe, ServerProbe, lease_verdict};
use crate::model::{
    CaptureFailure, CaptureReceipt, Cause, Copy, CopyContext, Decision, DivertFailure, DivertResidue, Observation,
    Operation, Outcome, TlsFailure,
};
use crate::text::cat;
use crate::value::{self as v, copy_json};

/// Parse an observation from a JSON object.
pub(crate) fn observation_from_json(obj: &Json) -> Result<Observation, String> {
    if !obj.is_object() {
        return Err("observation must be a JSON object".into());
    }
    let mut f = Fields::new(obj, "");
    let operation = match f.get("operation") {
        None => Operation::AppendBatch,
        Some(Json::Str(s)) => Operation::from_label(s).unwrap_or_else(|| {
            f.fail(cat(&[
                "unknown operation `",
                clip(s),
                "`: expected open, append_batch, checkpoint, divert or replay",
            ]));
            Operation::AppendBatch
        }),
        Some(_) => {
            f.fail_field("operation", "must be a string");
            Operation::AppendBatch
        }
    };
    let evidence = match f.get("evidence") {
        None => Vec::new(),
        Some(Json::Arr(items)) => evidence_labels(items),
        Some(_) => {
            f.fail_field("evidence", "must be a list of strings");
            Vec::new()
        }
    };
    let message = f.opt_string("message").unwrap_or_default();
    let sqlstate = f.check(sqlstate_value(f.get("sqlstate")));
    let engine = f.check(engine_value(f.get("engine"), sqlstate.is_some()));
    let obs = Observation {
        operation,
        engine,
        sqlstate,
        code: f.int("code"),
        extended_code: f.int("extended_code"),
        message,
        errno: f.int("errno"),
        evidence,
        attempt: f.int("attempt").map_or(1, |a| a.clamp(1, i64::from(u32::MAX)) as u32),
        elapsed_ms: f.int("elapsed_ms").map_or(0, |e| e.max(0) as u64),
        seed: seed_field(&mut f),
        lease: f.check(lease_holder(obj.get("lease"))).map(Box::new),
    };
    f.done(obs)
}

/// `decide-lease-json`: `{now_ms, expires_ms?, local?, server?}` in
/// (`local` and `server` are probe labels, `unrecorded` when absent);
/// `{verdict, take_over}` out.
pub fn decide_lease_json(request: &str) -> String {
    let run = || -> Result<Json, String> {
        let v = parse_request(request)?;
        if !v.is_object() {
            return Err("request must be a JSON object".into());
        }
        let mut f = Fields::new(&v, "");
        let now_ms = f.int("now_ms");
        if now_ms.is_none() {
            f.fail_field("now_ms", "must be an integer");
        }
        let expires_ms = f.int("expires_ms");
        let local = match f.opt_string("local") {
            None => LocalProbe::Unrecorded,
            Some(l) => LocalProbe::from_label(&l).unwrap_or_else(|| {
                f.fail_field(
                    "local",
                    "must be unrecorded, other_machine, running, exited, pid_reused or unreadable",
                );
                LocalProbe::Unrecorded
            }),
        };
        let server = match f.opt_string("server") {
            None => ServerProbe::Unrecorded,
            Some(l) => ServerProbe::from_label(&l).unwrap_or_else(|| {
                f.fail_field("server", "must be unrecorded, alive, gone or unknown");
                ServerProbe::Unrecorded
            }),
        };
        let probe = f.done(LeaseProbe {
            now_ms: now_ms.unwrap_or_default(),
            expires_ms,
            local,
            server,
        })?;
        let verdict = lease_verdict(&probe);
        let mut out = v::Obj::new();
        out.str("verdict", verdict.label());
        out.bool("take_over", verdict.takes_over());
        Ok(out.done())
    };
    run().unwrap_or_else(v::error).to_text()
}

/// The seed is a u64; negative values are taken modulo 2^64.
fn seed_field(f: &mut Fields<'_>) -> u64 {
    match f.get("seed").and_then(Json::as_u64) {
        Some(n) => n,
        None => f.int("seed").map_or(0, |s| s as u64),
    }
}

/// The object `turnsafe classify` prints for one decision.
fn decision_json(d: &Decision) -> v::Obj {
    let mut o = v::Obj::new();
    o.str("cause", d.classification.cause.label());
    o.str("basis", d.classification.basis.label());
    o.str("action", d.action.label());
    if let Some(delay) = d.delay_ms {
        o.uint("delay_ms", delay);
    }
    o.bool("sticky", d.sticky);
    o.bool("capture", d.capture);
    o.field("failure", Json::Str(d.classification.cause.failure_label()));
    o
}

/// The copy object as a `serde_json::Value`, for native hosts.
#[cfg(not(target_arch = "wasm32"))]
pub fn copy_to_value(c: &Copy) -> serde_json::Value {
    serde_json::from_str(&copy_json(c).to_text()).unwrap_or(serde_json::Value::Null)
}

fn parse_request(text: &str) -> Result<Json, String> {
    parse(text).map_err(|e| cat(&["invalid JSON: ", &e]))
}

/// `classify-json`: one observation object in, the classify object out.
pub fn classify_json(observation: &str) -> String {
    let out = match parse_request(observation) {
        Ok(v) => match observation_from_json(&v) {
            Ok(obs) => decision_json(&decide(&obs)).done(),
            Err(e) => v::error(e),
        },
        Err(e) => v::error(e),
    };
    out.to_text()
}

/// Read the copy context: `session`, `receipt` (the whole divert receipt,
/// `{path, offset, length, count, sha256}`), `errno`;
/// `divert_failed` / `divert_error` as `true`, a string such as
/// `"open: EMFILE"`, or `{operation, errno}`; `capture_receipt` as the
/// capture folder's path or `{path, files?, manifest_sha256?}`;
/// `capture_failure` / `capture_error` as `true`, a string or
/// `{operation, errno}`; `divert_residue` as `{path, offset}`;
/// `pending_capture` as the capture folder's path; `durability` as
/// `synced` (the default) or `unsynced`; `engine` as `sqlite` (the default)
/// or `postgres`.
fn context_from_json(v: Option<&Json>) -> Result<CopyContext, String> {
    let Some(obj) = v.filter(|v| !v.is_null()) else {
        return Ok(CopyContext::default());
    };
    if !obj.is_object() {
        return Err("context must be a JSON object".into());
    }
    let mut f = Fields::new(obj, "");
    if f.get("receipt_path").is_some() {
        // 0.2.0 took a bare path; a path proves nothing was kept.
        f.fail_field("receipt_path", "is gone: pass `receipt`");
    }
    let divert_failure = divert_failure(&mut f, obj.get("divert_failed").or_else(|| obj.get("divert_error")));
    let ctx = CopyContext {
        session: f.opt_string("session"),
        receipt: f.check(divert_receipt(obj.get("receipt"))),
        divert_failure,
        errno: f.int("errno"),
        capture_receipt: f.check(capture_receipt(obj.get("capture_receipt"))),
        capture_failure: capture_failure(&mut f, obj.get("capture_failure").or_else(|| obj.get("capture_error"))),
        divert_residue: f.check(divert_residue(obj.get("divert_residue"))),
        pending_capture: f.opt_string("pending_capture"),
        durability: f.durability("durability"),
        engine: f.check(engine_value(obj.get("engine"), false)),
        lease: f.check(lease_holder(obj.get("lease"))),
    };
    f.done(ctx)
}

/// The `errno` of a failure object.
fn errno_of(f: &mut Fields<'_>, failure: &Json) -> Option<i64> {
    let mut inner = Fields::new(failure, "");
    let errno = inner.int("errno");
    f.check(inner.done(errno))
}

/// The operation of a failure object; `write` when it names none.
fn operation_of(failure: &Json) -> String {
    failure
        .get("operation")
        .and_then(Json::as_str)
        .unwrap_or("write")
        .to_string()
}

fn divert_failure(f: &mut Fields<'_>, v: Option<&Json>) -> Option<DivertFailure> {
    match v? {
        Json::Null | Json::Bool(false) => None,
        Json::Bool(true) => Some(DivertFailure {
            operation: "write".into(),
            errno: None,
        }),
        Json::Str(s) => Some(parse_divert_failure(s)),
        o @ Json::Obj(_) => Some(DivertFailure {
            operation: operation_of(o),
            errno: errno_of(f, o),
        }),
        _ => {
            f.fail("field `divert_failed` must be true, a string or an object".into());
            None
        }
    }
}

/// Only the folder's path shapes the copy; the rest of a receipt object
/// (`files`, `manifest_sha256`) is the host's to keep.
fn capture_receipt(v: Option<&Json>) -> Result<Option<CaptureReceipt>, String> {
    let path = match v {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Str(path)) => path,
        Some(r @ Json::Obj(_)) => r.get("path").and_then(Json::as_str).ok_or(BAD_RECEIPT)?,
        Some(_) => return Err(BAD_RECEIPT.into()),
    };
    Ok(Some(CaptureReceipt {
        path: path.to_string(),
        files: Vec::new(),
        manifest_sha256: String::new(),
    }))
}

const BAD_RECEIPT: &str = "field `capture_receipt` must be the capture folder's path or {path, ...}";

fn capture_failure(f: &mut Fields<'_>, v: Option<&Json>) -> Option<CaptureFailure> {
    match v? {
        Json::Null | Json::Bool(false) => None,
        Json::Bool(true) => Some(CaptureFailure {
            operation: "write".into(),
            errno: None,
        }),
        Json::Str(s) => Some(parse_capture_failure(s)),
        o @ Json::Obj(_) => Some(CaptureFailure {
            operation: operation_of(o),
            errno: errno_of(f, o),
        }),
        _ => {
            f.fail("field `capture_failure` must be true, a string or an object".into());
            None
        }
    }
}

/// The whole divert receipt, checked as the copy will check it.
fn divert_receipt(v: Option<&Json>) -> Result<Option<crate::machine::DivertReceipt>, String> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(r @ Json::Obj(_)) => {
            let receipt = crate::machine::wire::divert_receipt_from(r)?;
            receipt.check().map_err(|why| cat(&["field `receipt`: ", why]))?;
            Ok(Some(receipt))
        }
        Some(_) => Err("field `receipt` must be an object".into()),
    }
}

fn divert_residue(v: Option<&Json>) -> Result<Option<DivertResidue>, String> {
    let bad = "field `divert_residue` must be {path, offset}";
    match v {
        None | Some(Json::Null) | Some(Json::Bool(false)) => Ok(None),
        Some(r @ Json::Obj(_)) => Ok(Some(DivertResidue {
            path: r.get("path").and_then(Json::as_str).ok_or(bad)?.to_string(),
            offset: r.get("offset").and_then(Json::as_u64).ok_or(bad)?,
        })),
        Some(_) => Err(bad.into()),
    }
}

/// `explain-json`: `{cause, outcome, session?, receipt?, divert_error?,
/// capture_receipt?, capture_failure?, divert_residue?}` in, the copy
/// object out (or `{"error"}` for a pair the table never makes).
pub fn explain_json(request: &str) -> String {
    let run = || -> Result<Json, String> {
        let v = parse_request(request)?;
        if !v.is_object() {
            return Err("request must be a JSON object".into());
        }
        let cause = v
            .get("cause")
            .and_then(Json::as_str)
            .and_then(Cause::from_label)
            .ok_or("field `cause` must be a cause label")?;
        let outcome = v
            .get("outcome")
            .and_then(Json::as_str)
            .and_then(Outcome::from_label)
            .ok_or("field `outcome` must be persisted, diverted, divert_failed or handed_back")?;
        let ctx = context_from_json(Some(&v))?;
        explain(cause, outcome, &ctx)
            .map(|c| copy_json(&c))
            .map_err(|e| e.message())
    };
    run().unwrap_or_else(v::error).to_text()
}

/// `evaluate-json`: `{observation, context?}` in; the classify object plus
/// `outcome` and `copy` out. `context.outcome` may name the outcome; else it
/// follows from the action and the context (see [`outcome_for`]), and is
/// `null` for a divert whose result is not given.
pub fn evaluate_json(request: &str) -> String {
    let run = || -> Result<Json, String> {
        let v = parse_request(request)?;
        if !v.is_object() {
            return Err("request must be a JSON object".into());
        }
        let obs = observation_from_json(v.get("observation").unwrap_or(&Json::Null))?;
        let ctx_value = v.get("context");
        let mut ctx = context_from_json(ctx_value)?;
        if ctx.errno.is_none() {
            ctx.errno = obs.errno;
        }
        // The copy names the steps of the engine the failure came from.
        ctx.engine = obs.engine;
        if ctx.lease.is_none() {
            ctx.lease = obs.lease.as_deref().cloned();
        }
        let d = decide(&obs);
        let cause = d.classification.cause;
        // The copy the flush machine would give this failure: its TLS
        // reason, if its message names one, shapes a `disk` copy.
        let tls = TlsFailure::of(&obs);
        // And a failure at or after COMMIT's write says it possibly wrote.
        let written = crate::written::possibly_written(&obs, cause);
        let copy = match ctx_value.and_then(|c| c.get("outcome")).and_then(Json::as_str) {
            Some(label) => {
                let o = Outcome::from_label(label).ok_or("unknown `context.outcome`")?;
                Some(explain_tls(cause, o, &ctx, tls, written).map_err(|e| e.message())?)
            }
            // A derived outcome the table cannot pair with this cause (a
            // fenced write that reached the divert step) has no user copy.
            None => {
                outcome_for(obs.operation, d.action, &ctx).and_then(|o| explain_tls(cause, o, &ctx, tls, written).ok())
            }
        };
        let mut out = decision_json(&d);
        match copy {
            Some(c) => {
                out.str("outcome", c.outcome.label());
                out.field("copy", copy_json(&c));
            }
            None => {
                out.field("outcome", Json::Null);
                out.field("copy", Json::Null);
            }
        }
        Ok(out.done())
    };
    run().unwrap_or_else(v::error).to_text()
}

/// `decide-scope-json`: `{observation, transaction_open}` in (the
/// observation of a failure inside a group's transaction, and whether the
/// engine still holds that transaction open); `{scope}` out, `batch` or
/// `transaction` (see [`crate::machine::failure_scope`]).
pub fn decide_scope_json(request: &str) -> String {
    let run = || -> Result<Json, String> {
        let v = parse_request(request)?;
        if !v.is_object() {
            return Err("request must be a JSON object".into());
        }
        let obs = observation_from_json(v.get("observation").unwrap_or(&Json::Null))?;
        let transaction_open = match v.get("transaction_open") {
            Some(Json::Bool(b)) => *b,
            _ => return Err("field `transaction_open` must be true or false".into()),
        };
        let mut out = v::Obj::new();
        out.str("scope", crate::machine::failure_scope(&obs, transaction_open).label());
        Ok(out.done())
    };
    run().unwrap_or_else(v::error).to_text()
}
