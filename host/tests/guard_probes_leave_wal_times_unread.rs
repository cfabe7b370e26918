//! The guard probes the WAL before every commit without reading its times.
//! On filesystems with multigrain timestamps (ext4 since Linux 6.13), a
//! `stat` that returns the times forces the next write to stamp a new
//! fine-grained mtime, so every commit dirties the WAL's inode and
//! `fdatasync` writes it out: one more synchronous write per batch.
//! Watched from outside with strace: every probe of `state.db-wal` is a
//! `statx` for identity and link count only.

#[test]
fn the_guard_never_reads_the_wal_times() {
    turnsafe_tests::require!(turnsafe_tests::strace());
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let home = dir.path().join("home");
    const BATCHES: usize = 20;
    let batches: String = (0..BATCHES)
        .map(|b| format!("[{{\"role\":\"user\",\"content\":\"batch {b}\"}}]\n"))
        .collect();
    let out = assert_cmd::Command::new("strace")
        .args(["-f", "-y", "-e", "trace=stat,lstat,fstat,newfstatat,statx", "-o"])
        .arg(&trace)
        .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(["append", "--session", "s1", "--home"])
        .arg(&home)
        .write_stdin(batches)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = std::fs::read_to_string(&trace).unwrap();
    let wal: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("state.db-wal") && !l.contains("ENOENT"))
        .collect();
    // `statx(dirfd, path, flags, MASK, {...})`: the mask asked for, not what came back.
    let asks_identity_only = |l: &str| {
        l.split_once("statx(")
            .and_then(|(_, args)| args.split(", ").nth(3))
            .is_some_and(|mask| mask.contains("STATX_INO") && !mask.contains("TIME") && !mask.contains("BASIC"))
    };
    let identity_only = wal.iter().filter(|l| asks_identity_only(l)).count();
    let reads_times: Vec<&&str> = wal.iter().filter(|l| !asks_identity_only(l)).collect();
    // The guard still probes the WAL at every commit (its path and its descriptor).
    assert!(
        identity_only >= 2 * BATCHES,
        "{identity_only} identity probes:\n{}",
        wal.join("\n")
    );
    // SQLite reads them once or twice when it opens the WAL; never per batch.
    assert!(
        reads_times.len() <= 4,
        "{} stats of the WAL read its times:\n{}",
        reads_times.len(),
        reads_times.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n")
    );
}
