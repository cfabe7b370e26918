//! fd exhaustion with RLIMIT_NOFILE in a child `turnsafe append`.
//!
//! A handle that has not opened its files yet gets CANTOPEN (errno 24) and
//! the divert fails for lack of fds too: no receipt, no claim. A handle
//! that already holds its db, WAL and shm keeps writing.

use serde_json::Value;

fn append(home: &std::path::Path, exhaust_after: &str, input: &str) -> (Vec<Value>, i32, String) {
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args([
            "append",
            "--session",
            "s1",
            "--exhaust-fds-after",
            exhaust_after,
            "--home",
        ])
        .arg(home)
        .env("TURNSAFE_LOG", "info")
        .write_stdin(input)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{stderr}");
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (lines, out.status.code().unwrap(), stderr)
}

#[test]
fn a_fresh_handle_without_fds_hands_the_batch_back_and_claims_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, code, stderr) = append(
        dir.path(),
        "0",
        "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]\n",
    );
    assert_eq!(code, 3);
    assert!(
        stderr.contains("RLIMIT_NOFILE lowered"),
        "the limit was never lowered: {stderr}"
    );
    let v = &lines[0];
    assert_eq!(v["persisted"], false);
    assert_eq!(v["cause"], "disk");
    assert_eq!(v["action"], "divert");
    assert_eq!(
        (
            v["committed"].as_u64(),
            v["diverted"].as_u64(),
            v["handed_back"].as_u64()
        ),
        (Some(0), Some(0), Some(2))
    );
    assert!(v["receipt"].is_null());
    assert_eq!(v["divert_error"]["errno"], 24);
    assert_eq!(v["copy"]["code"], "disk.divert_failed");
    let copy = v["copy"].to_string();
    assert!(copy.contains("too many open files"), "{copy}");
    assert!(
        !copy.to_lowercase().contains("a copy was kept") && !copy.contains(".jsonl"),
        "{copy}"
    );
    let diverted: Vec<_> = std::fs::read_dir(dir.path().join("sessions"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(diverted.is_empty(), "no divert file exists");
}

#[test]
fn a_handle_that_holds_its_files_keeps_writing() {
    let dir = tempfile::tempdir().unwrap();
    let batch = |t: &str| format!("[{{\"role\":\"user\",\"content\":\"{t}\"}}]\n");
    let input = format!("{}{}{}", batch("one"), batch("two"), batch("three"));
    let (lines, code, stderr) = append(dir.path(), "1", &input);
    assert_eq!(code, 0, "{lines:?}");
    // Otherwise this would pass without any exhaustion at all.
    assert!(
        stderr.contains("RLIMIT_NOFILE lowered"),
        "the limit was never lowered: {stderr}"
    );
    for v in &lines {
        assert_eq!(v["persisted"], true, "{v}");
        assert_eq!(v["attempts"], 1);
    }
}
