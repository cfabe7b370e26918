//! The binary users build (`cargo build --release --bin turnsafe`, what the
//! README's `cargo run --release -- demo` makes) carries no test hook: a
//! stray `TURNSAFE_CRASH_AT`, `TURNSAFE_JITTER_US` or `TURNSAFE_IO_FAULT` in
//! production neither kills the writer, nor delays it, nor fails its
//! divert, and the hidden testing flags of `turnsafe append` do not exist.
//!
//! `scripts/test-all` builds that binary beside the test build and names it
//! in `TURNSAFE_RELEASE_BIN`. Without it this test is a counted skip
//! (a failure under `CI=true`), never a silent pass. Pointed at a binary
//! built with `--features test-hooks`, it fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use turnsafe_host::failpoint::{EDIT_POINTS, GROUP_POINTS, IO_POINTS, POINTS};

/// Longer than any of these runs takes without hooks; far shorter than a
/// run that sleeps `JITTER` at its points.
const LIMIT: Duration = Duration::from_secs(20);
/// Up to 120 s at each crash point, when a binary obeys the variable.
const JITTER: &str = "120000000";

fn release_bin() -> Result<PathBuf, String> {
    let Some(path) = std::env::var_os("TURNSAFE_RELEASE_BIN").filter(|p| !p.is_empty()) else {
        return Err("TURNSAFE_RELEASE_BIN is not set (scripts/test-all builds the release binary and sets it)".into());
    };
    let path = PathBuf::from(path);
    // Named but absent is a broken harness, not a missing capability.
    assert!(
        path.is_file(),
        "TURNSAFE_RELEASE_BIN names {}, which is not a file",
        path.display()
    );
    Ok(path)
}

/// Run `bin args` with `env` and `input`, killed (and failed) past [`LIMIT`].
fn run(bin: &Path, args: &[&str], env: &[(&str, &str)], input: &str) -> Output {
    run_within(LIMIT, bin, args, env, input)
}

fn run_within(limit: Duration, bin: &Path, args: &[&str], env: &[(&str, &str)], input: &str) -> Output {
    let mut child = Command::new(bin)
        .args(args)
        .env_remove("TURNSAFE_CRASH_AT")
        .env_remove("TURNSAFE_JITTER_US")
        .env_remove("TURNSAFE_IO_FAULT")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    // A binary that refuses its arguments exits before reading stdin: the
    // pipe is then closed under the write, which is the refusal, not a
    // failure of the harness.
    if let Err(e) = child.stdin.take().unwrap().write_all(input.as_bytes()) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "write to {}: {e}",
            bin.display()
        );
    }
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} with {env:?} still running after {limit:?}: a hook delayed it");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn not_killed(out: &Output, what: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        None,
        "{what}: the process was killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `append`'s answers, one JSON object a line.
fn answers(out: &Output, what: &str) -> Vec<Value> {
    not_killed(out, what);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {l:?}: {e}")))
        .collect()
}

fn batch(tag: &str) -> String {
    format!(
        "[{{\"uid\":\"{tag}-1\",\"role\":\"user\",\"content\":\"a\"}},{{\"uid\":\"{tag}-2\",\"role\":\"assistant\",\"content\":\"b\"}}]\n"
    )
}

fn stored_uids(db: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut s = c.prepare("SELECT uid FROM messages ORDER BY seq").unwrap();
    s.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

/// One append that commits (two batches, so a group commit too), one that
/// diverts (a folder where `state.db` should be) and then its replay, all
/// with `env` set: each must end as it does with no variable at all.
fn commits_diverts_and_replays(bin: &Path, env: &[(&str, &str)]) {
    let what = format!("{env:?}");
    let dir = tempfile::tempdir().unwrap();

    let home = dir.path().join("commits");
    let home_arg = home.to_str().unwrap();
    let out = run(
        bin,
        &["append", "--session", "s1", "--home", home_arg],
        env,
        &format!("{}{}", batch("c1"), batch("c2")),
    );
    let lines = answers(&out, &what);
    assert_eq!(lines.len(), 2, "{what}: {lines:?}");
    for v in &lines {
        assert_eq!(v["persisted"], true, "{what}: {v}");
        assert_eq!(v["committed"], 2, "{what}: {v}");
    }
    assert_eq!(out.status.code(), Some(0), "{what}");
    assert_eq!(
        stored_uids(&home.join("state.db")),
        ["c1-1", "c1-2", "c2-1", "c2-2"],
        "{what}"
    );

    let home = dir.path().join("diverts");
    let home_arg = home.to_str().unwrap();
    std::fs::create_dir_all(home.join("state.db")).unwrap();
    let out = run(
        bin,
        &["append", "--session", "s1", "--home", home_arg],
        env,
        &batch("d1"),
    );
    let lines = answers(&out, &what);
    assert_eq!(lines.len(), 1, "{what}: {lines:?}");
    let v = &lines[0];
    assert_eq!(out.status.code(), Some(3), "{what}: {v}");
    assert_eq!(
        (&v["cause"], &v["diverted"], &v["handed_back"]),
        (&"disk".into(), &2.into(), &0.into()),
        "{what}: {v}"
    );
    assert_eq!(v["copy"]["code"], "disk.diverted", "{what}: {v}");
    let receipt = &v["receipt"];
    let file = std::fs::read(
        receipt["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no receipt: {v}")),
    )
    .unwrap();
    let (at, len) = (
        receipt["offset"].as_u64().unwrap() as usize,
        receipt["length"].as_u64().unwrap() as usize,
    );
    let range = file
        .get(at..at + len)
        .unwrap_or_else(|| panic!("{what}: the receipt's range is not in the file"));
    use sha2::Digest;
    assert_eq!(hex::encode(sha2::Sha256::digest(range)), receipt["sha256"], "{what}");

    std::fs::remove_dir(home.join("state.db")).unwrap();
    let out = run(bin, &["replay", "--home", home_arg], env, "");
    not_killed(&out, &what);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: replay: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stored_uids(&home.join("state.db")), ["d1-1", "d1-2"], "{what}");
}

#[test]
fn no_crash_point_fires_in_the_release_binary() {
    let bin = turnsafe_tests::require!(release_bin());
    let mut points: Vec<&str> = POINTS.iter().chain(GROUP_POINTS).copied().collect();
    points.sort();
    points.dedup();
    for point in points {
        commits_diverts_and_replays(&bin, &[("TURNSAFE_CRASH_AT", &format!("{point}:1"))]);
    }
}

/// A history edit (pop, clear, restore, fork, prune) with a crash point of
/// the edits armed runs to its end.
#[test]
fn no_edit_crash_point_fires_in_the_release_binary() {
    let bin = turnsafe_tests::require!(release_bin());
    for point in EDIT_POINTS {
        let env = [("TURNSAFE_CRASH_AT", format!("{point}:1"))];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let what = format!("{env:?}");
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        let out = run(
            &bin,
            &["append", "--session", "s1", "--home", home],
            &env,
            &format!("{}{}", batch("e1"), batch("e2")),
        );
        assert_eq!(out.status.code(), Some(0), "{what}");
        for args in [
            &["pop", "--session", "s1"][..],
            &["restore", "--session", "s1", "--reason", "pop"],
            &["fork", "--session", "s1", "--at", "3", "--to", "s2"],
            &["clear", "--session", "s1"],
            &["prune", "--keep-last", "1"],
        ] {
            let mut full = args.to_vec();
            full.extend(["--home", home]);
            let out = run(&bin, &full, &env, "");
            not_killed(&out, &format!("{what} {args:?}"));
            assert_eq!(
                out.status.code(),
                Some(0),
                "{what} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // s1 cleared; s2, forked at seq 3, keeps its last row.
        assert_eq!(stored_uids(&dir.path().join("state.db")).len(), 1, "{what}");
    }
}

#[test]
fn no_jitter_delays_the_release_binary() {
    let bin = turnsafe_tests::require!(release_bin());
    let started = Instant::now();
    commits_diverts_and_replays(&bin, &[("TURNSAFE_JITTER_US", JITTER)]);
    assert!(started.elapsed() < LIMIT, "{:?}", started.elapsed());
}

#[test]
fn no_injected_io_error_fails_the_release_binarys_divert() {
    let bin = turnsafe_tests::require!(release_bin());
    commits_diverts_and_replays(&bin, &[("TURNSAFE_IO_FAULT", &IO_POINTS.join(","))]);
    for point in IO_POINTS {
        commits_diverts_and_replays(&bin, &[("TURNSAFE_IO_FAULT", &format!("{point}=28"))]);
    }
}

#[test]
fn the_hidden_testing_flags_do_not_exist_in_the_release_binary() {
    let bin = turnsafe_tests::require!(release_bin());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    for flag in [
        ["--exhaust-fds-after", "0"],
        ["--fd-headroom", "1"],
        ["--fault-wal-write-every", "1"],
        ["--fault-wal-sync-after", "1"],
    ] {
        let out = run(
            &bin,
            &["append", "--session", "s1", "--home", home, flag[0], flag[1]],
            &[],
            &batch("f"),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag:?}: {stderr}");
        assert!(stderr.contains("unexpected argument"), "{flag:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{flag:?}: nothing was appended");
    }
    assert!(!dir.path().join("state.db").exists(), "no flag reached the store");
}

/// The README's demo, in the binary users build: its failures are its own
/// (the fault VFS in process, a child's RLIMIT_NOFILE set before exec),
/// with no testing flag, and its recount adds up.
#[test]
fn the_demo_runs_in_the_release_binary() {
    let bin = turnsafe_tests::require!(release_bin());
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("demo");
    let out = run_within(
        Duration::from_secs(300),
        &bin,
        &["demo", "--keep", keep.to_str().unwrap()],
        &[],
        "",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fd_row = text
        .lines()
        .find(|l| l.starts_with("fd exhaustion in a child"))
        .unwrap_or_else(|| panic!("no fd exhaustion row:\n{text}"));
    let cells: Vec<&str> = fd_row.split_whitespace().collect();
    assert!(
        cells.windows(5).any(|w| w == ["disk", "divert", "0", "0", "4"]),
        "the child's batch is handed back whole: {fd_row}"
    );
    assert!(
        text.contains("verified: every message is accounted for exactly once"),
        "{text}"
    );
}
