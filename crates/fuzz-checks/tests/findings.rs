//! What the fuzz targets found, each pinned by its own test: every one
//! failed before its fix. The inputs are also kept under
//! `fuzz/regressions/<target>/`, replayed by `corpus.rs`.

use serde_json::Value;
use turnsafe_fuzz_checks::{divert, json, records};

fn divert_line(uid: &str, content: &str) -> String {
    format!(
        r#"{{"v":2,"session":"s1","uid":"{uid}","seq":null,"batch":"b","cause":"disk","at":"2026-01-01T00:00:00.000Z","message":{{"role":"user","content":"{content}"}}}}"#
    )
}

/// A receipt whose offset and length add past `u64::MAX` panicked in
/// `verify_receipt` ("attempt to add with overflow") where it must
/// simply not hold; `explain --receipt-json` reads such a receipt from
/// the user.
#[test]
fn a_receipt_past_the_end_of_numbers_does_not_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s1.jsonl");
    std::fs::write(&path, b"{}\n").unwrap();
    let receipt = turnsafe_host::divert::Receipt {
        path: path.to_string_lossy().into_owned(),
        offset: u64::MAX,
        length: 1,
        count: 1,
        sha256: "00".repeat(32),
    };
    assert!(!turnsafe_host::divert::verify_receipt(&receipt).unwrap());
    let mut line = serde_json::to_vec(&receipt).unwrap();
    line.extend_from_slice(b"\n{}\n");
    records::check_receipt(&line).unwrap();
}

/// One byte that is not UTF-8 anywhere in `ledger.jsonl` made doctor
/// read the whole ledger as empty: every quarantined line disappeared
/// from its report.
#[test]
fn a_ledger_line_that_is_not_utf8_hides_no_other_line() {
    let mut ledger = Vec::new();
    for state in ["quarantined", "conflict", "replayed"] {
        ledger.extend_from_slice(format!("{{\"state\":\"{state}\"}}\n").as_bytes());
    }
    ledger.extend_from_slice(b"{\"state\":\"quarantined\",\"x\":\"\xff\"}\n");
    records::check_ledger(&ledger).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join("sessions")).unwrap();
    std::fs::write(home.path().join("sessions/ledger.jsonl"), &ledger).unwrap();
    let (_, facts) = turnsafe_host::doctor::examine(home.path(), false);
    assert_eq!(facts["quarantined_lines"], Value::from(2));
}

/// A divert line with a byte that is not UTF-8 was read as lossy text
/// and replayed with U+FFFD in place of the byte: a line settled as
/// stored whose stored bytes are not the line's. It is quarantined now.
#[test]
fn a_divert_line_that_is_not_utf8_is_quarantined_not_replayed() {
    let mut file = divert_line("u1", "caf\u{e9}").into_bytes();
    let at = file.iter().position(|b| *b == 0xc3).unwrap();
    file[at] = 0xff;
    file.push(b'\n');
    file.extend_from_slice(format!("{}\n", divert_line("u2", "fine")).as_bytes());
    divert::check(&file).unwrap();
}

/// A line of Unicode whitespace alone (no-break space, line separator)
/// was skipped as blank: no ledger entry, not counted, while its bytes
/// are not whitespace to JSON. Every line that holds more than ASCII
/// whitespace gets its ledger entry now (quarantined).
#[test]
fn a_line_of_unicode_whitespace_gets_its_ledger_entry() {
    let file = format!("{}\n\u{a0}\n\u{2028}\n \t\r\n", divert_line("u1", "x"));
    divert::check(file.as_bytes()).unwrap();
}

/// The component took 128 levels of nesting where every native host's
/// reader (serde_json) takes 127: one limit now, on both sides.
#[test]
fn the_component_and_the_hosts_share_one_nesting_limit() {
    for levels in [126, 127, 128, 129] {
        let text = format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        json::check(text.as_bytes()).unwrap_or_else(|e| panic!("{levels} levels: {e}"));
        let obj = format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels));
        json::check(obj.as_bytes()).unwrap_or_else(|e| panic!("{levels} levels of objects: {e}"));
    }
}

/// A capture manifest is read from disk: one recording `outcome_unknown`
/// (or any cause no capture is made for) became the cause of every batch
/// the capture held back, and the copy told of a COMMIT lost on the way
/// to a server while nothing was written at all (found by the
/// `flush_machine` target: "an unknown outcome told as not saved").
#[test]
fn a_manifest_cause_no_capture_is_made_for_reads_as_unknown() {
    use turnsafe_policy::Cause;
    for (label, want) in [
        ("outcome_unknown", Cause::Unknown),
        ("locked", Cause::Unknown),
        ("no_such_cause", Cause::Unknown),
        ("deleted_wal", Cause::DeletedWal),
        ("replaced", Cause::Replaced),
        ("corrupt", Cause::Corrupt),
    ] {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("state.db.retired-20260101T000000Z-1");
        std::fs::create_dir(&dir).unwrap();
        let manifest = serde_json::json!({"trigger": "t", "cause": label, "missing_rows": {"s1": 1}});
        std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
        let holds = turnsafe_host::captures::holds(home.path()).unwrap();
        assert_eq!(holds.len(), 1);
        assert_eq!(holds[0].cause, want, "{label}");
    }
}

/// A LangGraph divert line whose record holds a field this turnsafe does
/// not know was replayed without that field: stored bytes other than the
/// line's (found by the `divert_file` target). It is quarantined now,
/// its bytes kept in `settled/`.
#[test]
fn a_graph_record_with_an_unknown_field_is_quarantined_not_stored_without_it() {
    let write = serde_json::json!({
        "thread_id": "s1", "checkpoint_ns": "", "checkpoint_id": "c1", "task_id": "t", "task_path": "",
        "idx": 0, "channel": "messages", "type": "json", "value": "WzFd", "type_path": "",
    });
    let line = serde_json::json!({
        "v": 3, "kind": "write", "session": "s1", "uid": "w1", "batch": "b", "cause": "disk",
        "at": "2026-01-01T00:00:00.000Z", "write": write,
    });
    divert::check(format!("{line}\n").as_bytes()).unwrap();
    let mut known = line.clone();
    known["write"].as_object_mut().unwrap().remove("type_path");
    divert::check(format!("{known}\n").as_bytes()).unwrap();
}

/// A LangGraph write whose `idx` was written `-0` was stored as `0`: the
/// typed reading rewrote a number, so the stored bytes were not the
/// line's (found by the `divert_file` target). A record that does not
/// read back as its own bytes is quarantined now.
#[test]
fn a_graph_record_that_does_not_read_back_as_its_bytes_is_quarantined() {
    let line = |idx: &str| {
        format!(
            r#"{{"v":3,"kind":"write","session":"s1","uid":"w","batch":"b","cause":"disk","at":"2026-01-01T00:00:00.000Z","write":{{"thread_id":"s1","checkpoint_ns":"","checkpoint_id":"c1","task_id":"t","task_path":"","idx":{idx},"channel":"messages","type":"json","value":"WzFd"}}}}"#
        )
    };
    divert::check(format!("{}\n", line("-0")).as_bytes()).unwrap();
    divert::check(format!("{}\n{}\n", line("0"), line("-1")).as_bytes()).unwrap();
}

/// Doctor's count of pending divert lines read each file as text: one
/// byte that is not UTF-8 hid every line of the file (found reading the
/// ledger's twin). Each line is read on its own now.
#[test]
fn a_pending_divert_line_that_is_not_utf8_hides_no_other_line() {
    let home = tempfile::tempdir().unwrap();
    let sessions = home.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let mut file = Vec::new();
    for (uid, content) in [("u1", &b"fine"[..]), ("u2", &b"caf\xff"[..]), ("u3", &b"also fine"[..])] {
        file.extend_from_slice(
            format!(r#"{{"v":2,"session":"s1","uid":"{uid}","seq":null,"batch":"b","cause":"disk","at":"t","message":{{"role":"user","content":""#)
                .as_bytes(),
        );
        file.extend_from_slice(content);
        file.extend_from_slice(b"\"}}\n");
    }
    std::fs::write(sessions.join("s1.jsonl"), &file).unwrap();
    let (_, facts) = turnsafe_host::doctor::examine(home.path(), false);
    assert_eq!(facts["pending_divert_lines"]["message"], Value::from(2), "{facts}");
}
