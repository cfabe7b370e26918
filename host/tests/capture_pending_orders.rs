//! A capture of a retired generation is pending until it is settled, and
//! no order of replay, recover and install loses a line.
//!
//! Each test makes a real capture the way production does: a live
//! `turnsafe append` commits a batch, its WAL and shm are deleted under
//! it, and the next batches are diverted while the retired generation is
//! captured. The first batch then exists only in the capture; the later
//! ones only in `sessions/s1.jsonl`.
mod live;
use std::path::{Path, PathBuf};

use live::{Live, bin};
use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn turnsafe(args: &[&str]) -> Run {
    let out = std::process::Command::new(bin()).args(args).output().unwrap();
    Run {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// JSON Lines output, by envelope type.
fn of_type(stdout: &str, kind: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|v| v["type"] == kind)
        .map(|v| v["data"].clone())
        .collect()
}

/// A live writer commits m1, m2; its sidecars are deleted; m3 and m4 are
/// diverted and the generation holding m1, m2 is captured. The writer is
/// still running.
fn captured(home: &Path) -> (Live, PathBuf) {
    let mut live = Live::start(home, "s1");
    let first =
        live.send(r#"[{"role":"user","content":"one","uid":"m1"},{"role":"assistant","content":"two","uid":"m2"}]"#);
    assert_eq!(first["persisted"], true, "{first}");
    std::fs::remove_file(home.join("state.db-wal")).unwrap();
    std::fs::remove_file(home.join("state.db-shm")).unwrap();
    let second = live.send(r#"[{"role":"user","content":"three","uid":"m3"}]"#);
    assert_eq!(second["cause"], "deleted_wal", "{second}");
    assert_eq!(second["diverted"], 1);
    let third = live.send(r#"[{"role":"assistant","content":"four","uid":"m4"}]"#);
    assert_eq!(third["diverted"], 1, "sticky: {third}");
    let capture = PathBuf::from(second["capture"]["path"].as_str().expect("a capture was made"));
    assert!(capture.is_dir());
    assert!(!capture.join("SETTLED").exists());
    (live, capture)
}

fn capture_then_close(home: &Path) -> PathBuf {
    let (live, capture) = captured(home);
    assert_eq!(live.finish(), 3, "two batches were not persisted");
    capture
}

/// (uid, seq) of the stored transcript, in `show` order: a whole one.
fn transcript(home: &str) -> Vec<(String, i64)> {
    let r = turnsafe(&["show", "--home", home, "--session", "s1", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(of_type(&r.stdout, "end")[0]["complete"], true, "{}", r.stdout);
    rows_of(&r)
}

fn rows_of(r: &Run) -> Vec<(String, i64)> {
    of_type(&r.stdout, "message")
        .into_iter()
        .map(|m| (m["uid"].as_str().unwrap().to_string(), m["seq"].as_i64().unwrap()))
        .collect()
}

fn every_message_once_in_order(home: &str) {
    let expected: Vec<(String, i64)> = [("m1", 1), ("m2", 2), ("m3", 3), ("m4", 4)]
        .iter()
        .map(|(u, s)| (u.to_string(), *s))
        .collect();
    assert_eq!(transcript(home), expected);
}

fn settled_marker(capture: &Path) -> Value {
    let bytes = std::fs::read(capture.join("SETTLED")).expect("SETTLED written");
    serde_json::from_slice(&bytes).expect("SETTLED is JSON")
}

fn install(capture: &Path, dir: &Path, json: bool) -> Run {
    let output = dir.join("recovered.db");
    let mut args = vec![
        "recover",
        "--source",
        capture.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--install",
        "--home",
        dir.to_str().unwrap(),
    ];
    if json {
        args.push("--json");
    }
    turnsafe(&args)
}

/// Operator text with the temporary home and the capture's dated name
/// replaced, for a snapshot.
fn redact(text: &str, home: &str, capture: &Path) -> String {
    let name = capture.file_name().unwrap().to_str().unwrap();
    text.replace(home, "[HOME]")
        .replace(name, "state.db.retired-[UTC]-[PID]")
}

/// The doctor finding about captures, as the operator reads it.
fn capture_finding(stdout: &str) -> Value {
    of_type(stdout, "finding")
        .into_iter()
        .find(|f| f["kind"] == "captures")
        .expect("a captures finding")
}

fn doctor(home: &str) -> (i32, String, Value) {
    let r = turnsafe(&["doctor", "--home", home, "--json"]);
    let facts = of_type(&r.stdout, "facts").pop().expect("facts");
    (r.code, r.stdout, facts)
}

#[test]
fn capture_then_install_then_replay_keeps_every_message_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let capture = capture_then_close(dir.path());
    let name = capture.file_name().unwrap().to_str().unwrap().to_string();

    // Pending: doctor says so as an error.
    let (code, out, facts) = doctor(home);
    assert_eq!(code, 6, "{out}");
    assert!(
        out.contains(&format!("{name} is not settled")) && out.contains("\"severity\":\"error\""),
        "{out}"
    );
    assert_eq!(facts["pending_captures"], serde_json::json!([name]));
    let finding = redact(&capture_finding(&out).to_string(), home, &capture);
    turnsafe_tests::snapshot_settings().bind(|| {
        insta::assert_json_snapshot!(
            "operator__doctor_capture_pending",
            serde_json::from_str::<Value>(&finding).unwrap()
        );
    });

    let r = install(&capture, dir.path(), false);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // The old state.db never got m3, m4 (they were diverted), nor m1, m2
    // (they were in the deleted WAL): nothing to carry over.
    assert!(r.stdout.contains("carried_over: 0"), "{}", r.stdout);
    let marker = settled_marker(&capture);
    assert_eq!(marker["how"], "installed");
    assert_eq!(marker["carried_over"], 0);
    assert!(
        marker["settled_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{marker}"
    );
    assert!(
        r.stdout
            .contains(&format!("settled: {}", capture.join("SETTLED").display()))
    );

    let r = turnsafe(&["replay", "--home", home, "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(of_type(&r.stdout, "summary")[0]["replayed"], 2, "{}", r.stdout);
    every_message_once_in_order(home);

    let (code, out, facts) = doctor(home);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("{name} is settled: installed")), "{out}");
    let finding = capture_finding(&out);
    assert_eq!(finding["severity"], "ok");
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .ends_with(", 0 row(s) carried over"),
        "{finding}"
    );
    assert_eq!(facts["pending_captures"], serde_json::json!([]));
    assert_eq!(facts["settled_captures"][0]["how"], "installed");
}

#[test]
fn capture_then_forced_replay_then_install_carries_the_replayed_lines_over() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let capture = capture_then_close(dir.path());
    let divert_file = dir.path().join("sessions/s1.jsonl");
    let diverted = std::fs::read(&divert_file).unwrap();

    // Refused, naming the capture; nothing moved.
    let r = turnsafe(&["replay", "--home", home, "--json"]);
    assert_eq!(r.code, 5, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(capture.to_str().unwrap()), "{}", r.stderr);
    assert!(r.stderr.contains("--force"), "{}", r.stderr);
    turnsafe_tests::snapshot_settings().bind(|| {
        insta::assert_snapshot!(
            "operator__replay_refused_capture_pending",
            redact(&r.stderr, home, &capture)
        );
    });
    assert_eq!(std::fs::read(&divert_file).unwrap(), diverted);
    assert!(!dir.path().join("sessions/ledger.jsonl").exists());

    // Forced: m3, m4 land in a database that lacks m1, m2.
    let r = turnsafe(&["replay", "--home", home, "--force", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(of_type(&r.stdout, "summary")[0]["replayed"], 2);
    // The hole replay leaves, and `show` says so: the capture still holds
    // m1 and m2, so the history is not complete (exit 7).
    let r = turnsafe(&["show", "--home", home, "--session", "s1", "--json"]);
    assert_eq!(r.code, 7, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        rows_of(&r),
        [("m3".to_string(), 3), ("m4".to_string(), 4)],
        "the hole replay leaves"
    );
    let end = of_type(&r.stdout, "end").pop().expect("an end line");
    assert_eq!(end["complete"], false);
    assert_eq!(end["pending_captures"][0]["path"], capture.to_str().unwrap());
    assert_eq!(end["pending_captures"][0]["cause"], "deleted_wal");
    assert_eq!(end["pending_captures"][0]["rows"], 2);
    assert!(r.stderr.contains("is not complete"), "{}", r.stderr);

    // Install carries them over into the database rebuilt from the capture.
    let r = install(&capture, dir.path(), true);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let installed = of_type(&r.stdout, "installed").pop().expect("installed");
    assert_eq!(installed["carried_over"], 2, "{installed}");
    assert_eq!(installed["carried_over_by_session"]["s1"], 2);
    assert_eq!(installed["settled"], capture.join("SETTLED").to_str().unwrap());
    let report: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("recovered.db.report.json")).unwrap()).unwrap();
    assert_eq!(report["carried_over"], 2);
    let marker = settled_marker(&capture);
    assert_eq!(
        (marker["how"].as_str(), marker["carried_over"].as_u64()),
        (Some("installed"), Some(2))
    );
    every_message_once_in_order(home);
    // The carried rows are searchable like the rebuilt ones.
    let db = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
    for word in ["one", "three", "four"] {
        let n: i64 = db
            .query_row(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1",
                [word],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 1, "{word}");
    }
    drop(db);

    // Settled: replay no longer refuses, and has nothing left to do.
    let r = turnsafe(&["replay", "--home", home, "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(of_type(&r.stdout, "summary")[0]["files"], 0);
    every_message_once_in_order(home);
}

#[test]
fn capture_then_dismiss_then_replay_imports_the_diverted_lines() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let (live, capture) = captured(dir.path());
    let source = capture.to_str().unwrap();

    // The writer that made it is alive and may hold frames it lacks:
    // dismissing is refused, naming it.
    let r = turnsafe(&["recover", "--source", source, "--dismiss"]);
    assert_eq!(r.code, 5, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("refusing to dismiss")
            && r.stderr
                .contains(&format!("pid {}, which made it, is still running", live.pid())),
        "{}",
        r.stderr
    );
    assert!(!capture.join("SETTLED").exists());
    assert_eq!(live.finish(), 3);

    let r = turnsafe(&["recover", "--source", source, "--dismiss", "--json"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let dismissed = of_type(&r.stdout, "dismissed").pop().expect("dismissed");
    assert_eq!(dismissed["already_settled"], false);
    let marker = settled_marker(&capture);
    assert_eq!(
        (marker["how"].as_str(), marker["carried_over"].as_u64()),
        (Some("dismissed"), Some(0))
    );

    let r = turnsafe(&["replay", "--home", home, "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(of_type(&r.stdout, "summary")[0]["replayed"], 2, "{}", r.stdout);
    assert!(!dir.path().join("sessions/s1.jsonl").exists());
    // m1, m2 were in the dismissed capture: the operator let them go.
    assert_eq!(transcript(home), [("m3".to_string(), 3), ("m4".to_string(), 4)]);

    let name = capture.file_name().unwrap().to_str().unwrap();
    let (code, out, facts) = doctor(home);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("{name} is settled: dismissed")), "{out}");
    assert_eq!(facts["settled_captures"][0]["name"], name);

    // Dismissing again leaves the marker as it was.
    let before = std::fs::read(capture.join("SETTLED")).unwrap();
    let r = turnsafe(&["recover", "--source", source, "--dismiss"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("already settled"), "{}", r.stdout);
    assert_eq!(std::fs::read(capture.join("SETTLED")).unwrap(), before);
}

#[test]
fn dismiss_needs_a_capture_folder() {
    let dir = tempfile::tempdir().unwrap();
    let r = turnsafe(&["recover", "--source", dir.path().to_str().unwrap(), "--dismiss"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("not a capture folder"), "{}", r.stderr);
    assert!(!dir.path().join("SETTLED").exists());
}

#[test]
fn help_explains_settling_the_refusal_and_foreign_files() {
    let help = |cmd: &str| turnsafe(&[cmd, "--help"]).stdout;
    let recover = help("recover");
    for needle in ["--dismiss", "SETTLED", "carried_over", "exit 5"] {
        assert!(recover.contains(needle), "recover --help lacks {needle}: {recover}");
    }
    let replay = help("replay");
    for needle in ["SETTLED", "refuses", "--force", "foreign_files"] {
        assert!(replay.contains(needle), "replay --help lacks {needle}: {replay}");
    }
    let doctor = help("doctor");
    for needle in ["SETTLED", "foreign_files", "pending_divert_files"] {
        assert!(doctor.contains(needle), "doctor --help lacks {needle}: {doctor}");
    }
}
