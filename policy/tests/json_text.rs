//! The policy's own JSON text, as the JSON entry points read and write it:
//! whitespace and escapes, the nesting limit, errors that say where, the
//! integer forms a field accepts, and an explain context read from JSON the
//! same as the typed one.

use serde_json::{Value, json};
use turnsafe_policy::json::{classify_json, explain_json};
use turnsafe_policy::{
    CaptureFailure, CaptureReceipt, Cause, CopyContext, DivertFailure, DivertResidue, Outcome, explain,
};

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).expect("the policy answers JSON")
}

#[test]
fn whitespace_and_escapes_are_read() {
    let spaced = parsed(&classify_json(
        " {\n\t\"code\" : 5 ,\r\n \"message\" : \"a\\/b \\\" \\\\ \\n\" } ",
    ));
    assert_eq!(spaced["cause"], "locked", "{spaced}");
    // `\/` is `/`: the path after SQLite's text, which the text names.
    let text = parsed(&classify_json(r#"{"message": "unable to open database file: \/x"}"#));
    assert_eq!(text["cause"], "disk", "{text}");
}

#[test]
fn nesting_is_limited_at_127_levels_of_arrays_or_objects() {
    let arrays = |n: usize| format!("{{\"code\":5,\"x\":{}0{}}}", "[".repeat(n), "]".repeat(n));
    let objects = |n: usize| format!("{{\"code\":5,\"x\":{}0{}}}", "{\"a\":".repeat(n), "}".repeat(n));
    for deep in [arrays, objects] {
        // The observation's own object is the first level.
        assert_eq!(parsed(&classify_json(&deep(126)))["cause"], "locked");
        let e = parsed(&classify_json(&deep(127)));
        assert!(
            e["error"]
                .as_str()
                .is_some_and(|e| e.contains("recursion limit exceeded at byte")),
            "{e}"
        );
    }
}

#[test]
fn a_parse_error_says_what_and_where() {
    let e = parsed(&classify_json("{\"code\": 5,}"));
    assert_eq!(e["error"], "invalid JSON: key must be a string at byte 11");
}

#[test]
fn only_control_characters_are_escaped_in_output() {
    let request = json!({"cause": "disk", "outcome": "diverted",
        "receipt": {"path": "/h/a b\u{1f}c.jsonl", "offset": 0, "length": 9, "count": 1, "sha256": "5f2b".repeat(16)}})
    .to_string();
    let text = explain_json(&request);
    assert!(text.contains("/h/a b\\u001fc.jsonl"), "{text}");
}

#[test]
fn a_request_must_be_an_object() {
    for bad in ["[]", "\"disk\"", "5", "null"] {
        let e = parsed(&explain_json(bad));
        assert_eq!(e["error"], "request must be a JSON object", "{bad}");
    }
}

/// The copy `explain_json` gives for `context`, and the typed one for `ctx`.
fn both(cause: Cause, outcome: Outcome, context: Value, ctx: &CopyContext) -> (Value, Value) {
    let mut request = context;
    request["cause"] = json!(cause.label());
    request["outcome"] = json!(outcome.label());
    let from_json = parsed(&explain_json(&request.to_string()));
    let typed = turnsafe_policy::json::copy_to_value(&explain(cause, outcome, ctx).expect("producible"));
    (from_json, typed)
}

#[test]
fn an_explain_context_reads_captures_and_residues_as_the_typed_one() {
    let session = || Some("s1".to_string());
    // A capture receipt: the copy names the capture folder.
    let ctx = CopyContext {
        session: session(),
        receipt: Some(turnsafe_policy::machine::DivertReceipt {
            path: "/h/sessions/s1.jsonl".into(),
            offset: 0,
            length: 9,
            count: 1,
            sha256: "5f2b".repeat(16),
        }),
        capture_receipt: Some(CaptureReceipt {
            path: "/h/state.db.retired-x".into(),
            files: Vec::new(),
            manifest_sha256: String::new(),
        }),
        ..CopyContext::default()
    };
    let context = json!({"session": "s1",
        "receipt": {"path": "/h/sessions/s1.jsonl", "offset": 0, "length": 9, "count": 1, "sha256": "5f2b".repeat(16)},
        "capture_receipt": {"path": "/h/state.db.retired-x", "files": []}});
    let (a, b) = both(Cause::DeletedWal, Outcome::Diverted, context, &ctx);
    assert_eq!(a, b);
    assert!(a.to_string().contains("/h/state.db.retired-x"), "{a}");

    // A failed capture and a failed divert.
    let ctx = CopyContext {
        session: session(),
        divert_failure: Some(DivertFailure {
            operation: "open".into(),
            errno: Some(24),
        }),
        capture_failure: Some(CaptureFailure {
            operation: "mkdir".into(),
            errno: Some(28),
        }),
        ..CopyContext::default()
    };
    let context = json!({"session": "s1", "divert_failed": {"operation": "open", "errno": 24},
        "capture_failure": {"operation": "mkdir", "errno": 28}});
    let (a, b) = both(Cause::DeletedWal, Outcome::DivertFailed, context, &ctx);
    assert_eq!(a, b);
    let plain = turnsafe_policy::json::copy_to_value(
        &explain(
            Cause::DeletedWal,
            Outcome::DivertFailed,
            &CopyContext {
                capture_failure: None,
                ..ctx.clone()
            },
        )
        .unwrap(),
    );
    assert_ne!(a, plain, "the capture failure must show");

    // A residue, its offset written as a whole float too.
    let ctx = CopyContext {
        session: session(),
        divert_failure: Some(DivertFailure {
            operation: "fsync".into(),
            errno: Some(5),
        }),
        divert_residue: Some(DivertResidue {
            path: "/h/sessions/s1.jsonl".into(),
            offset: 460,
        }),
        ..CopyContext::default()
    };
    for offset in [json!(460), json!(460.0), json!(4.6e2)] {
        let context = json!({"session": "s1", "divert_failed": {"operation": "fsync", "errno": 5},
            "divert_residue": {"path": "/h/sessions/s1.jsonl", "offset": offset}});
        let (a, b) = both(Cause::Disk, Outcome::DivertFailed, context, &ctx);
        assert_eq!(a, b, "offset {offset}");
    }
    for bad in [json!(-1), json!(460.5), json!("460")] {
        let request = json!({"cause": "disk", "outcome": "divert_failed",
            "divert_residue": {"path": "/h/sessions/s1.jsonl", "offset": bad}});
        let e = parsed(&explain_json(&request.to_string()));
        assert_eq!(
            e["error"], "field `divert_residue` must be {path, offset}",
            "offset {bad}"
        );
    }
}
