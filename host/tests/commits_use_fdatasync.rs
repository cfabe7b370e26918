//! Commits sync the WAL with fdatasync(2), never fsync(2): the bundled
//! SQLite is built with `-DHAVE_FDATASYNC=1` (`LIBSQLITE3_FLAGS` in
//! `.cargo/config.toml`, which only builds run inside this workspace read).
//! Watched from outside with strace, on the binary itself. (Folder fsyncs
//! are turnsafe's own, and fsync(2) by design.)

#[test]
fn commits_call_fdatasync_not_fsync() {
    turnsafe_tests::require!(turnsafe_tests::strace());
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let home = dir.path().join("home");
    let batches: String = (0..3)
        .map(|b| {
            format!("[{{\"role\":\"user\",\"content\":\"batch {b}\"}},{{\"role\":\"assistant\",\"content\":\"ok\"}}]\n")
        })
        .collect();
    let out = assert_cmd::Command::new("strace")
        .args(["-f", "-y", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&trace)
        .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(["append", "--session", "s1", "--home"])
        .arg(&home)
        .write_stdin(batches)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = std::fs::read_to_string(&trace).unwrap();
    let wal = format!("{}-wal>", home.join("state.db").display());
    let wal_datasyncs = trace
        .lines()
        .filter(|l| l.contains("fdatasync(") && l.contains(&wal))
        .count();
    assert!(
        wal_datasyncs >= 3,
        "one fdatasync of the WAL per commit at least:\n{trace}"
    );
    // turnsafe's own fsyncs of folders (the home's entry in its parent, a
    // divert's path) are fsync(2) by design; SQLite's, of the database's
    // files, must all be fdatasync(2).
    let fsyncs: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains(" fsync(") && l.contains("state.db"))
        .collect();
    assert!(
        fsyncs.is_empty(),
        "SQLite called fsync: it was built without HAVE_FDATASYNC (LIBSQLITE3_FLAGS)\n{}",
        fsyncs.join("\n")
    );
}
