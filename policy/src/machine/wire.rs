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
//! optionally `engine` and `sqlstate`; `waited` with `elapsed_ms`;
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
use crate::model::{CaptureFailure, CaptureReceipt, CapturedFile, Cause, DivertFailure, DivertResidue};
use crate::text::{cat, unsigned};
use crate::value as v;

/// The version of the opaque state this build reads and writes.
pub const STATE_FORMAT: u64 = 1;

type Obj = Json;
type Value = Json;

fn field<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

fn string(o: &Obj, key: &str, what: &str) -> Result<String, String> {
    match field(o, key) {
        Some(Json::Str(s)) => Ok(s.clone()),
        None => Ok(String::new()),
        Some(_) => Err(cat(&[what, ": field `", key, "` must be a string"])),
    }
}

fn required_string(o: &Obj, key: &str, what: &str) -> Result<String, String> {
    match field(o, key) {
        Some(Json::Str(s)) => Ok(s.clone()),
        _ => Err(cat(&[what, ": field `", key, "` must be a string"])),
    }
}

fn u64_field(o: &Obj, key: &str, what: &str) -> Result<u64, String> {
    match field(o, key) {
        None => Ok(0),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| cat(&[what, ": field `", key, "` must be a non-negative integer"])),
    }
}

fn i64_opt(o: &Obj, key: &str, what: &str) -> Result<Option<i64>, String> {
    match field(o, key) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| cat(&[what, ": field `", key, "` must be an integer or null"])),
    }
}

fn strings(o: &Obj, key: &str, what: &str) -> Result<Vec<String>, String> {
    match field(o, key) {
        None => Ok(Vec::new()),
        Some(Json::Arr(items)) => try_map(items, |i| {
            i.as_str()
                .map(String::from)
                .ok_or_else(|| cat(&[what, ": `", key, "` must be a list of strings"]))
        }),
        Some(_) => Err(cat(&[what, ": `", key, "` must be a list of strings"])),
    }
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Obj, String> {
    if v.is_object() {
        Ok(v)
    } else {
        Err(cat(&[what, " must be a JSON object"]))
    }
}

fn start_from_value(v: &Value) -> Result<FlushStart, String> {
    let o = object(v, "`start`")?;
    Ok(FlushStart {
        session: string(o, "session", "start")?,
        uids: strings(o, "uids", "start")?,
        minted_uids: strings(o, "minted_uids", "start")?,
        seed: u64_field(o, "seed", "start")?,
    })
}

fn start_to_value(s: &FlushStart) -> Value {
    v::obj(vec![
        ("session", v::s(&s.session)),
        ("uids", v::strs(&s.uids)),
        ("minted_uids", v::strs(&s.minted_uids)),
        ("seed", Json::uint(s.seed)),
    ])
}

fn capture_receipt_from(o: &Obj) -> Result<CaptureReceipt, String> {
    let what = "capture receipt";
    let files = match field(o, "files") {
        None => Vec::new(),
        Some(Json::Arr(items)) => try_map(items, |f| {
            let f = object(f, "a captured file")?;
            Ok(CapturedFile {
                name: required_string(f, "name", what)?,
                size: u64_field(f, "size", what)?,
            })
        })?,
        Some(_) => return Err(cat(&[what, ": `files` must be a list"])),
    };
    Ok(CaptureReceipt {
        path: required_string(o, "path", what)?,
        files,
        manifest_sha256: string(o, "manifest_sha256", what)?,
    })
}

fn divert_receipt_from(o: &Obj) -> Result<DivertReceipt, String> {
    let what = "divert receipt";
    Ok(DivertReceipt {
        path: required_string(o, "path", what)?,
        offset: u64_field(o, "offset", what)?,
        length: u64_field(o, "length", what)?,
        count: u64_field(o, "count", what)?,
        sha256: string(o, "sha256", what)?,
    })
}

/// An event from its wire object.
pub(crate) fn event_from_value(v: &Value) -> Result<Event, String> {
    let o = object(v, "`event`")?;
    let kind = required_string(o, "type", "event")?;
    let what = cat(&["event `", &kind, "`"]);
    let receipt = || -> Result<&Obj, String> {
        field(o, "receipt")
            .filter(|r| r.is_object())
            .ok_or_else(|| cat(&[&what, ": field `receipt` must be an object"]))
    };
    Ok(match kind.as_str() {
        "opened" => Event::Opened,
        "committed" => Event::Committed,
        "failed" => {
            let evidence = match field(o, "evidence") {
                None => Vec::new(),
                Some(Json::Arr(items)) => crate::json::evidence_labels(items),
                Some(_) => return Err(cat(&[&what, ": `evidence` must be a list of labels"])),
            };
            let sqlstate = crate::json::sqlstate_value(field(o, "sqlstate"))?;
            Event::Failed(Failure {
                engine: crate::json::engine_value(field(o, "engine"), sqlstate.is_some())?,
                sqlstate,
                code: i64_opt(o, "code", &what)?,
                extended_code: i64_opt(o, "extended_code", &what)?,
                message: string(o, "message", &what)?,
                errno: i64_opt(o, "errno", &what)?,
                evidence,
                elapsed_ms: u64_field(o, "elapsed_ms", &what)?,
            })
        }
        "waited" => Event::Waited {
            elapsed_ms: u64_field(o, "elapsed_ms", &what)?,
        },
        "resolved" => Event::Resolved {
            all_stored: match field(o, "all_stored") {
                Some(Json::Bool(b)) => *b,
                _ => return Err(cat(&[&what, ": field `all_stored` must be true or false"])),
            },
        },
        "captured" => Event::Captured(capture_receipt_from(receipt()?)?),
        "capture_failed" => Event::CaptureFailed {
            failure: CaptureFailure {
                operation: required_string(o, "operation", &what)?,
                errno: i64_opt(o, "errno", &what)?,
            },
            error: string(o, "error", &what)?,
        },
        "diverted" => Event::Diverted(divert_receipt_from(receipt()?)?),
        "divert_failed" => Event::DivertFailed {
            failure: DivertFailure {
                operation: required_string(o, "operation", &what)?,
                errno: i64_opt(o, "errno", &what)?,
            },
            message: string(o, "message", &what)?,
            residue: match field(o, "residue") {
                None => None,
                Some(r) => {
                    let r = object(r, "`residue`")?;
                    Some(DivertResidue {
                        path: required_string(r, "path", "residue")?,
                        offset: u64_field(r, "offset", "residue")?,
                    })
                }
            },
        },
        other => {
            return Err(cat(&[
                "unknown event `",
                other,
                "`: expected opened, committed, failed, waited, resolved, captured, capture_failed, diverted \
                 or divert_failed",
            ]));
        }
    })
}

fn typed(kind: &str, mut rest: Vec<(&str, Value)>) -> Value {
    rest.push(("type", v::s(kind)));
    v::obj(rest)
}

fn captured_value(r: &CaptureReceipt) -> Value {
    typed("captured", vec![("receipt", v::capture_receipt(r))])
}

fn capture_failed_value(failure: &CaptureFailure, error: &str) -> Value {
    typed(
        "capture_failed",
        vec![
            ("operation", v::s(&failure.operation)),
            ("errno", v::opt_i(failure.errno)),
            ("error", v::s(error)),
        ],
    )
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
    match e {
        Event::Opened => typed("opened", Vec::new()),
        Event::Committed => typed("committed", Vec::new()),
        Event::Failed(f) => {
            let mut fields = vec![
                ("code", v::opt_i(f.code)),
                ("extended_code", v::opt_i(f.extended_code)),
                ("message", v::s(&f.message)),
                ("errno", v::opt_i(f.errno)),
                ("evidence", Json::Arr(map(&f.evidence, |e| v::s(e.label())))),
                ("elapsed_ms", Json::uint(f.elapsed_ms)),
            ];
            // Only what is not the default, so a SQLite host's state reads
            // exactly as before these fields existed.
            if f.engine != crate::model::Engine::Sqlite {
                fields.push(("engine", v::s(f.engine.label())));
            }
            if let Some(s) = &f.sqlstate {
                fields.push(("sqlstate", v::s(s)));
            }
            typed("failed", fields)
        }
        Event::Resolved { all_stored } => typed("resolved", vec![("all_stored", Json::Bool(*all_stored))]),
        Event::Waited { elapsed_ms } => typed("waited", vec![("elapsed_ms", Json::uint(*elapsed_ms))]),
        Event::Captured(r) => captured_value(r),
        Event::CaptureFailed { failure, error } => capture_failed_value(failure, error),
        Event::Diverted(r) => typed("diverted", vec![("receipt", v::divert_receipt(r))]),
        Event::DivertFailed {
            failure,
            message,
            residue,
        } => typed(
            "divert_failed",
            vec![
                ("operation", v::s(&failure.operation)),
                ("errno", v::opt_i(failure.errno)),
                ("message", v::s(message)),
                ("residue", v::residue(residue.as_ref())),
            ],
        ),
    }
}

/// A step as its wire object.
pub(crate) fn step_to_value(step: &Step) -> Value {
    match step {
        Step::Open => typed("open", Vec::new()),
        Step::Write(p) => typed(
            "write",
            vec![(
                "plan",
                v::obj(vec![
                    ("degrade_fts", Json::Bool(p.degrade_fts)),
                    ("recreate_session", Json::Bool(p.recreate_session)),
                ]),
            )],
        ),
        Step::Wait { ms } => typed("wait", vec![("ms", Json::uint(*ms))]),
        Step::Capture => typed("capture", Vec::new()),
        Step::Resolve => typed("resolve", Vec::new()),
        Step::Divert { cause } => typed("divert", vec![("cause", v::s(cause.label()))]),
        Step::Done(report) => typed("done", vec![("outcome", report.json())]),
    }
}

/// The opaque state as read: what the handle knew when the running flush
/// started, and that flush's inputs.
struct Read {
    state: HandleState,
    flush: Option<(FlushStart, Vec<Event>)>,
}

/// The opaque state to write back. The events are kept as their wire
/// values, which is what the state holds, so the replay can hand each
/// event to the machine without a copy.
struct Saved {
    state: HandleState,
    flush: Option<(FlushStart, Vec<Value>)>,
}

fn saved_to_value(s: Saved) -> Value {
    let flush = s.flush.map_or(Json::Null, |(start, events)| {
        v::obj(vec![("start", start_to_value(&start)), ("events", Json::Arr(events))])
    });
    v::obj(vec![
        ("v", Json::uint(STATE_FORMAT)),
        ("open", Json::Bool(s.state.open)),
        ("sticky", v::opt_s(s.state.sticky.map(Cause::label))),
        ("capture", s.state.capture.as_ref().map_or(Json::Null, capture_to_value)),
        ("flush", flush),
    ])
}

fn refuse(why: &str) -> String {
    cat(&[
        "the state is not one this policy wrote (",
        why,
        "); send the state the last answer gave, unchanged",
    ])
}

fn saved_from_value(v: Option<&Value>) -> Result<Read, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Read {
            state: HandleState::default(),
            flush: None,
        });
    };
    let o = v;
    if !o.is_object() {
        return Err(refuse("not an object"));
    }
    match o.get("v").and_then(Json::as_u64) {
        Some(STATE_FORMAT) => {}
        Some(n) => {
            return Err(refuse(&cat(&[
                "format ",
                &unsigned(n),
                "; this build reads format ",
                &unsigned(STATE_FORMAT),
            ])));
        }
        None => return Err(refuse("no format version")),
    }
    let open = o
        .get("open")
        .and_then(Json::as_bool)
        .ok_or_else(|| refuse("`open` is missing"))?;
    let sticky = match field(o, "sticky") {
        None => None,
        Some(s) => Some(
            s.as_str()
                .and_then(Cause::from_label)
                .ok_or_else(|| refuse("`sticky` is not a cause"))?,
        ),
    };
    let capture = match field(o, "capture") {
        None => None,
        Some(c) => Some(match event_from_value(c).map_err(|e| refuse(&e))? {
            Event::Captured(r) => CaptureReport::Captured(r),
            Event::CaptureFailed { failure, error } => CaptureReport::Failed { failure, error },
            _ => return Err(refuse("`capture` is not a capture")),
        }),
    };
    let flush = match field(o, "flush") {
        None => None,
        Some(f) => {
            if !f.is_object() {
                return Err(refuse("`flush` is not an object"));
            }
            let start = start_from_value(f.get("start").unwrap_or(&Json::Null)).map_err(|e| refuse(&e))?;
            let events = match f.get("events") {
                Some(Json::Arr(items)) => try_map(items, |e| event_from_value(e).map_err(|e| refuse(&e)))?,
                _ => return Err(refuse("`events` is not a list")),
            };
            Some((start, events))
        }
    };
    Ok(Read {
        state: HandleState { open, sticky, capture },
        flush,
    })
}

/// Rebuild the handle: its state across batches, then the running flush,
/// by replaying that flush's inputs; and the state to write back.
fn restore(read: Read) -> Result<(Handle, Saved), String> {
    // The flush's effects on the handle are replayed too, so the replay
    // starts from the state the flush started from.
    let mut handle = Handle::with_state(read.state.clone());
    let flush = match read.flush {
        None => None,
        Some((start, events)) => {
            handle.start(start.clone()).map_err(|e| refuse(&e.message()))?;
            let mut values = Vec::with_capacity(events.len());
            for e in events {
                values.push(event_to_value(&e));
                handle.handle(e).map_err(|e| refuse(&e.message()))?;
            }
            Some((start, values))
        }
    };
    Ok((
        handle,
        Saved {
            state: read.state,
            flush,
        },
    ))
}

/// `flush-step-json`: one step of the flush protocol, string in, string out.
pub fn flush_step_json(request: &str) -> String {
    let run = || -> Result<Value, String> {
        let v = parse(request).map_err(|e| cat(&["invalid JSON: ", &e]))?;
        let obj = object(&v, "the request")?;
        let (mut handle, mut saved) = restore(saved_from_value(obj.get("state"))?)?;
        if let Some(start) = field(obj, "start") {
            let start = start_from_value(start)?;
            handle.start(start.clone()).map_err(|e| e.message())?;
            saved.flush = Some((start, Vec::new()));
        }
        if let Some(event) = field(obj, "event") {
            let event = event_from_value(event)?;
            let value = event_to_value(&event);
            handle.handle(event).map_err(|e| e.message())?;
            match saved.flush.as_mut() {
                Some((_, events)) => events.push(value),
                None => return Err("an event, but no flush was started".into()),
            }
        }
        let step = handle.poll();
        // Once a flush is done, the handle's new state is the base for the
        // next one; while it runs, the base stays and its inputs are kept.
        if !handle.in_flush() {
            saved = Saved {
                state: handle.state().clone(),
                flush: None,
            };
        }
        Ok(v::obj(vec![
            ("state", saved_to_value(saved)),
            ("step", step.as_ref().map_or(Json::Null, step_to_value)),
        ]))
    };
    run()
        .unwrap_or_else(|e| v::obj(vec![("error", Json::Str(e))]))
        .to_text()
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
