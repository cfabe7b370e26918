//! The flush machine as one JSON function, for runtimes with weak resource
//! support: `flush_step_json(request) -> answer`.
//!
//! Request: `{"state": <opaque or null>, "start": <start or null>,
//! "event": <event or null>}`. A null state is a new handle; `start`
//! (`session`, `uids`, `minted_uids`, `seed`) begins a flush on it; `event`
//! answers the step the last answer gave. Answer: `{"state": <opaque>,
//! "step": <step or null>}`, or `{"error": "..."}`; after an error the
//! host sends its last good state again.
//!
//! The state is opaque to hosts: they keep it and send it back unchanged.
//! It carries a format version (`v`), and a state this build did not write
//! is refused with a clear error, never guessed at. (Inside, it holds what
//! the handle knows across batches and the inputs of the running flush,
//! which the machine replays: a pure machine gives the same state again.)
//!
//! Steps (by `type`): `open`; `write` with `plan` (`degrade_fts`,
//! `recreate_session`); `wait` with `ms`; `capture`; `divert` with `cause`;
//! `resolve` (look the batch's uids up on the connection just opened);
//! `done` with `outcome`, exactly the object `turnsafe append` prints.
//!
//! Events (by `type`): `opened`; `committed`; `failed` with `code`,
//! `extended_code`, `message`, `errno`, `evidence`, `elapsed_ms`, and
//! optionally `engine`, `sqlstate` and `lease` (the holder of the lease
//! that fenced the write: `name`, `place`, `pid`, `backend_pid`, `expires_ms`); `waited` with `elapsed_ms`;
//! `resolved` with `all_stored` (true or false); `captured` with `receipt` (`path`, `files` of `name`
//! and `size`, `manifest_sha256`); `capture_failed` with `operation`,
//! `errno`, `error`; `diverted` with `receipt` (`path`, `offset`, `length`,
//! `count`, `sha256`); `divert_failed` with `operation`, `errno`,
//! `message`, `residue` (`{path, offset}` or null).

#[allow(unused_imports)]
use crate::prelude::*;

use crate::jsontext::{Json, parse};

use super::{CaptureReport, DivertReceipt, Event, Failure, FlushStart, Handle, HandleState, Step};
use crate::collect::{map, try_map};
use crate::fields::Fields;
use crate::model::{CaptureFailure, CaptureReceipt, CapturedFile, Cause, DivertFailure, DivertResidue, Engine};
use crate::text::{cat, unsigned};
use crate::value as v;

/// The version of the opaque state this build reads and writes.
pub const STATE_FORMAT: u64 = 1;

type Obj = Json;
type Value = Json;

fn field<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Obj, String> {
    if v.is_object() {
        Ok(v)
    } else {
        Err(cat(&[what, " must be a JSON object"]))
    }
}

fn start_from_value(v: &Value) -> Result<FlushStart, String> {
    let mut f = Fields::new(object(v, "`start`")?, "start");
    let start = FlushStart {
        session: f.string("session"),
        uids: f.strings("uids"),
        minted_uids: f.strings("minted_uids"),
        seed: f.u64("seed"),
        pending_capture: None,
        durability: crate::model::Durability::Synced,
    };
    let pending = f.get("pending_capture");
    let durability = f.durability("durability");
    let start = FlushStart {
        pending_capture: match pending {
            None => None,
            Some(p) => f.check(pending_capture_from(p).map(Some)),
        },
        durability,
        ..start
    };
    f.done(start)
}

/// `{path, cause}`: an unsettled capture that holds rows of the session.
fn pending_capture_from(v: &Value) -> Result<super::PendingCapture, String> {
    let mut f = Fields::new(object(v, "`pending_capture`")?, "pending_capture");
    let path = f.required_string("path");
    let label = f.required_string("cause");
    let cause = Cause::from_label(&label);
    if cause.is_none() {
        f.fail_field("cause", "must be a cause label");
    }
    f.done(super::PendingCapture {
        path,
        cause: cause.unwrap_or(Cause::Unknown),
    })
}

fn start_to_value(s: &FlushStart) -> Value {
    let mut o = v::Obj::new();
    o.str("session", &s.session);
    o.strs("uids", &s.uids);
    o.strs("minted_uids", &s.minted_uids);
    o.uint("seed", s.seed);
    if let Some(p) = &s.pending_capture {
        let mut c = v::Obj::new();
        c.str("path", &p.path);
        c.str("cause", p.cause.label());
        o.field("pending_capture", c.done());
    }
    // Written only when it is not the default, so a state written before
    // the field existed reads back the same.
    if s.durability != crate::model::Durability::Synced {
        o.str("durability", s.durability.label());
    }
    o.done()
}

fn capture_receipt_from(o: &Obj) -> Result<CaptureReceipt, String> {
    let what = "capture receipt";
    let files = match field(o, "files") {
        None => Vec::new(),
        Some(Json::Arr(items)) => try_map(items, |file| {
            let mut f = Fields::new(object(file, "a captured file")?, what);
            let file = CapturedFile {
                name: f.required_string("name"),
                size: f.u64("size"),
            };
            f.done(file)
        })?,
        Some(_) => return Err(cat(&[what, ": `files` must be a list"])),
    };
    let mut f = Fields::new(o, what);
    let receipt = CaptureReceipt {
        path: f.required_string("path"),
        files,
        manifest_sha256: f.string("manifest_sha256"),
    };
    f.done(receipt)
}

pub(crate) fn divert_receipt_from(o: &Obj) -> Result<DivertReceipt, String> {
    let mut f = Fields::new(o, "divert receipt");
    let receipt = DivertReceipt {
        path: f.required_string("path"),
        offset: f.u64("offset"),
        length: f.u64("length"),
        count: f.u64("count"),
        sha256: f.string("sha256"),
    };
    f.done(receipt)
}

/// The `residue` of a failed divert: `{path, offset}`, or absent.
fn residue_from(f: &mut Fields<'_>) -> Option<DivertResidue> {
    let r = f.get("residue")?;
    let residue = object(r, "`residue`").and_then(|r| {
        let mut rf = Fields::new(r, "residue");
        let residue = DivertResidue {
            path: rf.required_string("path"),
            offset: rf.u64("offset"),
        };
        rf.done(residue)
    });
    f.check(residue.map(Some))
}

/// An event from its wire object.
pub(crate) fn event_from_value(v: &Value) -> Result<Event, String> {
    let o = object(v, "`event`")?;
    let Some(Json::Str(kind)) = field(o, "type") else {
        return Err("event: field `type` must be a string".into());
    };
    let what = cat(&["event `", kind, "`"]);
    let mut f = Fields::new(o, &what);
    let event = match kind.as_str() {
        "opened" => Event::Opened,
        "committed" => Event::Committed,
        "failed" => {
            let evidence = match f.get("evidence") {
                None => Vec::new(),
                Some(Json::Arr(items)) => crate::fields::evidence_labels(items),
                Some(_) => {
                    f.fail(cat(&[&what, ": `evidence` must be a list of labels"]));
                    Vec::new()
                }
            };
            let sqlstate = f.check(crate::fields::sqlstate_value(f.get("sqlstate")));
            let engine = f.check(crate::fields::engine_value(f.get("engine"), sqlstate.is_some()));
            Event::Failed(Failure {
                engine,
                sqlstate,
                code: f.i64_opt("code"),
                extended_code: f.i64_opt("extended_code"),
                message: f.string("message"),
                errno: f.i64_opt("errno"),
                evidence,
                elapsed_ms: f.u64("elapsed_ms"),
                lease: f.check(crate::fields::lease_holder(f.get("lease"))).map(Box::new),
            })
        }
        "waited" => Event::Waited {
            elapsed_ms: f.u64("elapsed_ms"),
        },
        "resolved" => Event::Resolved {
            all_stored: match f.get("all_stored") {
                Some(Json::Bool(b)) => *b,
                _ => {
                    f.fail_field("all_stored", "must be true or false");
                    false
                }
            },
        },
        "captured" => Event::Captured(capture_receipt_from(receipt(o, &what)?)?),
        "capture_failed" => Event::CaptureFailed {
            failure: CaptureFailure {
                operation: f.required_string("operation"),
                errno: f.i64_opt("errno"),
            },
            error: f.string("error"),
        },
        "diverted" => Event::Diverted(divert_receipt_from(receipt(o, &what)?)?),
        "divert_failed" => Event::DivertFailed {
            failure: DivertFailure {
                operation: f.required_string("operation"),
                errno: f.i64_opt("errno"),
            },
            message: f.string("message"),
            residue: residue_from(&mut f),
        },
        other => {
            return Err(cat(&[
                "unknown event `",
                other,
                "`: expected opened, committed, failed, waited, resolved, captured, capture_failed, diverted \
                 or divert_failed",
            ]));
        }
    };
    f.done(event)
}

/// The `receipt` object of a `captured` or `diverted` event.
fn receipt<'a>(o: &'a Obj, what: &str) -> Result<&'a Obj, String> {
    match field(o, "receipt") {
        Some(r) if r.is_object() => Ok(r),
        _ => Err(cat(&[what, ": field `receipt` must be an object"])),
    }
}

/// A wire object of type `kind`, for its other fields to be added.
fn typed(kind: &str) -> v::Obj {
    let mut o = v::Obj::new();
    o.str("type", kind);
    o
}

fn captured_value(r: &CaptureReceipt) -> Value {
    let mut o = typed("captured");
    o.field("receipt", v::capture_receipt(r));
    o.done()
}

fn capture_failed_value(failure: &CaptureFailure, error: &str) -> Value {
    let mut o = typed("capture_failed");
    o.str("operation", &failure.operation);
    o.opt_int("errno", failure.errno);
    o.str("error", error);
    o.done()
}

/// A capture the handle keeps, as the event that reported it.
fn capture_to_value(c: &CaptureReport) -> Value {
    match c {
        CaptureReport::Captured(r) => captured_value(r),
        CaptureReport::Failed { failure, error } => capture_failed_value(failure, error),
    }
}

/// An event as its wire object.
pub(crate) fn event_to_value(e: &Event) -> Value {
    let mut o = typed(e.label());
    match e {
        Event::Opened | Event::Committed => {}
        Event::Failed(f) => {
            o.opt_int("code", f.code);
            o.opt_int("extended_code", f.extended_code);
            o.str("message", &f.message);
            o.opt_int("errno", f.errno);
            o.field("evidence", Json::Arr(map(&f.evidence, |e| v::s(e.label()))));
            o.uint("elapsed_ms", f.elapsed_ms);
            // Only what is not the default, so a SQLite host's state reads
            // exactly as before these fields existed.
            if f.engine != crate::model::Engine::Sqlite {
                o.str("engine", f.engine.label());
            }
            if let Some(s) = &f.sqlstate {
                o.str("sqlstate", s);
            }
            if let Some(h) = &f.lease {
                o.field("lease", crate::value::lease_holder_value(h));
            }
        }
        Event::Resolved { all_stored } => o.bool("all_stored", *all_stored),
        Event::Waited { elapsed_ms } => o.uint("elapsed_ms", *elapsed_ms),
        Event::Captured(r) => o.field("receipt", v::capture_receipt(r)),
        Event::CaptureFailed { failure, error } => {
            o.str("operation", &failure.operation);
            o.opt_int("errno", failure.errno);
            o.str("error", error);
        }
        Event::Diverted(r) => o.field("receipt", v::divert_receipt(r)),
        Event::DivertFailed {
            failure,
            message,
            residue,
        } => {
            o.str("operation", &failure.operation);
            o.opt_int("errno", failure.errno);
            o.str("message", message);
            o.field("residue", v::residue(residue.as_ref()));
        }
    }
    o.done()
}

/// A step as its wire object.
pub(crate) fn step_to_value(step: &Step) -> Value {
    let mut o = typed(step.label());
    match step {
        Step::Open | Step::Capture | Step::Resolve => {}
        Step::Write(p) => {
            let mut plan = v::Obj::new();
            plan.bool("degrade_fts", p.degrade_fts);
            plan.bool("recreate_session", p.recreate_session);
            o.field("plan", plan.done());
        }
        Step::Wait { ms } => o.uint("ms", *ms),
        Step::Divert { cause } => o.str("cause", cause.label()),
        Step::Done(report) => o.field("outcome", report.json()),
    }
    o.done()
}

/// The opaque state as read: what the handle knew when the running flush
/// started, and that flush's inputs.
struct Read {
    state: HandleState,
    flush: Option<(FlushStart, Vec<Event>)>,
}

/// The state's fields for what a handle knows across batches, with the
/// format version; the caller adds `flush`.
fn handle_fields(s: &HandleState) -> v::Obj {
    let mut o = v::Obj::new();
    o.uint("v", STATE_FORMAT);
    o.bool("open", s.open);
    o.opt_str("sticky", s.sticky.map(Cause::label));
    // Written only for PostgreSQL, so a SQLite host's state reads as before.
    if s.engine != Engine::Sqlite {
        o.str("engine", s.engine.label());
    }
    o.field(
        "capture",
        match &s.capture {
            Some(c) => capture_to_value(c),
            None => Json::Null,
        },
    );
    o
}

fn refuse(why: &str) -> String {
    cat(&[
        "the state is not one this policy wrote (",
        why,
        "); send the state the last answer gave, unchanged",
    ])
}

fn saved_from_value(v: Option<&Value>) -> Result<Read, String> {
    match v.filter(|v| !v.is_null()) {
        None => Ok(Read {
            state: HandleState::default(),
            flush: None,
        }),
        // Every reason to refuse is worded once, here.
        Some(o) => read_state(o).map_err(|why| refuse(&why)),
    }
}

/// The state as read, or why it is refused.
fn read_state(o: &Value) -> Result<Read, String> {
    if !o.is_object() {
        return Err("not an object".into());
    }
    match o.get("v").and_then(Json::as_u64) {
        Some(STATE_FORMAT) => {}
        Some(n) => {
            return Err(cat(&[
                "format ",
                &unsigned(n),
                "; this build reads format ",
                &unsigned(STATE_FORMAT),
            ]));
        }
        None => return Err("no format version".into()),
    }
    let open = o.get("open").and_then(Json::as_bool).ok_or("`open` is missing")?;
    let sticky = match field(o, "sticky") {
        None => None,
        Some(s) => Some(
            s.as_str()
                .and_then(Cause::from_label)
                .ok_or("`sticky` is not a cause")?,
        ),
    };
    let engine = match field(o, "engine") {
        None => Engine::Sqlite,
        Some(e) => e
            .as_str()
            .and_then(Engine::from_label)
            .ok_or("`engine` is not an engine")?,
    };
    let capture = match field(o, "capture") {
        None => None,
        Some(c) => Some(match event_from_value(c)? {
            Event::Captured(r) => CaptureReport::Captured(r),
            Event::CaptureFailed { failure, error } => CaptureReport::Failed { failure, error },
            _ => return Err("`capture` is not a capture".into()),
        }),
    };
    let flush = match field(o, "flush") {
        None => None,
        Some(f) => {
            if !f.is_object() {
                return Err("`flush` is not an object".into());
            }
            let start = start_from_value(f.get("start").unwrap_or(&Json::Null))?;
            let events = match f.get("events") {
                Some(Json::Arr(items)) => try_map(items, event_from_value)?,
                _ => return Err("`events` is not a list".into()),
            };
            Some((start, events))
        }
    };
    Ok(Read {
        state: HandleState {
            open,
            sticky,
            capture,
            engine,
        },
        flush,
    })
}

/// The handle rebuilt from the state: its state across batches, then the
/// running flush, by replaying that flush's inputs. Also the fields of the
/// state that flush started from, and its events as wire values, which is
/// what the state keeps while the flush runs.
type Restored = (Handle, v::Obj, Vec<Value>);

fn restore(read: Read) -> Result<Restored, String> {
    // The flush's effects on the handle are replayed too, so the replay
    // starts from the state the flush started from.
    let base = handle_fields(&read.state);
    let mut handle = Handle::with_state(read.state);
    let mut values = Vec::new();
    if let Some((start, events)) = read.flush {
        handle.start(start).map_err(|e| refuse(&e.message()))?;
        for e in events {
            values.push(event_to_value(&e));
            handle.handle(e).map_err(|e| refuse(&e.message()))?;
        }
    }
    Ok((handle, base, values))
}

/// `flush-step-json`: one step of the flush protocol, string in, string out.
pub fn flush_step_json(request: &str) -> String {
    let run = || -> Result<Value, String> {
        let v = parse(request).map_err(|e| cat(&["invalid JSON: ", &e]))?;
        let obj = object(&v, "the request")?;
        let (mut handle, base, mut events) = restore(saved_from_value(obj.get("state"))?)?;
        if let Some(start) = field(obj, "start") {
            // A start is refused while a flush runs, so the new flush has
            // no events yet.
            handle.start(start_from_value(start)?).map_err(|e| e.message())?;
        }
        if let Some(event) = field(obj, "event") {
            let event = event_from_value(event)?;
            let value = event_to_value(&event);
            // Refused when no flush runs: only a running flush keeps events.
            handle.handle(event).map_err(|e| e.message())?;
            events.push(value);
        }
        let step = handle.poll();
        // While a flush runs, the state it started from stays and its
        // inputs are kept; once it is done, the handle's new state is the
        // base for the next one.
        let state = match handle.running() {
            Some(start) => {
                let mut flush = v::Obj::new();
                flush.field("start", start_to_value(start));
                flush.field("events", Json::Arr(events));
                let mut state = base;
                state.field("flush", flush.done());
                state
            }
            None => {
                let mut state = handle_fields(handle.state());
                state.field("flush", Json::Null);
                state
            }
        };
        let mut answer = v::Obj::new();
        answer.field("state", state.done());
        answer.field(
            "step",
            match &step {
                Some(step) => step_to_value(step),
                None => Json::Null,
            },
        );
        Ok(answer.done())
    };
    run().unwrap_or_else(v::error).to_text()
}

/// An event from its wire text (for hosts and tests that speak the wire).
pub fn event_from_text(text: &str) -> Result<Event, String> {
    event_from_value(&parse(text).map_err(|e| cat(&["invalid JSON: ", &e]))?)
}

/// An event as its wire text.
pub fn event_to_text(e: &Event) -> String {
    event_to_value(e).to_text()
}

/// A step as its wire text.
pub fn step_to_text(step: &Step) -> String {
    step_to_value(step).to_text()
}
