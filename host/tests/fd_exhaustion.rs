//! fd exhaustion with RLIMIT_NOFILE in a child `turnsafe append` (the
//! test build's hidden `--exhaust-fds-after`).
//!
//! A handle that has not opened its files yet gets CANTOPEN (errno 24) and
//! the divert fails for lack of fds too: no receipt, no claim. A handle
//! that already holds its db, WAL and shm keeps writing.
//!
//! The lowered limit is proven from outside, not from the child's own log:
//! while the child waits for input, its `/proc/<pid>/limits` says the soft
//! limit was lowered, and its `/proc/<pid>/fd` shows every descriptor
//! number below that limit taken, so no open can succeed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The soft "Max open files" of `pid`, from `/proc/<pid>/limits`.
fn soft_nofile(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-files line in {limits}"));
    line["Max open files".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// The descriptor numbers `pid` holds, from `/proc/<pid>/fd`.
fn held_fds(pid: u32) -> Vec<u64> {
    let mut fds: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    fds.sort();
    fds
}

/// Whether `pid` is blocked in read(2) on its stdin (`/proc/<pid>/syscall`:
/// syscall 0, first argument 0): between batches, its descriptors settled.
fn waiting_on_stdin(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|s| s.starts_with("0 0x0 "))
}

/// Wait until the child's soft limit is lowered below `before` and it waits
/// for its next batch, then check from outside that no descriptor is free
/// under the limit. Returns the limit.
fn assert_exhausted(child: &Child, before: u64) -> u64 {
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    let limit = loop {
        let now = soft_nofile(pid);
        if now < before && waiting_on_stdin(pid) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the child's limit stayed at {now}, or it never waited for input"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let held = held_fds(pid);
    let free: Vec<u64> = (0..limit).filter(|n| !held.contains(n)).collect();
    assert!(
        free.is_empty(),
        "RLIMIT_NOFILE {limit}, yet descriptors {free:?} are free (held: {held:?})"
    );
    limit
}

fn spawn(home: &std::path::Path, exhaust_after: &str) -> Child {
    Command::new(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args([
            "append",
            "--session",
            "s1",
            "--exhaust-fds-after",
            exhaust_after,
            "--home",
        ])
        .arg(home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The soft limit this process (and so, before it lowers its own, the child) starts with.
fn own_limit() -> u64 {
    soft_nofile(std::process::id())
}

#[test]
fn a_fresh_handle_without_fds_hands_the_batch_back_and_claims_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn(dir.path(), "0");
    assert_exhausted(&child, own_limit());
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]\n")
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "one answer for one batch: {lines:?}");
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
    let mut child = spawn(dir.path(), "1");
    let before = own_limit();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(batch("one").as_bytes()).unwrap();
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    // The child lowers its limit after the first batch, before answering
    // it: from here on it opens nothing new.
    assert_exhausted(&child, before);
    stdin
        .write_all(format!("{}{}", batch("two"), batch("three")).as_bytes())
        .unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let lines: Vec<Value> = first
        .lines()
        .chain(rest.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert_eq!(lines.len(), 3, "one answer per batch: {lines:?}");
    for v in &lines {
        assert_eq!(v["persisted"], true, "{v}");
        assert_eq!(v["attempts"], 1);
    }
}
