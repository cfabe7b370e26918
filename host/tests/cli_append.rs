//! The `turnsafe append` and `turnsafe show` streaming contracts.

use serde_json::Value;

mod live;
use live::{Live, bin};

fn check_sums(v: &Value, n: u64) {
    let sum = v["committed"].as_u64().unwrap() + v["diverted"].as_u64().unwrap() + v["handed_back"].as_u64().unwrap();
    assert_eq!(sum, n, "{v}");
    if v["persisted"] == false {
        assert_eq!(
            v["error"],
            format!("session_persistence_failed:{}", v["cause"].as_str().unwrap())
        );
    }
}

#[test]
fn first_try_commits_print_nulls_and_exit_zero() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("new-home");
    let out = assert_cmd::Command::new(bin())
        .args(["append", "--home"])
        .arg(&home)
        .args(["--session", "s1"])
        .write_stdin("[{\"role\":\"user\",\"content\":\"hi\",\"uid\":\"u1\"},{\"role\":\"assistant\",\"content\":\"yo\"}]\n\n[{\"role\":\"user\",\"content\":\"more\",\"lang\":\"en\"}]\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for key in [
        "persisted",
        "cause",
        "action",
        "attempts",
        "committed",
        "diverted",
        "handed_back",
        "receipt",
        "copy",
        "error",
        "uids",
        "minted_uids",
        "durable",
    ] {
        assert!(lines[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(lines[0]["persisted"], true);
    assert!(lines[0]["cause"].is_null() && lines[0]["action"].is_null() && lines[0]["copy"].is_null());
    assert!(lines[0]["receipt"].is_null());
    assert_eq!(lines[0]["attempts"], 1);
    assert_eq!(lines[0]["minted_uids"].as_array().unwrap().len(), 1);
    assert_eq!(lines[0]["uids"][0], "u1");
    check_sums(&lines[0], 2);
    check_sums(&lines[1], 1);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&home).unwrap().permissions().mode() & 0o777, 0o700);

    let show = assert_cmd::Command::new(bin())
        .args(["show", "--home"])
        .arg(&home)
        .args(["--session", "s1", "--json"])
        .output()
        .unwrap();
    assert_eq!(show.status.code(), Some(0));
    let msgs: Vec<Value> = String::from_utf8(show.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The rows, then the end line: the history is whole.
    assert_eq!(msgs.len(), 4);
    assert_eq!(
        msgs[3],
        serde_json::json!({"type": "end", "data": {"complete": true, "pending_captures": [], "forked_from": null}})
    );
    let msgs = &msgs[..3];
    assert!(msgs.iter().all(|m| m["type"] == "message"));
    // The uid and seq beside the message; the message as written, without
    // the line format's `uid`.
    assert_eq!(msgs[0]["data"]["uid"], "u1");
    assert_eq!(msgs[0]["data"]["seq"], 1);
    assert_eq!(
        msgs[0]["data"]["message"],
        serde_json::json!({"role": "user", "content": "hi"})
    );
    assert_eq!(msgs[2]["data"]["message"]["lang"], "en", "other fields are kept");
}

#[test]
fn a_line_that_is_not_a_batch_is_answered_and_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::new(bin())
        .args(["append", "--home"])
        .arg(dir.path())
        .args(["--session", "s1"])
        .write_stdin("{\"role\":\"user\"}\n[{\"role\":\"user\",\"content\":\"ok\"}]\n[{\"content\":\"x\",\"uid\":5}]\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["line"], 1);
    assert!(lines[0]["error"].is_string());
    assert_eq!(lines[1]["persisted"], true);
    assert_eq!(lines[2]["line"], 3);
}

#[test]
fn an_unopenable_store_answers_every_batch_and_reopens_at_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    std::fs::create_dir(home.join("state.db")).unwrap();
    let mut live = Live::start(home, "s1");
    let first = live.send("[{\"role\":\"user\",\"content\":\"one\",\"uid\":\"m1\"},{\"role\":\"user\",\"content\":\"two\",\"uid\":\"m2\"}]");
    assert_eq!(first["persisted"], false);
    assert_eq!(first["cause"], "disk");
    assert_eq!(first["operation"], "open");
    assert_eq!(first["action"], "divert");
    assert_eq!(first["diverted"], 2);
    check_sums(&first, 2);
    let path = first["receipt"]["path"].as_str().unwrap().to_string();
    assert!(first["copy"]["body"].as_str().unwrap().contains(&path));
    // Fix the store between batches: the next batch opens it and commits.
    std::fs::remove_dir(home.join("state.db")).unwrap();
    let second = live.send("[{\"role\":\"user\",\"content\":\"three\",\"uid\":\"m3\"}]");
    assert_eq!(second["persisted"], true, "{second}");
    assert_eq!(live.finish(), 3, "one batch was not persisted");
}

#[test]
fn an_invalid_session_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::new(bin())
        .args(["append", "--home"])
        .arg(dir.path())
        .args(["--session", "../escape"])
        .write_stdin("[]\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(!dir.path().join("state.db").exists());
}

#[test]
fn messages_of_any_shape_round_trip_through_append_show_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let items = serde_json::json!([
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"uid": "a field of the item", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ]);
    let line = serde_json::json!({"items": items, "uids": ["c1-call", null, "u3"]});
    let out = assert_cmd::Command::new(bin())
        .args(["append", "--home"])
        .arg(&home)
        .args(["--session", "s1"])
        .write_stdin(format!("{line}\n"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["uids"][0], "c1-call");
    assert_eq!(outcome["uids"][2], "u3");
    let show = assert_cmd::Command::new(bin())
        .args(["show", "--home"])
        .arg(&home)
        .args(["--session", "s1", "--json"])
        .output()
        .unwrap();
    let data: Vec<Value> = String::from_utf8(show.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "message")
        .map(|v| v["data"].clone())
        .collect();
    assert_eq!(
        data.iter().map(|d| d["message"].clone()).collect::<Vec<_>>(),
        items.as_array().unwrap().clone()
    );
    assert_eq!(data[0]["uid"], "c1-call");
    assert_eq!(data[2]["uid"], "u3");
    assert_eq!(
        data.iter().map(|d| d.as_object().unwrap().len()).collect::<Vec<_>>(),
        [3, 3, 3],
        "uid, seq and message, nothing else"
    );
    let text = assert_cmd::Command::new(bin())
        .args(["show", "--home"])
        .arg(&home)
        .args(["--session", "s1"])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.lines().next().unwrap().contains("function_call"), "{text}");
    assert!(
        text.lines().nth(2).unwrap().contains("user") && text.contains(" hi"),
        "{text}"
    );
}

/// Every outcome says `durable`: true under `--synchronous full` (the
/// default), false under `--synchronous normal`, whose COMMIT returns
/// before its sync.
#[test]
fn append_prints_durable_as_the_store_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| -> Vec<Value> {
        let out = assert_cmd::Command::new(bin())
            .args(["append", "--session", "s1", "--home"])
            .arg(dir.path())
            .args(extra)
            .write_stdin("[{\"role\":\"user\",\"content\":\"hi\"}]\n")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let full = run(&[]);
    assert_eq!(full.len(), 1);
    assert_eq!(full[0]["durable"], true, "{}", full[0]);
    let normal = run(&["--synchronous", "normal"]);
    assert_eq!(normal.len(), 1);
    assert_eq!(
        (&normal[0]["persisted"], &normal[0]["durable"]),
        (&Value::Bool(true), &Value::Bool(false)),
        "{}",
        normal[0]
    );
}
