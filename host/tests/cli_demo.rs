//! `turnsafe demo` runs every unprivileged failure and verifies its recount.

#[test]
fn the_demo_verifies_its_recount() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("demo-home");
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["demo", "--keep"])
        .arg(&keep)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("verified: every message is accounted for exactly once"),
        "{text}"
    );
    for failure in [
        "WAL write",
        "fsync",
        "SQLITE_FULL",
        "fd exhaustion",
        "lock held",
        "FTS5",
        "divert blocked",
    ] {
        assert!(text.contains(failure), "missing {failure}: {text}");
    }
    assert!(text.contains("disk.divert_failed") && text.contains("disk.diverted") && text.contains("locked.persisted"));
    assert!(keep.join("state.db").is_file());
}
