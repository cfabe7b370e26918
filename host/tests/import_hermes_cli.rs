//! `turnsafe import hermes` on a Hermes home written by hermes-agent
//! 0.19.0's own `SessionDB` (`tests/fixtures/hermes-0.19.0`, made by
//! `tests/fixtures/make-hermes-home.py`): the human report and every
//! refusal as the user reads them (snapshots), the JSON counts, a second
//! import that adds nothing, and a Hermes home that keeps every byte.
//! Sessions added to a copy of it, row by row as `SessionDB.append_message`
//! writes them, settle divert lines and snapshot entries against the
//! stored rows: by their place in the sequence and their bytes, never by
//! their text alone.
//! The field-by-field comparison with Hermes' own `get_messages`, a live
//! Hermes writer and an unflushed WAL are in
//! `python/tests/test_import_hermes.py`, where the real package runs.

mod hermes_fixture;

use hermes_fixture::{bytes, hermes_home};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use turnsafe_host::import_hermes::ImportError;

const S1: &str = "20260101_090000_a1b2c3";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnsafe")
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn turnsafe(args: &[&str]) -> Run {
    let out = std::process::Command::new(bin()).args(args).output().unwrap();
    Run {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn redact(text: &str, dir: &Path) -> String {
    text.replace(dir.to_str().unwrap(), "[DIR]")
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_hermes_home_imports_once_and_is_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let source = hermes_home(dir.path());
    let home = dir.path().join("turnsafe");
    let before = bytes(&source);
    let (src, dst) = (source.to_str().unwrap(), home.to_str().unwrap());

    let dry = turnsafe(&["import", "hermes", "--source", src, "--home", dst, "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(!home.exists(), "a dry run writes nothing");

    let r = turnsafe(&["import", "hermes", "--source", src, "--home", dst]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    turnsafe_tests::snapshot_settings().bind(|| {
        insta::assert_snapshot!("operator__import_hermes_report", redact(&r.stdout, dir.path()));
        insta::assert_snapshot!("operator__import_hermes_dry_run", redact(&dry.stdout, dir.path()));
    });
    assert_eq!(
        dry.stdout.lines().next(),
        r.stdout.lines().next(),
        "a dry run reports what the import does"
    );

    let again = turnsafe(&["import", "hermes", "--source", src, "--home", dst, "--json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let lines = json_lines(&again.stdout);
    let end = &lines.last().unwrap()["data"];
    assert_eq!((end["imported"].as_u64(), end["archived"].as_u64()), (Some(0), Some(0)));
    assert_eq!(end["sessions"], 2);
    assert_eq!(end["quarantined"], 1);
    assert_eq!(end["torn"], 1);
    let mapped = &end["renamed"]["user 42/ü"];
    assert_eq!(mapped, "user_42__-h10fbab2a704de8bd73782225570d18a0");

    // What the home holds: the session in Hermes' order, then the new
    // divert and snapshot lines (the divert's first line is the last row
    // again, byte for byte; the snapshot's first three entries are the rows
    // and that divert line); the compacted rows archived.
    let show = turnsafe(&["show", "--home", dst, "--session", S1, "--json"]);
    assert_eq!(show.code, 0, "{}", show.stderr);
    assert_eq!(
        messages(&show.stdout),
        [
            ("hermes:4".to_string(), Value::from("[summary] 4.2 km")),
            ("hermes:5".to_string(), Value::from("4,2 km.")),
            (
                "hermes:jsonl:2:3875bc185acd0c9228a5bcc9".to_string(),
                Value::from("Und morgen? ☀")
            ),
            (
                "hermes:json:3:43a2da6251c8a669bf6631e6".to_string(),
                Value::from("Morgen auch.")
            ),
        ]
    );
    let archived = turnsafe(&["show", "--home", dst, "--session", S1, "--archived", "--json"]);
    assert_eq!(archived.code, 0, "{}", archived.stderr);
    let archived: Vec<(String, String)> = json_lines(&archived.stdout)
        .into_iter()
        .filter(|v| v["type"] == "archived")
        .map(|v| {
            (
                v["data"]["uid"].as_str().unwrap().to_string(),
                v["data"]["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let compaction = |uid: &str| (uid.to_string(), "compaction".to_string());
    assert_eq!(
        archived,
        [compaction("hermes:3"), compaction("hermes:2"), compaction("hermes:1")]
    );
    assert_eq!(bytes(&source), before, "the Hermes home keeps every byte");
}

/// `show --json`'s messages: (uid, content).
fn messages(stdout: &str) -> Vec<(String, Value)> {
    json_lines(stdout)
        .into_iter()
        .filter(|v| v["type"] == "message")
        .map(|v| {
            (
                v["data"]["uid"].as_str().unwrap().to_string(),
                v["data"]["message"]["content"].clone(),
            )
        })
        .collect()
}

#[test]
fn refusals_say_what_was_refused_and_that_nothing_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let source = hermes_home(dir.path());
    let src = source.to_str().unwrap();
    let before = bytes(&source);

    let same = turnsafe(&["import", "hermes", "--source", src, "--home", src]);
    assert_eq!(same.code, 5);
    let unknown = turnsafe(&[
        "import",
        "hermes",
        "--source",
        src,
        "--home",
        dir.path().join("t").to_str().unwrap(),
        "--session",
        "nope",
    ]);
    assert_eq!(unknown.code, 2);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let missing = turnsafe(&["import", "hermes", "--source", empty.to_str().unwrap(), "--home", src]);
    assert_eq!(missing.code, 2);
    let not_hermes_dir = dir.path().join("other");
    std::fs::create_dir(&not_hermes_dir).unwrap();
    rusqlite::Connection::open(not_hermes_dir.join("state.db"))
        .unwrap()
        .execute_batch("CREATE TABLE t(x)")
        .unwrap();
    let not_hermes = turnsafe(&[
        "import",
        "hermes",
        "--source",
        not_hermes_dir.to_str().unwrap(),
        "--home",
        dir.path().join("t2").to_str().unwrap(),
    ]);
    assert_eq!(not_hermes.code, 2);
    let busy = ImportError::SourceBusy {
        path: PathBuf::from("/home/me/.hermes/state.db"),
        attempts: 10,
    };
    assert!(busy.is_refusal());
    let text = [
        ("home is the source", same.stderr),
        ("no such session", unknown.stderr),
        ("no state.db", missing.stderr),
        ("not a Hermes database", not_hermes.stderr),
        ("Hermes kept writing", format!("turnsafe import hermes: {busy}\n")),
    ]
    .iter()
    .map(|(k, v)| format!("{k}:\n{}", redact(v, dir.path())))
    .collect::<Vec<_>>()
    .join("\n");
    turnsafe_tests::snapshot_settings().bind(|| {
        insta::assert_snapshot!("operator__import_hermes_refusals", text);
    });
    assert_eq!(bytes(&source), before);
    assert!(!dir.path().join("t").exists() && !dir.path().join("t2").exists());
}

/// A Hermes message row, as `SessionDB.append_message` writes it.
struct Row {
    role: &'static str,
    content: Option<&'static str>,
    tool_calls: Option<String>,
    tool_call_id: Option<&'static str>,
    timestamp: f64,
    compacted: bool,
}

fn said(role: &'static str, content: &'static str, timestamp: f64) -> Row {
    Row {
        role,
        content: Some(content),
        tool_calls: None,
        tool_call_id: None,
        timestamp,
        compacted: false,
    }
}

/// An assistant message calling the tool `call` (no content, as Hermes
/// stores a tool call), with `tool_calls` as Hermes' JSON text.
fn calls(call: &str, timestamp: f64) -> Row {
    Row {
        role: "assistant",
        content: None,
        tool_calls: Some(tool_calls(call).to_string()),
        tool_call_id: None,
        timestamp,
        compacted: false,
    }
}

fn answers(call: &'static str, content: &'static str, timestamp: f64) -> Row {
    Row {
        role: "tool",
        content: Some(content),
        tool_calls: None,
        tool_call_id: Some(call),
        timestamp,
        compacted: false,
    }
}

fn tool_calls(call: &str) -> Value {
    serde_json::json!([{"id": call, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}])
}

impl Row {
    fn compacted(mut self) -> Row {
        self.compacted = true;
        self
    }
}

/// Add the Hermes session `id` with `rows` to the Hermes home `source`;
/// the rows' `messages.id`s.
fn hermes_session(source: &Path, id: &str, rows: &[Row]) -> Vec<i64> {
    let db = rusqlite::Connection::open(source.join("state.db")).unwrap();
    db.execute(
        "INSERT INTO sessions(id, source, started_at) VALUES (?1, 'cli', 1767258000.0)",
        [id],
    )
    .unwrap();
    rows.iter()
        .map(|r| {
            db.execute(
                "INSERT INTO messages(session_id, role, content, tool_call_id, tool_calls, timestamp, active, compacted) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                rusqlite::params![
                    id,
                    r.role,
                    r.content,
                    r.tool_call_id,
                    r.tool_calls,
                    r.timestamp,
                    !r.compacted,
                    r.compacted
                ],
            )
            .unwrap();
            db.last_insert_rowid()
        })
        .collect()
}

/// Write the divert file of `id`: one JSON text per line.
fn divert(source: &Path, id: &str, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(source.join("sessions").join(format!("{id}.jsonl")), text).unwrap();
}

/// Write the snapshot of `id`, as Hermes writes it (indented).
fn snapshot(source: &Path, id: &str, messages: Value) {
    let count = messages.as_array().unwrap().len();
    let file = serde_json::json!({
        "session_id": id, "model": "gpt-test", "platform": "cli", "message_count": count, "messages": messages,
    });
    std::fs::write(
        source.join("sessions").join(format!("session_{id}.json")),
        serde_json::to_string_pretty(&file).unwrap(),
    )
    .unwrap();
}

/// The uid of a snapshot's entry: its index and its canonical bytes.
fn snapshot_uid(index: u64, value: &Value) -> String {
    turnsafe_host::import_hermes::line_uid(
        turnsafe_host::import_hermes::LineKind::Snapshot,
        index,
        turnsafe_host::same::canonical(value).as_bytes(),
    )
}

/// The uid of a divert line: its number and its bytes.
fn divert_uid(line: u64, value: &Value) -> String {
    turnsafe_host::import_hermes::line_uid(
        turnsafe_host::import_hermes::LineKind::Divert,
        line,
        value.to_string().as_bytes(),
    )
}

/// The counts of one session's JSON report line, and its possible
/// duplicates as (kind, line, uid, may_repeat).
fn counts(report: &Value) -> (Value, Vec<(String, u64, String, String)>) {
    let pick = [
        "rows",
        "lines",
        "imported",
        "archived",
        "duplicate",
        "possible_duplicate",
        "quarantined",
        "torn",
    ];
    let counts = pick.iter().map(|k| ((*k).to_string(), report[*k].clone())).collect();
    let marks = report["possible_duplicates"]
        .as_array()
        .map(|marks| {
            marks
                .iter()
                .map(|m| {
                    (
                        m["kind"].as_str().unwrap().to_string(),
                        m["line"].as_u64().unwrap(),
                        m["uid"].as_str().unwrap().to_string(),
                        m["may_repeat"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (Value::Object(counts), marks)
}

fn expect(rows: u64, lines: u64, imported: u64, archived: u64, duplicate: u64, possible: u64) -> Value {
    serde_json::json!({
        "rows": rows, "lines": lines, "imported": imported, "archived": archived, "duplicate": duplicate,
        "possible_duplicate": possible, "quarantined": 0, "torn": 0,
    })
}

#[test]
fn lines_are_settled_by_their_place_and_bytes_never_by_their_text() {
    let dir = tempfile::tempdir().unwrap();
    let source = hermes_home(dir.path());
    let home = dir.path().join("turnsafe");

    // The user says "continue" again; only the divert file has it.
    hermes_session(
        &source,
        "continue-divert",
        &[
            said("user", "continue", 1767258300.5),
            said("assistant", "On it.", 1767258301.5),
        ],
    );
    divert(
        &source,
        "continue-divert",
        &[serde_json::json!({"role": "user", "content": "continue"})],
    );

    // A compaction took the first "continue" out; the snapshot, written
    // after it, has the user's second one at a later position.
    hermes_session(
        &source,
        "continue-snapshot",
        &[
            said("user", "continue", 1767258400.5).compacted(),
            said("assistant", "Done.", 1767258401.5).compacted(),
            said("user", "[summary] asked to continue", 1767258402.5),
            said("assistant", "ok", 1767258403.5),
        ],
    );
    snapshot(
        &source,
        "continue-snapshot",
        serde_json::json!([
            {"role": "user", "content": "[summary] asked to continue"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "continue"},
            {"role": "assistant", "content": "Continuing."},
        ]),
    );

    // Two stored tool calls (no content), three diverted ones calling
    // other tools.
    hermes_session(
        &source,
        "tool-calls",
        &[
            said("user", "Look up c1 and c2", 1767258100.5),
            calls("c1", 1767258101.5),
            answers("c1", "1", 1767258102.5),
            calls("c2", 1767258103.5),
            answers("c2", "2", 1767258104.5),
        ],
    );
    let diverted_call =
        |call: &str| serde_json::json!({"role": "assistant", "content": null, "tool_calls": tool_calls(call)});
    let diverted_answer = |call: &str, n: &str| serde_json::json!({"role": "tool", "content": n, "tool_call_id": call});
    divert(
        &source,
        "tool-calls",
        &[
            diverted_call("c3"),
            diverted_answer("c3", "3"),
            diverted_call("c4"),
            diverted_answer("c4", "4"),
            diverted_call("c5"),
            diverted_answer("c5", "5"),
        ],
    );

    // A divert run starting with the last two rows again, byte for byte
    // (as the import stores them: Hermes' columns, NULLs left out; key
    // order and spacing are not part of the bytes), then two new ones.
    hermes_session(
        &source,
        "tail-repeat",
        &[
            said("user", "go", 1767258200.5),
            calls("c0", 1767258201.5),
            answers("c0", "0", 1767258202.5),
            calls("c1", 1767258203.5),
            answers("c1", "1", 1767258204.5),
        ],
    );
    divert(
        &source,
        "tail-repeat",
        &[
            serde_json::json!({"timestamp": 1767258203.5, "tool_calls": tool_calls("c1"), "role": "assistant", "observed": 0}),
            serde_json::json!({"role": "tool", "content": "1", "tool_call_id": "c1", "timestamp": 1767258204.5, "observed": 0}),
            diverted_call("c2"),
            diverted_answer("c2", "2"),
        ],
    );

    // The evidence cannot tell: the last row's words without its bytes at
    // the join, and a line said twice.
    let ambiguous = hermes_session(
        &source,
        "ambiguous",
        &[
            said("user", "hi", 1767258500.5),
            said("assistant", "hello", 1767258501.5),
        ],
    );
    let hello = serde_json::json!({"role": "assistant", "content": "hello"});
    let thanks = serde_json::json!({"role": "user", "content": "thanks"});
    divert(&source, "ambiguous", &[hello.clone(), thanks.clone(), thanks.clone()]);

    // A snapshot as Hermes writes it: a secret redacted (the evidence
    // cannot tell), an assistant's scratchpad cleaned (the same message).
    let redacted = hermes_session(
        &source,
        "redacted",
        &[
            said("user", "my key is sk-live-0123456789abcdef", 1767258600.5),
            said(
                "assistant",
                "<REASONING_SCRATCHPAD>keep it safe</REASONING_SCRATCHPAD>\n\n\nNoted.  ",
                1767258601.5,
            ),
        ],
    );
    let redacted_secret = serde_json::json!({"role": "user", "content": "my key is sk-liv...cdef"});
    snapshot(
        &source,
        "redacted",
        serde_json::json!([
            redacted_secret,
            {"role": "assistant", "content": "<think>keep it safe</think>\nNoted."},
            {"role": "user", "content": "bye"},
        ]),
    );

    let (src, dst) = (source.to_str().unwrap(), home.to_str().unwrap());
    let dry = turnsafe(&[
        "import",
        "hermes",
        "--source",
        src,
        "--home",
        dst,
        "--json",
        "--dry-run",
    ]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let r = turnsafe(&["import", "hermes", "--source", src, "--home", dst, "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines = json_lines(&r.stdout);
    let dry = json_lines(&dry.stdout);
    assert_eq!(
        dry[..dry.len() - 1],
        lines[..lines.len() - 1],
        "a dry run reports what the import does, line by line"
    );
    let by: BTreeMap<String, Value> = lines[..lines.len() - 1]
        .iter()
        .map(|l| (l["data"]["hermes_id"].as_str().unwrap().to_string(), l["data"].clone()))
        .collect();
    let mark = |kind: &str, line: u64, uid: String, of: String| (kind.to_string(), line, uid, of);
    let sessions = [
        ("continue-divert", expect(2, 1, 3, 0, 0, 0), vec![]),
        ("continue-snapshot", expect(4, 4, 4, 2, 2, 0), vec![]),
        ("tool-calls", expect(5, 6, 11, 0, 0, 0), vec![]),
        ("tail-repeat", expect(5, 4, 7, 0, 2, 0), vec![]),
        (
            "ambiguous",
            expect(2, 3, 5, 0, 0, 2),
            vec![
                mark("divert", 1, divert_uid(1, &hello), format!("hermes:{}", ambiguous[1])),
                mark("divert", 3, divert_uid(3, &thanks), divert_uid(2, &thanks)),
            ],
        ),
        (
            "redacted",
            expect(2, 3, 4, 0, 1, 1),
            vec![mark(
                "snapshot",
                0,
                snapshot_uid(0, &redacted_secret),
                format!("hermes:{}", redacted[0]),
            )],
        ),
    ];
    // All at once, so that a failure shows every session.
    let got: Vec<_> = sessions.iter().map(|(id, _, _)| (*id, counts(&by[*id]))).collect();
    let want: Vec<_> = sessions
        .iter()
        .map(|(id, want, marks)| (*id, (want.clone(), marks.clone())))
        .collect();
    assert_eq!(got, want);
    let end = &lines.last().unwrap()["data"];
    // The fixture's two sessions: 5 imported, 5 archived, 4 duplicate.
    assert_eq!(
        (
            &end["imported"],
            &end["archived"],
            &end["duplicate"],
            &end["possible_duplicate"]
        ),
        (
            &Value::from(5 + 3 + 4 + 11 + 7 + 5 + 4),
            &Value::from(5 + 2),
            &Value::from(4 + 2 + 2 + 1),
            &Value::from(3)
        )
    );

    // The human report names each possible duplicate and what it may
    // repeat.
    let other = dir.path().join("other");
    let human = turnsafe(&["import", "hermes", "--source", src, "--home", other.to_str().unwrap()]);
    assert_eq!(human.code, 0, "{}", human.stderr);
    turnsafe_tests::snapshot_settings().bind(|| {
        insta::assert_snapshot!(
            "operator__import_hermes_possible_duplicates",
            redact(&human.stdout, dir.path())
        );
    });

    // The transcripts, in order: every diverted tool call is there.
    let show = |id: &str| {
        let s = turnsafe(&["show", "--home", dst, "--session", id, "--json"]);
        assert_eq!(s.code, 0, "{}", s.stderr);
        json_lines(&s.stdout)
            .into_iter()
            .filter(|v| v["type"] == "message")
            .map(|v| v["data"]["message"].clone())
            .collect::<Vec<Value>>()
    };
    let call_ids = |id: &str| -> Vec<String> {
        show(id)
            .iter()
            .filter_map(|m| m["tool_calls"][0]["id"].as_str().map(String::from))
            .collect()
    };
    assert_eq!(call_ids("tool-calls"), ["c1", "c2", "c3", "c4", "c5"]);
    assert_eq!(call_ids("tail-repeat"), ["c0", "c1", "c2"]);
    let words = |id: &str| -> Vec<Value> { show(id).iter().map(|m| m["content"].clone()).collect() };
    assert_eq!(words("continue-divert"), ["continue", "On it.", "continue"]);
    assert_eq!(
        words("continue-snapshot"),
        ["[summary] asked to continue", "ok", "continue", "Continuing."]
    );
    assert_eq!(words("ambiguous"), ["hi", "hello", "hello", "thanks", "thanks"]);

    // Again: nothing new, nothing possibly repeated.
    let again = turnsafe(&["import", "hermes", "--source", src, "--home", dst, "--json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let again = json_lines(&again.stdout);
    let end2 = &again.last().unwrap()["data"];
    assert_eq!(
        (&end2["imported"], &end2["archived"], &end2["possible_duplicate"]),
        (&Value::from(0), &Value::from(0), &Value::from(0))
    );
    assert_eq!(end2["duplicate"], Value::from(39 + 7 + 9));
}
