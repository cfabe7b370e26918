//! The edit machine ([`super::EditMachine`]) as one JSON function, for
//! hosts that drive it through the component: `edit_step_json(request) ->
//! answer`.
//!
//! Request: `{"state": <opaque or null>, "sticky": <cause or null>,
//! "seed": <u64>, "edit": <name>, "session": <id>, "event": <event or
//! null>}`. A null state begins an edit on a handle whose sticky cause is
//! `sticky` (read only then, as `seed` is: the seed of the retry jitter).
//! `event` answers the step the last answer gave. `edit` and `session`
//! name the edit in the copy of a failed one.
//!
//! Answer: `{"state": <opaque>, "step": <step>}`, or `{"error": "..."}`;
//! after an error the host sends its last good state again. Steps (by
//! `type`): `attempt` with `degrade_fts`; `wait` with `ms`; `done` with
//! `attempts`; `failed` with `cause`, `action`, `attempts`,
//! `possibly_written` and `copy` (`code`, `cause`, `title`, `body`,
//! `remediation`, `details`: the native host's edit copy, word for word).
//!
//! Events (by `type`): `succeeded`; `failed` with the fields of the flush
//! machine's `failed` event (`code`, `extended_code`, `message`, `errno`,
//! `evidence`, `elapsed_ms`, and optionally `engine`, `sqlstate`,
//! `lease`); `waited`.
//!
//! The state is opaque, versioned (`v`), and holds the edit's inputs,
//! which the machine replays: a pure machine gives the same state again.

#[allow(unused_imports)]
use crate::prelude::*;

use super::wire::{event_from_value, event_to_value};
use super::{EditEvent, EditMachine, EditStep, Event};
use crate::jsontext::{Json, parse};
use crate::model::{Cause, Operation};
use crate::text::cat;
use crate::value as v;

/// The version of the opaque state this build reads and writes.
const EDIT_STATE_FORMAT: u64 = 1;

/// The inputs an edit's state keeps.
struct Saved {
    sticky: Option<Cause>,
    seed: u64,
    events: Vec<Json>,
}

fn field<'a>(o: &'a Json, key: &str) -> Option<&'a Json> {
    o.get(key).filter(|v| !v.is_null())
}

fn cause_field(o: &Json, key: &str) -> Result<Option<Cause>, String> {
    match field(o, key) {
        None => Ok(None),
        Some(Json::Str(s)) => Cause::from_label(s)
            .map(Some)
            .ok_or_else(|| cat(&["`", key, "` is not a cause: ", s])),
        Some(_) => Err(cat(&["`", key, "` must be a cause's label"])),
    }
}

fn seed_field(o: &Json) -> Result<u64, String> {
    match field(o, "seed") {
        None => Ok(0),
        Some(s) => s
            .as_u64()
            .ok_or_else(|| String::from("`seed` must be a non-negative integer")),
    }
}

fn saved(request: &Json) -> Result<Saved, String> {
    let Some(state) = field(request, "state") else {
        return Ok(Saved {
            sticky: cause_field(request, "sticky")?,
            seed: seed_field(request)?,
            events: Vec::new(),
        });
    };
    if !state.is_object() {
        return Err("`state` must be a state this build wrote".into());
    }
    if state.get("v").and_then(Json::as_u64) != Some(EDIT_STATE_FORMAT) {
        return Err("`state` is not an edit state this build wrote (format 1)".into());
    }
    let events = match field(state, "events") {
        None => Vec::new(),
        Some(Json::Arr(items)) => items.clone(),
        Some(_) => return Err("`state.events` must be a list".into()),
    };
    Ok(Saved {
        sticky: cause_field(state, "sticky")?,
        seed: seed_field(state)?,
        events,
    })
}

/// An edit event from its wire value; a failure is told as a replay's,
/// work with nothing to divert, with the edit's seed.
fn edit_event(value: &Json, seed: u64) -> Result<EditEvent, String> {
    match value.get("type").and_then(Json::as_str) {
        Some("succeeded") => Ok(EditEvent::Succeeded),
        Some("waited") => Ok(EditEvent::Waited),
        Some("failed") => match event_from_value(value)? {
            Event::Failed(f) => {
                let mut obs = f.into_observation(Operation::Replay);
                obs.seed = seed;
                Ok(EditEvent::Failed(obs))
            }
            _ => Err("an edit's `failed` event must be a failure".into()),
        },
        Some(other) => Err(cat(&["unknown edit event `", other, "`"])),
        None => Err("an edit event needs a `type`".into()),
    }
}

/// The event as the state keeps it: the wire value, normalised.
fn event_value(value: &Json) -> Result<Json, String> {
    Ok(match value.get("type").and_then(Json::as_str) {
        Some("failed") => event_to_value(&event_from_value(value)?),
        Some(kind) => {
            let mut o = v::Obj::new();
            o.str("type", kind);
            o.done()
        }
        None => return Err("an edit event needs a `type`".into()),
    })
}

fn copy_value(c: &crate::EditCopy) -> Json {
    let mut o = v::Obj::new();
    o.str("code", &c.code);
    o.str("cause", c.cause.label());
    o.str("title", &c.title);
    o.str("body", &c.body);
    o.strs("remediation", &c.remediation);
    let mut details = v::Obj::new();
    for (k, val) in &c.details {
        details.str(k, val);
    }
    o.field("details", details.done());
    o.done()
}

fn step_value(m: &EditMachine, request: &Json) -> Json {
    let mut o = v::Obj::new();
    match m.poll() {
        EditStep::Attempt { degrade_fts } => {
            o.str("type", "attempt");
            o.bool("degrade_fts", degrade_fts);
        }
        EditStep::Wait { ms } => {
            o.str("type", "wait");
            o.uint("ms", ms);
        }
        EditStep::Done => {
            o.str("type", "done");
            o.uint("attempts", u64::from(m.attempts()));
        }
        EditStep::Failed {
            cause,
            action,
            attempts,
        } => {
            let edit = request.get("edit").and_then(Json::as_str).unwrap_or("edit");
            let session = request.get("session").and_then(Json::as_str).unwrap_or("");
            o.str("type", "failed");
            o.str("cause", cause.label());
            o.str("action", action.label());
            o.uint("attempts", u64::from(attempts));
            o.bool("possibly_written", m.possibly_written());
            let copy = crate::explain_edit(edit, session, cause, attempts, m.possibly_written());
            o.field("copy", copy_value(&copy));
        }
    }
    o.done()
}

/// `edit-step-json`: one step of the edit protocol, string in, string out.
pub fn edit_step_json(request: &str) -> String {
    let run = || -> Result<Json, String> {
        let request = parse(request).map_err(|e| cat(&["invalid JSON: ", &e]))?;
        if !request.is_object() {
            return Err("the request must be a JSON object".into());
        }
        let mut saved = saved(&request)?;
        let mut m = EditMachine::start(saved.sticky);
        for e in &saved.events {
            m.handle(edit_event(e, saved.seed)?).map_err(|e| e.message())?;
        }
        if let Some(event) = field(&request, "event") {
            let value = event_value(event)?;
            m.handle(edit_event(&value, saved.seed)?).map_err(|e| e.message())?;
            saved.events.push(value);
        }
        let mut state = v::Obj::new();
        state.uint("v", EDIT_STATE_FORMAT);
        state.opt_str("sticky", saved.sticky.map(Cause::label));
        state.uint("seed", saved.seed);
        state.field("events", Json::Arr(saved.events));
        let mut answer = v::Obj::new();
        answer.field("state", state.done());
        answer.field("step", step_value(&m, &request));
        Ok(answer.done())
    };
    run().unwrap_or_else(v::error).to_text()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(answer: &str) -> (Json, Json) {
        let a = parse(answer).expect(answer);
        assert!(a.get("error").is_none(), "{answer}");
        (a.get("state").cloned().unwrap(), a.get("step").cloned().unwrap())
    }

    fn request(state: Option<&Json>, event: &str) -> String {
        let state = state.map(Json::to_text).unwrap_or_else(|| "null".into());
        cat(&[
            "{\"state\":",
            &state,
            ",\"edit\":\"pop\",\"session\":\"s1\",\"seed\":7,\"event\":",
            event,
            "}",
        ])
    }

    #[test]
    fn a_busy_attempt_waits_then_succeeds() {
        let (state, s) = step(&edit_step_json(&request(None, "null")));
        assert_eq!(s.get("type").and_then(Json::as_str), Some("attempt"));
        let busy = r#"{"type":"failed","code":5,"extended_code":5,"message":"database is locked","elapsed_ms":3}"#;
        let (state, s) = step(&edit_step_json(&request(Some(&state), busy)));
        assert_eq!(s.get("type").and_then(Json::as_str), Some("wait"), "{}", s.to_text());
        let (state, s) = step(&edit_step_json(&request(Some(&state), r#"{"type":"waited"}"#)));
        assert_eq!(s.get("type").and_then(Json::as_str), Some("attempt"));
        let (_, s) = step(&edit_step_json(&request(Some(&state), r#"{"type":"succeeded"}"#)));
        assert_eq!(s.to_text(), r#"{"attempts":2,"type":"done"}"#);
    }

    #[test]
    fn a_failed_edit_carries_the_native_copy() {
        let (state, _) = step(&edit_step_json(&request(None, "null")));
        let full =
            r#"{"type":"failed","code":13,"extended_code":13,"message":"database or disk is full","elapsed_ms":1}"#;
        let (_, s) = step(&edit_step_json(&request(Some(&state), full)));
        assert_eq!(
            s.get("cause").and_then(Json::as_str),
            Some("disk_full"),
            "{}",
            s.to_text()
        );
        let copy = crate::explain_edit("pop", "s1", Cause::DiskFull, 1, false);
        assert_eq!(s.get("copy").unwrap().to_text(), copy_value(&copy).to_text());
        assert_eq!(
            s.get("copy").and_then(|c| c.get("title")).and_then(Json::as_str),
            Some(copy.title.as_str())
        );
    }

    #[test]
    fn a_sticky_handle_fails_before_any_attempt_and_bad_input_is_an_error() {
        let (_, s) = step(&edit_step_json(
            r#"{"state":null,"sticky":"replaced","edit":"clear","session":"s"}"#,
        ));
        assert_eq!(s.get("type").and_then(Json::as_str), Some("failed"));
        assert_eq!(s.get("attempts").and_then(Json::as_u64), Some(0));
        for bad in [
            "nope",
            "[]",
            r#"{"sticky":"no_such_cause"}"#,
            r#"{"state":{"v":2}}"#,
            r#"{"event":{"type":"succeeded"},"state":{"v":1,"events":[{"type":"succeeded"}]}}"#,
            r#"{"event":{"type":"teleported"}}"#,
        ] {
            let a = parse(&edit_step_json(bad)).unwrap();
            assert!(a.get("error").is_some(), "{bad}: {}", a.to_text());
        }
    }
}
