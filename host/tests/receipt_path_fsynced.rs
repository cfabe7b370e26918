//! A receipt's whole path is durable, whoever created it: watched from
//! outside with strace.
//!
//! A divert that failed at its folder fsync leaves the file behind (an
//! empty `sessions/s1.jsonl`, made by a call that never fsynced
//! `sessions/`). The next divert into that existing file must still fsync
//! `sessions/` and the home before it hands out a receipt, or a power cut
//! can take the entry and the copy with it. `replay` creating
//! `sessions/ledger.jsonl` must fsync `sessions/` before a ledger line
//! counts.
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn strace() -> Result<(), String> {
    Command::new("strace")
        .arg("-V")
        .output()
        .map(|_| ())
        .map_err(|e| format!("strace watches the fsyncs from outside ({e}); .ci/run installs it"))
}

/// Run `turnsafe args` under strace; the trace of its fsyncs, with paths.
fn traced(dir: &Path, args: &[&str], stdin: &str) -> (i32, String, String) {
    let trace = dir.join("trace");
    let out = assert_cmd::Command::new("strace")
        .args(["-f", "-y", "-e", "trace=fsync,fdatasync,openat", "-o"])
        .arg(&trace)
        .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(args)
        .write_stdin(stdin.to_string())
        .output()
        .unwrap();
    let t = std::fs::read_to_string(&trace).unwrap();
    std::fs::remove_file(&trace).unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        t,
    )
}

/// Successful fsyncs of exactly `path` (a folder: `fsync(N</path>) = 0`).
fn synced(trace: &str, path: &Path) -> usize {
    let want = format!("<{}>) = 0", path.display());
    trace
        .lines()
        .filter(|l| l.contains("fsync(") && l.contains(&want))
        .count()
}

#[test]
fn a_divert_into_a_file_it_did_not_create_fsyncs_every_folder_on_its_path() {
    turnsafe_tests::require!(strace());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // A database that cannot be opened: a directory where state.db goes.
    std::fs::create_dir_all(home.join("state.db")).unwrap();
    // What an earlier, failed divert left: the folder and an empty file.
    std::fs::create_dir(home.join("sessions")).unwrap();
    std::fs::write(home.join("sessions/s1.jsonl"), b"").unwrap();

    let (code, stdout, trace) = traced(
        dir.path(),
        &["append", "--home", home.to_str().unwrap(), "--session", "s1"],
        "[{\"role\":\"user\",\"content\":\"kept\",\"uid\":\"u1\"}]\n",
    );
    assert_eq!(code, 3, "{stdout}");
    let out: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(out["receipt"].is_object(), "{out}");
    let file = home.join("sessions/s1.jsonl");
    assert!(synced(&trace, &file) >= 1, "the file is fsynced:\n{trace}");
    assert!(
        synced(&trace, &home.join("sessions")) >= 1,
        "sessions/ is fsynced although this divert did not create the file:\n{trace}"
    );
    assert!(
        synced(&trace, &home) >= 1,
        "the home is fsynced (the entry of sessions/):\n{trace}"
    );
}

#[test]
fn replay_fsyncs_the_folder_of_the_ledger_it_creates() {
    turnsafe_tests::require!(strace());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join("state.db")).unwrap();
    let r = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "s1", "--home"])
        .arg(&home)
        .write_stdin("[{\"role\":\"user\",\"content\":\"kept\",\"uid\":\"u1\"}]\n")
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(3));
    std::fs::remove_dir(home.join("state.db")).unwrap();
    let ledger = home.join("sessions/ledger.jsonl");
    assert!(!ledger.exists());
    let (code, stdout, trace) = traced(dir.path(), &["replay", "--home", home.to_str().unwrap(), "--json"], "");
    assert_eq!(code, 0, "{stdout}");
    assert!(ledger.is_file());
    // The ledger's lines are fsynced, and between its creation and its
    // first line's fsync, the folder holding its name is too.
    let lines: Vec<&str> = trace.lines().collect();
    let created = lines
        .iter()
        .position(|l| l.contains("openat(") && l.contains("ledger.jsonl") && l.contains("O_CREAT"))
        .unwrap_or_else(|| panic!("the ledger is created:\n{trace}"));
    let first_ledger_sync = lines
        .iter()
        .position(|l| l.contains(&format!("<{}>) = 0", ledger.display())))
        .unwrap_or_else(|| panic!("the ledger is fsynced:\n{trace}"));
    let sessions = format!("<{}>) = 0", home.join("sessions").display());
    assert!(
        lines[created..first_ledger_sync].iter().any(|l| l.contains(&sessions)),
        "sessions/ is fsynced after the ledger is created and before its first line counts:\n{trace}"
    );
}
