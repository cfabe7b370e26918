//! The pure parts of the Hermes import: ids, decoding, lines, the repeat
//! rule. The import itself is tested against homes the real `hermes-agent`
//! package writes (`python/tests/test_import_hermes.py`).

use serde_json::{Value, json};

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
        assert!(crate::divert::validate_session_id(&safe_session_id(id)).is_ok());
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

#[test]
fn the_repeat_rule_matches_each_message_once() {
    let yes = obj(json!({"role": "user", "content": "yes"}));
    let yes_later = obj(json!({"role": "user", "content": "yes", "timestamp": 5.0}));
    let tool = obj(json!({"role": "tool", "content": "42", "tool_call_id": "c1"}));
    let tool_other = obj(json!({"role": "tool", "content": "42", "tool_call_id": "c2"}));
    // Key order and fields outside the rule do not matter.
    assert_eq!(repeat_key(&yes), repeat_key(&yes_later));
    assert_eq!(
        repeat_key(&obj(json!({"content": {"b": 1, "a": 2}, "role": "x"}))),
        repeat_key(&obj(json!({"role": "x", "content": {"a": 2, "b": 1}})))
    );
    assert_ne!(repeat_key(&tool), repeat_key(&tool_other));

    let mut pool = Pool::default();
    pool.add(repeat_key(&yes));
    pool.add(repeat_key(&tool));
    // A divert file: "yes" repeats the row; a second "yes" is new; so is c2.
    assert!(pool.repeats(repeat_key(&yes)));
    assert!(!pool.repeats(repeat_key(&yes)));
    assert!(pool.repeats(repeat_key(&tool)));
    assert!(!pool.repeats(repeat_key(&tool_other)));
    pool.end_file();
    // A snapshot holding all of them: the new lines of the file before are
    // matched too, once each.
    assert!(pool.repeats(repeat_key(&yes)));
    assert!(pool.repeats(repeat_key(&tool_other)));
    assert!(!pool.repeats(repeat_key(&tool_other)));
    pool.end_file();
    // Every file is matched against the session on its own: a row both a
    // divert file and a snapshot repeat is a repeat in both.
    let mut pool = Pool::default();
    pool.add(repeat_key(&tool));
    assert!(pool.repeats(repeat_key(&tool)));
    pool.end_file();
    assert!(pool.repeats(repeat_key(&tool)));
    assert!(!pool.repeats(repeat_key(&tool)));
}
