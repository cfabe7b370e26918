//! The flush machine's own API, beside the recorded sequences: what its
//! refusals say, what the handle reports across batches, an abandoned
//! flush, the report's JSON, the wire text of events and steps, and state
//! carried from one batch to the next through `flush_step_json`.

use serde_json::{Value, json};
use turnsafe_policy::machine::{
    DivertReceipt, Event, Failure, FlushStart, Handle, STATE_FORMAT, Step, event_from_text, event_to_text,
    flush_step_json, step_to_text,
};
use turnsafe_policy::{CaptureFailure, CaptureReceipt, Cause, DivertFailure, DivertResidue};

fn start(uids: &[&str], minted: &[&str]) -> FlushStart {
    FlushStart {
        session: "s1".into(),
        uids: uids.iter().map(|u| u.to_string()).collect(),
        minted_uids: minted.iter().map(|u| u.to_string()).collect(),
        seed: 1,
        pending_capture: None,
        durability: Default::default(),
    }
}

fn notadb() -> Failure {
    Failure {
        code: Some(26),
        extended_code: Some(26),
        message: "file is not a database".into(),
        ..Failure::default()
    }
}

#[test]
fn refusals_name_the_step_and_the_event() {
    let mut h = Handle::new();
    assert_eq!(
        h.handle(Event::Opened).unwrap_err().to_string(),
        "no flush is running on this handle"
    );
    h.start(start(&["a"], &[])).unwrap();
    assert_eq!(
        h.start(start(&["b"], &[])).unwrap_err().to_string(),
        "a flush is already running on this handle"
    );
    assert_eq!(h.poll(), Some(Step::Open));
    assert_eq!(
        h.handle(Event::Committed).unwrap_err().to_string(),
        "event `committed` does not answer step `open`"
    );
    h.handle(Event::Opened).unwrap();
    assert!(matches!(h.poll(), Some(Step::Write(_))));
    assert_eq!(
        h.handle(Event::Opened).unwrap_err().to_string(),
        "event `opened` does not answer step `write`"
    );
}

#[test]
fn steps_and_events_have_their_wire_labels() {
    assert_eq!(Step::Open.label(), "open");
    assert_eq!(Step::Wait { ms: 3 }.label(), "wait");
    assert_eq!(Step::Capture.label(), "capture");
    assert_eq!(Step::Divert { cause: Cause::Disk }.label(), "divert");
    for (event, label) in [
        (Event::Opened, "opened"),
        (Event::Committed, "committed"),
        (Event::Failed(notadb()), "failed"),
        (Event::Waited { elapsed_ms: 1 }, "waited"),
    ] {
        assert_eq!(event.label(), label);
        let text: Value = serde_json::from_str(&event_to_text(&event)).unwrap();
        assert_eq!(text["type"], label, "{text}");
    }
}

#[test]
fn the_handle_reports_open_and_sticky_across_batches() {
    let mut h = Handle::new();
    assert!(!h.is_open() && h.sticky().is_none());
    h.start(start(&["a", "b"], &["b"])).unwrap();
    assert_eq!(h.poll(), Some(Step::Open));
    h.handle(Event::Opened).unwrap();
    assert!(h.is_open());
    assert!(matches!(h.poll(), Some(Step::Write(_))));
    h.handle(Event::Committed).unwrap();
    let Some(Step::Done(report)) = h.poll() else {
        panic!("done")
    };
    assert!(report.persisted && h.is_open() && h.sticky().is_none());
    // The report's JSON, as text and as a value, is the same outcome.
    let text: Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(text, report.to_value());
    assert_eq!(
        (text["persisted"].clone(), text["committed"].clone()),
        (json!(true), json!(2))
    );
    assert_eq!(text["minted_uids"], json!(["b"]));

    // A corrupt file quarantines the handle.
    let mut h = Handle::new();
    h.start(start(&["c"], &[])).unwrap();
    assert_eq!(h.poll(), Some(Step::Open));
    h.handle(Event::Failed(notadb())).unwrap();
    assert_eq!(h.sticky(), Some(Cause::Corrupt));
    assert!(!h.is_open());
}

#[test]
fn an_abandoned_flush_hands_its_batch_back() {
    let mut h = Handle::new();
    h.start(start(&["a", "b"], &["b"])).unwrap();
    let report = h.abandon();
    assert_eq!((report.committed, report.diverted, report.handed_back), (0, 0, 2));
    assert_eq!(report.uids, ["a", "b"]);
    assert_eq!(report.minted_uids, ["b"]);
    assert!(!h.in_flush());
}

#[test]
fn events_and_steps_read_back_from_their_text() {
    let events = [
        Event::Opened,
        Event::Committed,
        Event::Failed(notadb()),
        Event::Waited { elapsed_ms: 12 },
        Event::Captured(CaptureReceipt {
            path: "/h/state.db.retired-x".into(),
            files: Vec::new(),
            manifest_sha256: "ab".repeat(32),
        }),
        Event::CaptureFailed {
            failure: CaptureFailure {
                operation: "mkdir".into(),
                errno: Some(28),
            },
            error: "mkdir: no space".into(),
        },
        Event::Diverted(DivertReceipt {
            path: "/h/sessions/s1.jsonl".into(),
            offset: 0,
            length: 10,
            count: 1,
            sha256: "cd".repeat(32),
        }),
        Event::DivertFailed {
            failure: DivertFailure {
                operation: "fsync".into(),
                errno: Some(5),
            },
            message: "fsync failed".into(),
            residue: Some(DivertResidue {
                path: "/h/sessions/s1.jsonl".into(),
                offset: 460,
            }),
        },
    ];
    for e in events {
        let text = event_to_text(&e);
        assert_eq!(event_from_text(&text), Ok(e), "{text}");
    }
    let step: Value = serde_json::from_str(&step_to_text(&Step::Divert { cause: Cause::DiskFull })).unwrap();
    assert_eq!(step, json!({"type": "divert", "cause": "disk_full"}));
}

fn wire(request: Value) -> Value {
    let v: Value = serde_json::from_str(&flush_step_json(&request.to_string())).unwrap();
    assert!(v.get("error").is_none(), "{v}");
    v
}

#[test]
fn the_next_batch_starts_from_the_state_the_last_one_left() {
    let start = |b: &str| json!({"session": "s1", "uids": [b], "minted_uids": [], "seed": 1});
    // An open store: the next batch writes without opening again.
    let mut v = wire(json!({"state": null, "start": start("a")}));
    for e in [json!({"type": "opened"}), json!({"type": "committed"})] {
        v = wire(json!({"state": v["state"], "event": e}));
    }
    assert_eq!(v["step"]["type"], "done");
    assert_eq!(v["state"]["open"], true);
    let next = wire(json!({"state": v["state"], "start": start("b")}));
    assert_eq!(next["step"]["type"], "write", "{next}");

    // A retired generation whose capture failed: the state keeps that
    // failure, and the next batch reads it back and diverts.
    let mut v = wire(json!({"state": null, "start": start("c")}));
    let deleted = json!({"type": "failed", "code": null, "extended_code": null, "errno": null,
        "message": "turnsafe guard: the WAL was deleted", "evidence": ["deleted_wal_generation"], "elapsed_ms": 1});
    for e in [json!({"type": "opened"}), deleted] {
        v = wire(json!({"state": v["state"], "event": e}));
    }
    assert_eq!(v["step"]["type"], "capture", "{v}");
    let failed = json!({"type": "capture_failed", "operation": "mkdir", "errno": 30, "error": "read-only"});
    v = wire(json!({"state": v["state"], "event": failed}));
    assert_eq!(v["step"]["type"], "divert", "{v}");
    let receipt = json!({"path": "/h/sessions/s1.jsonl", "offset": 0, "length": 10, "count": 1,
        "sha256": "ab".repeat(32)});
    v = wire(json!({"state": v["state"], "event": {"type": "diverted", "receipt": receipt}}));
    assert_eq!(v["step"]["type"], "done");
    assert_eq!(v["state"]["capture"]["type"], "capture_failed", "{v}");
    let next = wire(json!({"state": v["state"], "start": start("d")}));
    assert_eq!(next["step"], json!({"type": "divert", "cause": "deleted_wal"}));
}

#[test]
fn a_state_from_another_format_is_refused_with_the_reason() {
    let answer: Value = serde_json::from_str(&flush_step_json(
        &json!({"state": {"v": 99, "open": false}, "start": {"session": "s1", "uids": ["a"],
            "minted_uids": [], "seed": 1}})
        .to_string(),
    ))
    .unwrap();
    assert_eq!(
        answer["error"],
        format!(
            "the state is not one this policy wrote (format 99; this build reads format {STATE_FORMAT}); \
             send the state the last answer gave, unchanged"
        )
    );
}
