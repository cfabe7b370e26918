//! The pure parts of the Hermes import: ids, decoding, lines, and how a
//! line is settled against the rows ([`align`], [`clean`]). The import
//! itself is tested through the command line
//! (`host/tests/import_hermes_cli.rs`) and against homes the real
//! `hermes-agent` package writes (`python/tests/test_import_hermes.py`).

use serde_json::{Value, json};

use super::align::{Reading, Record, Verdict};
use super::*;

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

#[test]
fn safe_ids_match_the_python_package() {
    // Computed with turnsafe_store.agents.safe_session_id.
    let cases = [
        ("user 42/ü", "user_42__-h10fbab2a704de8bd73782225570d18a0"),
        ("20260101_120000_abc123", "20260101_120000_abc123"),
        ("", "he3b0c44298fc1c149afbf4c8996fb924"),
        ("..x", "__x-h8901738c97147077a29dbf27fa8b2b41"),
        ("日本語のセッション", "_________-h8eaefd9936b007887d528fb7da4ba259"),
        (".hidden", "_hidden-h1692419006a88aab3372cf255367e2cc"),
    ];
    for (id, want) in cases {
        assert_eq!(safe_session_id(id), want, "{id:?}");
    }
    let long = "a".repeat(129);
    assert_eq!(
        safe_session_id(&long),
        format!("{}-hc12cb024a2e5551cca0e08fce8f1c5e3", "a".repeat(48))
    );
    for id in ["user 42/ü", "", "..x", &long] {
        assert!(crate::ids::validate_session_id(&safe_session_id(id)).is_ok());
    }
}

#[test]
fn hermes_file_names_are_found_for_their_ids() {
    assert_eq!(hermes_file_component("20260101_abc"), "20260101_abc");
    let odd = hermes_file_component("a/b c");
    assert!(odd.starts_with("a_b_c_") && odd.len() == "a_b_c_".len() + 12, "{odd}");
    assert!(hermes_file_component("").starts_with("session_"));
}

#[test]
fn content_is_decoded_as_hermes_decodes_it() {
    let parts = json!([{"type": "text", "text": "hi"}]);
    let stored = Value::String(format!("\u{0}json:{parts}"));
    assert_eq!(decode_content(stored), parts);
    let broken = Value::String("\u{0}json:[not json".into());
    assert_eq!(decode_content(broken.clone()), broken);
    assert_eq!(decode_content(json!("plain")), json!("plain"));
    assert_eq!(decode_content(json!(7)), json!(7));
    assert_eq!(decode_tool_calls(json!("[{\"id\":\"c1\"}]")), json!([{"id": "c1"}]));
    assert_eq!(decode_tool_calls(json!("not json")), json!("not json"));
}

#[test]
fn a_row_keeps_its_fields_without_hermes_bookkeeping() {
    let cols = [
        ("id", json!(12)),
        ("session_id", json!("s")),
        ("role", json!("assistant")),
        ("content", json!(null)),
        ("tool_calls", json!("[{\"id\":\"c1\",\"type\":\"function\"}]")),
        ("timestamp", json!(1700000000.25)),
        ("active", json!(0)),
        ("compacted", json!(1)),
        ("observed", json!(0)),
    ];
    let item = row_item(cols);
    assert_eq!(
        Value::Object(item),
        json!({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}],
               "timestamp": 1700000000.25, "observed": 0})
    );
    assert_eq!(row_uid(12), "hermes:12");
    assert!(crate::message::valid_uid(&row_uid(i64::MAX)));
}

#[test]
fn divert_lines_parse_quarantine_and_tear() {
    let data =
        "{\"role\":\"user\",\"content\":\"ü\"}\n\nnot json\n[1,2]\n{\"content\":\"x\"}\n{\"role\":\"ass".as_bytes();
    let entries = parse_divert(data);
    assert_eq!(entries.len(), 5);
    assert!(matches!(&entries[0], Entry::Message { position: 1, item, .. } if item["content"] == "ü"));
    assert!(matches!(&entries[1], Entry::Bad { position: 3, reason, .. } if reason.starts_with("not JSON")));
    assert!(matches!(&entries[2], Entry::Bad { position: 4, reason, .. } if reason == "not a JSON object"));
    assert!(matches!(&entries[3], Entry::Message { position: 5, .. }));
    assert!(matches!(&entries[4], Entry::Torn { position: 6, bytes } if bytes == b"{\"role\":\"ass"));
    // A last line with its newline that does not parse is bad, not torn.
    let entries = parse_divert(b"{\"a\":1}\n{oops\n");
    assert!(matches!(&entries[1], Entry::Bad { position: 2, .. }));
    // A complete last line without a newline is a message.
    assert!(matches!(&parse_divert(b"{\"a\":1}")[0], Entry::Message { .. }));
}

#[test]
fn line_uids_are_stable_valid_and_positional() {
    let a = line_uid(LineKind::Divert, 3, b"{\"x\":1}");
    assert_eq!(a, line_uid(LineKind::Divert, 3, b"{\"x\":1}"));
    assert_ne!(a, line_uid(LineKind::Divert, 4, b"{\"x\":1}"));
    assert_ne!(a, line_uid(LineKind::Snapshot, 3, b"{\"x\":1}"));
    assert_ne!(a, line_uid(LineKind::Divert, 3, b"{\"x\":2}"));
    assert!(crate::message::valid_uid(&a) && a.starts_with("hermes:jsonl:3:"));
}

#[test]
fn snapshots_give_their_messages_and_session() {
    let data = br#"{"session_id": "s1", "model": "m", "messages": [{"role": "user", "content": "a"}, 5]}"#;
    let (id, entries) = parse_snapshot(data);
    assert_eq!(id.as_deref(), Some("s1"));
    assert!(matches!(&entries[0], Entry::Message { position: 0, .. }));
    assert!(matches!(&entries[1], Entry::Bad { position: 1, .. }));
    let (_, entries) = parse_snapshot(b"{\"truncated");
    assert!(matches!(&entries[0], Entry::Bad { position: 0, .. }));
}

fn record(uid: &str, v: Value) -> Record {
    Record::new(uid.to_string(), &obj(v))
}

fn same(of: &str) -> Verdict {
    Verdict::Same { of: of.to_string() }
}

fn possible(of: &str) -> Verdict {
    Verdict::Possible { of: of.to_string() }
}

fn call(id: &str) -> Value {
    json!([{"id": id, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}])
}

#[test]
fn a_divert_line_is_a_row_only_by_its_bytes_where_the_run_joins_the_rows() {
    // The user says "continue" again: the same words, another message.
    let tail = [
        record(
            "hermes:1",
            json!({"role": "user", "content": "continue", "timestamp": 1.5}),
        ),
        record(
            "hermes:2",
            json!({"role": "assistant", "content": "On it.", "timestamp": 2.5}),
        ),
    ];
    let lines = [record("l1", json!({"role": "user", "content": "continue"}))];
    assert_eq!(align::divert(&tail, &lines), [Verdict::New]);

    // Tool calls without content: each calls another tool.
    let tail = [
        record("hermes:1", json!({"role": "assistant", "tool_calls": call("c1")})),
        record(
            "hermes:2",
            json!({"role": "tool", "content": "1", "tool_call_id": "c1"}),
        ),
        record("hermes:3", json!({"role": "assistant", "tool_calls": call("c2")})),
        record(
            "hermes:4",
            json!({"role": "tool", "content": "2", "tool_call_id": "c2"}),
        ),
    ];
    let lines: Vec<Record> = ["c3", "c4", "c5"]
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            [
                record(
                    &format!("a{i}"),
                    json!({"role": "assistant", "content": null, "tool_calls": call(c)}),
                ),
                record(
                    &format!("t{i}"),
                    json!({"role": "tool", "content": "n", "tool_call_id": c}),
                ),
            ]
        })
        .collect();
    assert_eq!(align::divert(&tail, &lines), vec![Verdict::New; 6]);

    // The last two rows again, byte for byte (key order is not part of the
    // bytes), then new lines.
    let lines = [
        record("l1", json!({"tool_calls": call("c2"), "role": "assistant"})),
        record("l2", json!({"tool_call_id": "c2", "content": "2", "role": "tool"})),
        record("l3", json!({"role": "assistant", "tool_calls": call("c3")})),
        record("l4", json!({"role": "user", "content": "2"})),
    ];
    assert_eq!(
        align::divert(&tail, &lines),
        [same("hermes:3"), same("hermes:4"), Verdict::New, Verdict::New]
    );

    // The same bytes as a row away from the join: another message.
    let lines = [record("l1", json!({"role": "assistant", "tool_calls": call("c1")}))];
    assert_eq!(align::divert(&tail, &lines), [Verdict::New]);

    // The evidence cannot tell: the words of the row at the join with other
    // bytes (no timestamp), and one line's bytes twice.
    let tail = [
        record("hermes:1", json!({"role": "user", "content": "hi", "timestamp": 1.5})),
        record(
            "hermes:2",
            json!({"role": "assistant", "content": "hello", "timestamp": 2.5}),
        ),
    ];
    let lines = [
        record("l1", json!({"role": "assistant", "content": "hello"})),
        record("l2", json!({"role": "user", "content": "thanks"})),
        record("l3", json!({"role": "user", "content": "thanks"})),
    ];
    assert_eq!(
        align::divert(&tail, &lines),
        [possible("hermes:2"), Verdict::New, possible("l2")]
    );
    // A line repeating one found to be a row may repeat that row.
    let lines = [
        record("l1", json!({"role": "assistant", "content": "hello", "timestamp": 2.5})),
        record("l2", json!({"role": "assistant", "content": "hello", "timestamp": 2.5})),
    ];
    assert_eq!(align::divert(&tail, &lines), [same("hermes:2"), possible("hermes:2")]);
    // The longest join wins; a number keeps its digits ("2.50" is not "2.5").
    let lines = [
        record("l1", json!({"role": "user", "content": "hi", "timestamp": 1.5})),
        record("l2", json!({"role": "assistant", "content": "hello", "timestamp": 2.5})),
    ];
    assert_eq!(align::divert(&tail, &lines), [same("hermes:1"), same("hermes:2")]);
    let digits: Value =
        serde_json::from_str(r#"{"role": "assistant", "content": "hello", "timestamp": 2.50}"#).unwrap();
    assert_eq!(align::divert(&tail, &[record("l1", digits)]), [possible("hermes:2")]);
    // No rows: every line is new but the repeats.
    assert_eq!(
        align::divert(
            &[],
            &[
                record("l1", json!({"content": "x"})),
                record("l2", json!({"content": "x"}))
            ]
        ),
        [Verdict::New, possible("l1")]
    );
}

/// A reading of `rows` for a snapshot of `entries` entries.
fn reading(rows: &[Record], entries: usize) -> Reading {
    let mut r = Reading::new(entries);
    for row in rows {
        r.push(|| row.clone());
    }
    r
}

#[test]
fn a_snapshot_entry_is_the_message_at_its_position_by_role_and_cleaned_content() {
    // A compaction archived the first "continue"; the snapshot has the
    // user's second one at a later position.
    let rows = [
        record(
            "hermes:1",
            json!({"role": "user", "content": "continue", "timestamp": 1.5}),
        ),
        record(
            "hermes:2",
            json!({"role": "assistant", "content": "Done.", "timestamp": 2.5}),
        ),
        record(
            "hermes:3",
            json!({"role": "user", "content": "[summary] continue", "timestamp": 3.5}),
        ),
        record(
            "hermes:4",
            json!({"role": "assistant", "content": "ok", "timestamp": 4.5}),
        ),
    ];
    let entries = [
        record("s0", json!({"role": "user", "content": "[summary] continue"})),
        record("s1", json!({"role": "assistant", "content": "ok"})),
        record("s2", json!({"role": "user", "content": "continue"})),
        record("s3", json!({"role": "assistant", "content": "Continuing."})),
    ];
    let (active, every) = (reading(&rows[2..], 4), reading(&rows, 4));
    assert_eq!(
        align::snapshot(&[&active, &every], &entries),
        [same("hermes:3"), same("hermes:4"), Verdict::New, Verdict::New]
    );
    // A snapshot Hermes did not rewrite after the compaction (it never
    // overwrites one with fewer messages) is read against every row.
    let stale = [
        record("s0", json!({"role": "user", "content": "continue"})),
        record("s1", json!({"role": "assistant", "content": "Done."})),
    ];
    let (active, every) = (reading(&rows[2..], 2), reading(&rows, 2));
    assert_eq!(
        align::snapshot(&[&active, &every], &stale),
        [same("hermes:1"), same("hermes:2")]
    );

    // Cleaned as Hermes cleans an assistant's text: the same message. A
    // redacted secret: the evidence cannot tell. Tool calls without content
    // at their position: the same.
    let rows = [
        record(
            "hermes:1",
            json!({"role": "user", "content": "key sk-live-0123456789", "timestamp": 1.5}),
        ),
        record(
            "hermes:2",
            json!({"role": "assistant", "content": "<REASONING_SCRATCHPAD>hm</REASONING_SCRATCHPAD>\n\n\nNoted. ", "timestamp": 2.5}),
        ),
        record(
            "hermes:3",
            json!({"role": "assistant", "tool_calls": call("c1"), "timestamp": 3.5}),
        ),
    ];
    let entries = [
        record("s0", json!({"role": "user", "content": "key sk-liv...6789"})),
        record(
            "s1",
            json!({"role": "assistant", "content": "<think>hm</think>\nNoted."}),
        ),
        record(
            "s2",
            json!({"role": "assistant", "content": null, "tool_calls": call("c1")}),
        ),
        record("s3", json!({"role": "user", "content": "bye"})),
    ];
    let active = reading(&rows, 4);
    assert_eq!(
        align::snapshot(&[&active, &active.clone()], &entries),
        [possible("hermes:1"), same("hermes:2"), same("hermes:3"), Verdict::New]
    );
    // Another role at a position: the transcripts differ there.
    let entries = [record(
        "s0",
        json!({"role": "assistant", "content": "key sk-live-0123456789"}),
    )];
    assert_eq!(align::snapshot(&[&reading(&rows, 1)], &entries), [possible("hermes:1")]);
    // A user's text is not cleaned: only an assistant's is.
    let entries = [record(
        "s0",
        json!({"role": "user", "content": "key sk-live-0123456789 "}),
    )];
    assert_eq!(align::snapshot(&[&reading(&rows, 1)], &entries), [possible("hermes:1")]);
}

#[test]
fn content_is_cleaned_as_hermes_cleans_a_snapshot() {
    let cases = [
        (
            "<REASONING_SCRATCHPAD>x</REASONING_SCRATCHPAD>\n\n\nHi  ",
            "<think>x</think>\nHi",
        ),
        ("a\n\n\n<think>b</think>\n\n\nc\n\nd", "a\n<think>b</think>\nc\n\nd"),
        ("</think>\n\n<think>", "</think>\n<think>"),
        ("\u{1c} x\u{a0}\u{2003}\u{1f}\n", "x"),
        ("no tags\n\n", "no tags"),
        ("", ""),
    ];
    for (raw, want) in cases {
        assert_eq!(clean::clean_session_content(raw), want, "{raw:?}");
    }
    let role = json!("assistant");
    let text = json!("  a  ");
    assert_eq!(clean::snapshot_content(Some(&role), Some(&text)), json!("a"));
    assert_eq!(clean::snapshot_content(Some(&json!("user")), Some(&text)), text);
    let parts = json!([{"type": "text", "text": " a "}]);
    assert_eq!(clean::snapshot_content(Some(&role), Some(&parts)), parts);
    assert_eq!(clean::snapshot_content(Some(&role), None), Value::Null);
}
