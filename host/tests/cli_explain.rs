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

/// A real divert under a fresh home: its receipt, as JSON in a file.
fn real_receipt(home: &std::path::Path) -> (turnsafe_host::divert::Receipt, std::path::PathBuf) {
    let m = turnsafe_host::message::Message::new("user", "hello").with_uid("u1");
    let line = turnsafe_host::divert::DivertLine {
        uid: "u1",
        seq: Some(1),
        message: &m,
    };
    let receipt = turnsafe_host::divert::divert(
        &home.join("sessions"),
        "s1",
        "b1",
        turnsafe_policy::Cause::Disk,
        &[line],
    )
    .expect("a real divert");
    let file = home.join("receipt.json");
    std::fs::write(&file, serde_json::to_vec(&receipt).unwrap()).unwrap();
    (receipt, file)
}

fn explain_with_stdin(args: &[&str], stdin: &[u8]) -> std::process::Output {
    Command::cargo_bin("turnsafe")
        .unwrap()
        .arg("explain")
        .args(args)
        .write_stdin(stdin.to_vec())
        .output()
        .unwrap()
}

#[test]
fn json_copy_in_an_envelope_names_the_receipt() {
    let home = tempfile::tempdir().unwrap();
    let (receipt, file) = real_receipt(home.path());
    let out = explain(&[
        "--cause",
        "disk",
        "--outcome",
        "diverted",
        "--receipt-json",
        file.to_str().unwrap(),
        "--session",
        "s1",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["type"], "copy");
    assert_eq!(v["data"]["code"], "disk.diverted");
    assert_eq!(v["data"]["cause"], "disk");
    let kept = format!("A copy was kept at {}", receipt.path);
    assert!(v["data"]["body"].as_str().unwrap().contains(&kept), "{v}");

    // The same receipt on stdin, and inside an `append` outcome line.
    let outcome = serde_json::json!({"persisted": false, "receipt": receipt});
    for stdin in [
        serde_json::to_vec(&receipt).unwrap(),
        serde_json::to_vec(&outcome).unwrap(),
    ] {
        let out = explain_with_stdin(
            &["--cause", "disk", "--outcome", "diverted", "--receipt-json", "-"],
            &stdin,
        );
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains(&kept));
    }
}

#[test]
fn a_bare_path_claims_nothing() {
    // The flag of 0.2.0 is gone: a path is no receipt.
    let out = explain(&[
        "--cause",
        "disk",
        "--outcome",
        "diverted",
        "--receipt-path",
        "/nonexistent/x.jsonl",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    // A path where a receipt should be, or a receipt missing fields.
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("path.json", serde_json::json!("/nonexistent/x.jsonl")),
        ("bare.json", serde_json::json!({"path": "/nonexistent/x.jsonl"})),
    ] {
        let f = dir.path().join(name);
        std::fs::write(&f, body.to_string()).unwrap();
        let out = explain(&[
            "--cause",
            "disk",
            "--outcome",
            "diverted",
            "--receipt-json",
            f.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(out.stdout.is_empty(), "{name}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("A copy was kept"));
    }
}

#[test]
fn a_receipt_that_does_not_hold_on_disk_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let (receipt, file) = real_receipt(home.path());
    // A whole receipt for a file that is not there.
    let mut gone = receipt.clone();
    gone.path = "/nonexistent/x.jsonl".into();
    // A whole receipt whose bytes were changed under it.
    let mut other = receipt.clone();
    other.sha256 = "00".repeat(32);
    for (what, r) in [("missing file", gone), ("other bytes", other)] {
        std::fs::write(&file, serde_json::to_vec(&r).unwrap()).unwrap();
        let out = explain(&[
            "--cause",
            "disk",
            "--outcome",
            "diverted",
            "--receipt-json",
            file.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{what}");
        assert!(out.stdout.is_empty(), "{what}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("the receipt does not hold"), "{what}: {err}");
    }
}

#[test]
fn a_pair_the_table_cannot_produce_is_a_usage_error() {
    for (cause, outcome) in [
        ("turn_lease", "diverted"),
        ("disk", "persisted"),
        ("locked", "handed_back"),
    ] {
        let out = explain(&["--cause", cause, "--outcome", outcome]);
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

/// A capture folder as a writer makes one: a file and a manifest naming
/// its size and sha256.
fn real_capture(home: &std::path::Path) -> std::path::PathBuf {
    use sha2::Digest;
    let dir = home.join("state.db.retired-20261201T000000Z-1");
    std::fs::create_dir(&dir).unwrap();
    let data = b"SQLite format 3\0 and the rest";
    std::fs::write(dir.join("state.db"), data).unwrap();
    let manifest = serde_json::json!({"format": 1, "cause": "deleted_wal", "files": [
        {"name": "state.db", "size": data.len(), "sha256": hex::encode(sha2::Sha256::digest(data))}]});
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    dir
}

#[test]
fn a_capture_is_claimed_only_with_capture_path() {
    let home = tempfile::tempdir().unwrap();
    let (_, receipt) = real_receipt(home.path());
    let capture = real_capture(home.path());
    let capture = capture.to_str().unwrap();
    let base = [
        "--cause",
        "deleted_wal",
        "--outcome",
        "diverted",
        "--receipt-json",
        receipt.to_str().unwrap(),
        "--json",
    ];
    let with = explain(&[&base[..], &["--capture-path", capture]].concat());
    assert_eq!(with.status.code(), Some(0), "{}", String::from_utf8_lossy(&with.stderr));
    let v: Value = serde_json::from_slice(&with.stdout).unwrap();
    assert!(
        v["data"]["body"]
            .as_str()
            .unwrap()
            .contains(&format!("captured at {capture}"))
    );
    assert_eq!(v["data"]["details"]["capture_path"], capture);

    // A path that holds no capture, or one whose files do not match its
    // manifest, claims nothing.
    std::fs::write(
        home.path().join("state.db.retired-20261201T000000Z-1/state.db"),
        b"other",
    )
    .unwrap();
    for bad in ["/h/state.db.retired-x", capture] {
        let out = explain(&[&base[..], &["--capture-path", bad]].concat());
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(out.stdout.is_empty(), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("the capture does not hold"),
            "{bad}"
        );
    }

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
