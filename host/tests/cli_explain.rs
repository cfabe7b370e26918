//! The `turnsafe explain` contract.

use assert_cmd::Command;
use serde_json::Value;

fn explain(args: &[&str]) -> std::process::Output {
    Command::cargo_bin("turnsafe")
        .unwrap()
        .arg("explain")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_copy_in_an_envelope_names_the_receipt() {
    let out = explain(&[
        "--cause",
        "disk",
        "--outcome",
        "diverted",
        "--receipt-path",
        "/h/sessions/s1.jsonl",
        "--session",
        "s1",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["type"], "copy");
    assert_eq!(v["data"]["code"], "disk.diverted");
    assert_eq!(v["data"]["cause"], "disk");
    assert!(
        v["data"]["body"]
            .as_str()
            .unwrap()
            .contains("A copy was kept at /h/sessions/s1.jsonl")
    );
}

#[test]
fn a_pair_the_table_cannot_produce_is_a_usage_error() {
    for (cause, outcome) in [
        ("turn_lease", "diverted"),
        ("disk", "persisted"),
        ("locked", "handed_back"),
    ] {
        let out = explain(&["--cause", cause, "--outcome", outcome, "--receipt-path", "/x"]);
        assert_eq!(out.status.code(), Some(2), "{cause}/{outcome}");
        assert!(out.stdout.is_empty());
        assert!(String::from_utf8_lossy(&out.stderr).contains("never produces"));
    }
    let out = explain(&["--cause", "bogus", "--outcome", "persisted"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_failed_divert_names_operation_and_errno_not_the_path() {
    let out = explain(&[
        "--cause",
        "disk_full",
        "--outcome",
        "divert_failed",
        "--divert-error",
        "open /h/sessions/s1.jsonl: No space left on device (os error 28)",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("/h/sessions"), "{text}");
    assert!(!text.to_lowercase().contains("a copy was kept"), "{text}");
    assert!(text.contains("open: no space left on device (ENOSPC)"), "{text}");
}

#[test]
fn text_output_is_readable() {
    let out = explain(&["--cause", "locked", "--outcome", "persisted"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Messages saved after a retry\n"), "{text}");
    assert!(text.trim_end().ends_with("[locked.persisted]"), "{text}");
}

#[test]
fn both_engines_agree() {
    let args = [
        "--cause",
        "corrupt",
        "--outcome",
        "divert_failed",
        "--divert-error",
        "mkdir: EACCES",
        "--json",
    ];
    let n = Command::cargo_bin("turnsafe")
        .unwrap()
        .arg("explain")
        .args(args)
        .args(["--engine", "native"])
        .output()
        .unwrap();
    let w = Command::cargo_bin("turnsafe")
        .unwrap()
        .arg("explain")
        .args(args)
        .args(["--engine", "wasm"])
        .output()
        .unwrap();
    assert_eq!(n.stdout, w.stdout);
}

#[test]
fn a_capture_is_claimed_only_with_capture_path() {
    let base = [
        "--cause",
        "deleted_wal",
        "--outcome",
        "diverted",
        "--receipt-path",
        "/h/sessions/s1.jsonl",
        "--json",
    ];
    let with = explain(&[&base[..], &["--capture-path", "/h/state.db.retired-x"]].concat());
    assert_eq!(with.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&with.stdout).unwrap();
    assert!(
        v["data"]["body"]
            .as_str()
            .unwrap()
            .contains("captured at /h/state.db.retired-x")
    );
    assert_eq!(v["data"]["details"]["capture_path"], "/h/state.db.retired-x");

    let failed = explain(
        &[
            &base[..],
            &["--capture-error", "mkdir /h/state.db.retired-x: [Errno 2] No such file"],
        ]
        .concat(),
    );
    assert_eq!(failed.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&failed.stdout).unwrap();
    let text = v["data"].to_string();
    assert!(!text.contains("was captured") && !text.contains("retired-x"), "{text}");
    assert_eq!(v["data"]["details"]["capture_operation"], "mkdir");
    assert_eq!(
        v["data"]["details"]["capture_errno"],
        "no such file or directory (ENOENT)"
    );

    let neither = explain(&base);
    let v: Value = serde_json::from_slice(&neither.stdout).unwrap();
    assert!(!v["data"].to_string().contains("was captured"));

    let both = explain(&[&base[..], &["--capture-path", "/p", "--capture-error", "mkdir: EIO"]].concat());
    assert_eq!(
        both.status.code(),
        Some(2),
        "a capture cannot both exist and have failed"
    );
}

#[test]
fn a_divert_residue_says_lines_may_remain() {
    let out = explain(&[
        "--cause",
        "disk",
        "--outcome",
        "divert_failed",
        "--divert-error",
        "fsync: EIO",
        "--divert-residue",
        "/h/sessions/s1.jsonl",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let body = v["data"]["body"].as_str().unwrap();
    assert!(body.contains("may remain in the session's divert file"), "{body}");
    assert!(
        !body.contains("not stored anywhere") && !body.contains("s1.jsonl"),
        "{body}"
    );
}
