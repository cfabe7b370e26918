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
