//! A user's mistake is not an internal error: every subcommand given a
//! missing home, a missing file, a wrong flag value or an input it cannot
//! read answers with the exit code `turnsafe --help` lists for it (2,
//! usage; 65 for unreadable input lines) and a message naming what was
//! wrong, never 1 ("internal error").

use std::path::Path;

mod live;
use live::bin;

/// Runs `turnsafe args` with empty stdin; returns (exit code, stderr).
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = assert_cmd::Command::new(bin())
        .args(args)
        .write_stdin("")
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The exit code `--help` lists for a usage mistake.
const USAGE: i32 = 2;

#[test]
fn help_lists_the_codes_this_test_expects() {
    let out = assert_cmd::Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("1 internal error"), "{help}");
    assert!(help.contains("2 usage"), "{help}");
    assert!(help.contains("65 unreadable input lines"), "{help}");
}

fn expect(args: &[&str], code: i32, names: &str) {
    let (got, stderr) = run(args);
    assert_eq!(
        got,
        Some(code),
        "turnsafe {}: exit {got:?}, stderr: {stderr}",
        args.join(" ")
    );
    assert!(
        stderr.contains(names),
        "turnsafe {}: the message does not name {names:?}: {stderr}",
        args.join(" ")
    );
}

#[test]
fn a_missing_home_is_a_usage_mistake_for_every_command_that_reads_one() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-home");
    let m = missing.to_str().unwrap();
    let db = format!("{m}/state.db");
    for args in [
        vec!["show", "--home", m, "--session", "s1"],
        vec!["show", "--home", m, "--thread", "t1"],
        vec!["pop", "--home", m, "--session", "s1"],
        vec!["clear", "--home", m, "--session", "s1"],
        vec!["restore", "--home", m, "--session", "s1", "--reason", "pop"],
        vec!["fork", "--home", m, "--session", "s1", "--at", "1", "--to", "s2"],
        vec!["prune", "--home", m, "--older-than", "1d"],
        vec!["search", "hello", "--home", m],
    ] {
        expect(&args, USAGE, &db);
    }
}

#[test]
fn a_missing_file_is_a_usage_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent");
    let m = missing.to_str().unwrap();
    let db = format!("{m}/x.db");
    expect(&["recover", "--source", &db, "--inspect-only"], USAGE, &db);
    let out = format!("{m}/new.db");
    expect(&["recover", "--source", &db, "--output", &out], USAGE, &db);
    expect(&["import", "hermes", "--source", m, "--home", m], USAGE, m);
    let receipt = format!("{m}/receipt.json");
    expect(
        &[
            "explain",
            "--cause",
            "disk",
            "--outcome",
            "diverted",
            "--receipt-json",
            &receipt,
        ],
        USAGE,
        &receipt,
    );
    let wasm = format!("{m}/folder/policy.wasm");
    expect(&["component", "--out", &wasm], USAGE, &wasm);
}

#[test]
fn a_wrong_flag_value_is_a_usage_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().to_str().unwrap();
    for (args, names) in [
        (
            vec!["append", "--home", h, "--session", "s1", "--synchronous", "nope"],
            "--synchronous",
        ),
        (vec!["append", "--home", h, "--session", "../x"], "session"),
        (
            vec!["append", "--home", h, "--session", "s1", "--lease-ttl", "soon"],
            "--lease-ttl",
        ),
        (vec!["prune", "--home", h, "--older-than", "banana"], "--older-than"),
        (
            vec!["fork", "--home", h, "--session", "s1", "--at", "x", "--to", "s2"],
            "--at",
        ),
        (vec!["search", "q", "--home", h, "--limit", "many"], "--limit"),
        (
            vec!["explain", "--cause", "no_such_cause", "--outcome", "diverted"],
            "no_such_cause",
        ),
        (vec!["classify", "--engine", "steam"], "--engine"),
        (vec!["capture", "--pid", "minus-one", "--home", h], "--pid"),
        (vec!["demo", "--keep", "--bogus"], "--bogus"),
    ] {
        expect(&args, USAGE, names);
    }
}

#[test]
fn an_unreadable_input_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    // A folder where a file is expected: unreadable as one, whoever runs this.
    let folder = dir.path().join("a-folder");
    std::fs::create_dir(&folder).unwrap();
    let f = folder.to_str().unwrap();
    expect(
        &[
            "explain",
            "--cause",
            "disk",
            "--outcome",
            "diverted",
            "--receipt-json",
            f,
        ],
        USAGE,
        f,
    );
    // A home whose state.db is a folder.
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join("state.db")).unwrap();
    let h = home.to_str().unwrap();
    let db = format!("{h}/state.db");
    for args in [
        vec!["show", "--home", h, "--session", "s1"],
        vec!["search", "q", "--home", h],
    ] {
        expect(&args, USAGE, &db);
    }
    // Input lines that are not JSON: 65, with the line named.
    let out = assert_cmd::Command::new(bin())
        .arg("classify")
        .write_stdin("{not json\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"line\":1"));
    assert!(!Path::new(&db).is_file());
}
