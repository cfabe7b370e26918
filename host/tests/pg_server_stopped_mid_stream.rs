//! PostgreSQL is stopped for real (`pg_ctl stop -m immediate`) under a
//! running `turnsafe append --db`. The batch in flight loses its
//! connection (`unavailable`, SQLSTATE 08006): it connects again within
//! the policy's patience, and past it is diverted with a receipt; a batch
//! sent while the server is down is diverted after the opens (08001). The
//! same writer carries on, and `turnsafe replay --db` brings the diverted
//! batches in, so `show --db` has every message once, in order.
#[path = "../../tests/common/pg.rs"]
mod pg;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

fn batch(tag: &str, n: usize) -> String {
    let msgs: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("{tag} message {i}"), "uid": format!("{tag}-{i}")}))
        .collect();
    format!("{}\n", Value::Array(msgs))
}

fn turnsafe() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("turnsafe"))
}

#[test]
fn a_stopped_server_costs_no_turn() {
    let mut server = pg_or_skip!();
    let db = server.create_db("stopped");
    let url = server.url(&db);
    let home = tempfile::tempdir().unwrap();
    let stderr_path = home.path().join("append.stderr");
    let mut child = turnsafe()
        .args(["append", "--home"])
        .arg(home.path())
        .args(["--session", "s1"])
        .env("TURNSAFE_DB", &url)
        .env("TURNSAFE_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = |line: String| -> Value {
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
        let mut out = String::new();
        stdout.read_line(&mut out).unwrap();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("outcome {out:?}: {e}"))
    };

    let a = send(batch("a", 3));
    assert_eq!(a["persisted"], true, "{a}");

    server.stop_immediate();
    let b = send(batch("b", 3));
    assert_eq!(b["persisted"], false, "{b}");
    assert_eq!(b["cause"], "unavailable");
    assert_eq!(b["action"], "divert");
    assert!(b["attempts"].as_u64().unwrap() > 2, "retried within the patience: {b}");
    assert_eq!((b["committed"].as_u64(), b["diverted"].as_u64()), (Some(0), Some(3)));
    let divert_file = home.path().join("sessions/s1.jsonl");
    assert_eq!(b["receipt"]["path"], divert_file.to_string_lossy().as_ref());
    assert_eq!(b["copy"]["code"], "unavailable.diverted");

    // Still down: the next batch's opens fail, and it is diverted too.
    let c = send(batch("c", 3));
    assert_eq!(c["persisted"], false, "{c}");
    assert_eq!(c["operation"], "open");
    assert_eq!(c["cause"], "unavailable");
    assert_eq!(c["diverted"], 3);

    server.start_again().unwrap();
    let d = send(batch("d", 3));
    assert_eq!(d["persisted"], true, "the writer carries on: {d}");
    drop(stdin);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "some batches were not persisted");
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(!log.contains(pg::PASSWORD), "the password never reaches a log");
    assert!(
        log.contains(&server.shown(&db)),
        "logs name the target as user@host:port/db: {log}"
    );

    // The stored transcript has a gap where the diverted batches belong.
    let before: Vec<Value> = show(&url);
    assert_eq!(before.len(), 6);

    let replay = turnsafe()
        .args(["replay", "--json", "--home"])
        .arg(home.path())
        .args(["--db", &url])
        .output()
        .unwrap();
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let summary: Value = String::from_utf8_lossy(&replay.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "summary")
        .unwrap();
    assert_eq!(summary["data"]["replayed"], 6, "{summary}");
    assert!(!divert_file.exists(), "the divert file is settled");

    let after = show(&url);
    let uids: Vec<&str> = after.iter().map(|m| m["uid"].as_str().unwrap()).collect();
    let want: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .flat_map(|t| (0..3).map(move |i| format!("{t}-{i}")))
        .collect();
    assert_eq!(uids, want, "every message once, in the order it was sent");
    let seqs: Vec<i64> = after.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=12).collect::<Vec<_>>());

    // A second replay finds nothing to do.
    let again = turnsafe()
        .args(["replay", "--home"])
        .arg(home.path())
        .args(["--db", &url])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(show(&url).len(), 12);
}

fn show(url: &str) -> Vec<Value> {
    let out = turnsafe()
        .args(["show", "--session", "s1", "--json"])
        .env("TURNSAFE_DB", url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect();
    // The last line says the history is whole: PostgreSQL has no captures.
    let (end, rows) = lines.split_last().expect("an end line");
    assert_eq!(end["type"], "end");
    assert_eq!(end["data"]["complete"], true);
    rows.iter().map(|v| v["data"].clone()).collect()
}
