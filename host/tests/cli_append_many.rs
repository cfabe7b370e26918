//! `turnsafe append` without `--session`: each line names its session,
//! answers come back in input order with `"session"` added, a line without
//! a session is a bad line, and the lines waiting on stdin share commits:
//! counted from outside, with strace, as syncs of the WAL.
use std::process::Command;

use serde_json::{Value, json};

fn line(session: &str, tag: &str, n: usize) -> String {
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("{tag} {i}"), "uid": format!("{tag}-{i}")}))
        .collect();
    json!({"session": session, "messages": messages}).to_string()
}

fn answers(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each answer is JSON"))
        .collect()
}

#[test]
fn each_line_names_its_session_and_answers_keep_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut input = String::new();
    for (s, t) in [("a", "a1"), ("b", "b1"), ("a", "a2")] {
        input += &(line(s, t, 2) + "\n");
    }
    input += "[{\"role\": \"user\", \"content\": \"no session\"}]\n";
    input += "{\"session\": \"../up\", \"messages\": []}\n";
    input += &(line("b", "b2", 1) + "\n");
    input += "{\"session\": \"c\", \"items\": [{\"type\": \"reasoning\", \"uid\": \"kept inside\"}], \"uids\": [\"c1-0\"]}\n";
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--home"])
        .arg(&home)
        .write_stdin(input)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "a bad line means not everything persisted");
    let got = answers(&out.stdout);
    assert_eq!(got.len(), 7);
    let sessions: Vec<&Value> = got.iter().map(|a| &a["session"]).collect();
    assert_eq!(
        sessions,
        [
            &json!("a"),
            &json!("b"),
            &json!("a"),
            &Value::Null,
            &Value::Null,
            &json!("b"),
            &json!("c")
        ]
    );
    for i in [0, 1, 2, 5, 6] {
        assert_eq!(got[i]["persisted"], json!(true), "{}", got[i]);
        // The outcome is the single-session outcome, plus the session.
        for key in [
            "cause",
            "action",
            "committed",
            "diverted",
            "handed_back",
            "receipt",
            "copy",
            "uids",
        ] {
            assert!(got[i].get(key).is_some(), "{key} missing from {}", got[i]);
        }
    }
    assert_eq!(got[3]["line"], json!(4));
    assert!(got[3]["error"].as_str().unwrap().contains("\"session\""), "{}", got[3]);
    assert_eq!(got[4]["line"], json!(5));
    assert!(
        got[4]["error"].as_str().unwrap().contains("invalid session"),
        "{}",
        got[4]
    );

    // seq follows input order within each session.
    let conn = rusqlite::Connection::open(home.join("state.db")).unwrap();
    let rows: Vec<(String, String, i64)> = conn
        .prepare("SELECT session_id, uid, seq FROM messages ORDER BY session_id, seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let expect: Vec<(String, String, i64)> = [
        ("a", "a1-0", 1),
        ("a", "a1-1", 2),
        ("a", "a2-0", 3),
        ("a", "a2-1", 4),
        ("b", "b1-0", 1),
        ("b", "b1-1", 2),
        ("b", "b2-0", 3),
        ("c", "c1-0", 1),
    ]
    .iter()
    .map(|(s, u, q)| (s.to_string(), u.to_string(), *q))
    .collect();
    assert_eq!(rows, expect);
    let item: String = conn
        .query_row("SELECT item FROM messages WHERE uid = 'c1-0'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&item).unwrap(),
        json!({"type": "reasoning", "uid": "kept inside"})
    );
}

#[test]
fn lines_waiting_on_stdin_are_committed_together() {
    let strace = Command::new("strace")
        .arg("-V")
        .output()
        .map(|_| ())
        .map_err(|e| format!("strace counts the syncs from outside ({e}); .ci/run installs it"));
    turnsafe_tests::require!(strace);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let trace = dir.path().join("trace");
    const BATCHES: usize = 48;
    let input: String = (0..BATCHES)
        .map(|b| line(&format!("s{}", b % 16), &format!("b{b}"), 10) + "\n")
        .collect();
    let out = assert_cmd::Command::new("strace")
        .args(["-f", "-y", "-e", "trace=fdatasync,fsync", "-o"])
        .arg(&trace)
        .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(["append", "--home"])
        .arg(&home)
        .write_stdin(input)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let got = answers(&out.stdout);
    assert_eq!(got.len(), BATCHES);
    assert!(got.iter().all(|a| a["persisted"] == json!(true)));
    let trace = std::fs::read_to_string(&trace).unwrap();
    let wal = format!("{}-wal>", home.join("state.db").display());
    let wal_syncs = trace.lines().filter(|l| l.contains(&wal)).count();
    assert!(wal_syncs >= 1, "the WAL is synced at commit:\n{trace}");
    assert!(
        wal_syncs * 4 <= BATCHES,
        "{BATCHES} batches waiting on stdin took {wal_syncs} WAL syncs: they were not committed together"
    );
    let conn = rusqlite::Connection::open(home.join("state.db")).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n as usize, BATCHES * 10);
}
