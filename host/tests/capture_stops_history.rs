//! A pending capture stops the history of the sessions it holds.
//!
//! A live `turnsafe append` commits s1's first turn; the WAL and shm are
//! deleted under it; its next batch is diverted and the retired generation
//! (holding that turn) is captured. From then on, until the capture is
//! settled, no writer in any process commits s1 on top of the shortened
//! history, and no read presents s1's transcript as complete. s2, which
//! the capture does not hold, goes on as usual.
mod live;
use std::path::{Path, PathBuf};

use live::{Live, bin};
use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn turnsafe(args: &[&str], stdin: &str) -> Run {
    let out = assert_cmd::Command::new(bin())
        .args(args)
        .write_stdin(stdin.to_string())
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// s1's first turn committed, then captured out from under its writer,
/// which is still running (sticky).
fn captured(home: &Path) -> (Live, PathBuf) {
    let mut live = Live::start(home, "s1");
    let first =
        live.send(r#"[{"role":"user","content":"one","uid":"m1"},{"role":"assistant","content":"two","uid":"m2"}]"#);
    assert_eq!(first["persisted"], true, "{first}");
    std::fs::remove_file(home.join("state.db-wal")).unwrap();
    std::fs::remove_file(home.join("state.db-shm")).unwrap();
    let second = live.send(r#"[{"role":"user","content":"three","uid":"m3"}]"#);
    assert_eq!(second["cause"], "deleted_wal", "{second}");
    let capture = PathBuf::from(second["capture"]["path"].as_str().expect("a capture was made"));
    (live, capture)
}

#[test]
fn the_manifest_says_what_the_capture_is_and_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (live, capture) = captured(dir.path());
    let m: Value = serde_json::from_slice(&std::fs::read(capture.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["cause"], "deleted_wal", "{m}");
    assert_eq!(m["evidence"], serde_json::json!(["deleted_wal_generation"]));
    // The two rows of s1 the database now at the path lacks.
    assert_eq!(m["missing_rows"], serde_json::json!({"s1": 2}), "{m}");
    assert_eq!(m["pid"], live.pid());
    assert!(m["pid_start"].is_u64(), "{m}");
    live.finish();
}

#[test]
fn every_writer_diverts_the_held_session_and_no_read_calls_it_complete() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let (live, capture) = captured(dir.path());
    let cap = capture.to_str().unwrap();

    // A fresh process: s1 goes to its divert file with the capture's cause.
    let r = turnsafe(
        &["append", "--home", home, "--session", "s1"],
        "[{\"role\":\"user\",\"content\":\"four\",\"uid\":\"m4\"}]\n",
    );
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
    let out: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(
        (out["persisted"].as_bool(), out["cause"].as_str()),
        (Some(false), Some("deleted_wal"))
    );
    assert_eq!(out["diverted"], 1, "{out}");
    assert_eq!(out["attempts"], 0, "the database was not touched: {out}");
    assert_eq!(out["pending_capture"]["path"], cap, "{out}");
    let copy = out["copy"].to_string();
    assert!(
        copy.contains(cap) && copy.contains("--dismiss") && copy.contains("--install"),
        "{copy}"
    );
    let replay_at = copy.find("turnsafe replay").expect("replay is named");
    assert!(
        copy.find("turnsafe recover").unwrap() < replay_at,
        "settle first: {copy}"
    );

    // The many-session writer: s1 diverted, s2 committed, in one run.
    let r = turnsafe(
        &["append", "--home", home],
        "{\"session\":\"s1\",\"messages\":[{\"role\":\"user\",\"content\":\"five\",\"uid\":\"m5\"}]}\n\
         {\"session\":\"s2\",\"messages\":[{\"role\":\"user\",\"content\":\"other\",\"uid\":\"o1\"}]}\n",
    );
    let outs = lines(&r.stdout);
    assert_eq!(outs.len(), 2, "{}", r.stdout);
    assert_eq!(
        (outs[0]["session"].as_str(), outs[0]["cause"].as_str()),
        (Some("s1"), Some("deleted_wal"))
    );
    assert_eq!(
        (outs[1]["session"].as_str(), outs[1]["persisted"].as_bool()),
        (Some("s2"), Some(true))
    );

    // s1 has no row beyond what the capture lacks: nothing was committed.
    let ro =
        rusqlite::Connection::open_with_flags(dir.path().join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let s1: i64 = ro
        .query_row("SELECT count(*) FROM messages WHERE session_id = 's1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(s1, 0);
    drop(ro);

    // Reads: s1 incomplete (exit 7, the end line, stderr), s2 whole.
    let r = turnsafe(&["show", "--home", home, "--session", "s1", "--json"], "");
    assert_eq!(r.code, 7, "{}{}", r.stdout, r.stderr);
    let end = lines(&r.stdout).pop().unwrap();
    assert_eq!(end["type"], "end");
    assert_eq!(end["data"]["complete"], false);
    assert_eq!(
        end["data"]["pending_captures"],
        serde_json::json!([{"path": cap, "cause": "deleted_wal", "rows": 2}])
    );
    assert!(
        r.stderr.contains("not complete") && r.stderr.contains(cap),
        "{}",
        r.stderr
    );
    let r = turnsafe(&["show", "--home", home, "--session", "s1"], "");
    assert_eq!(r.code, 7);
    assert!(r.stderr.contains("not complete"), "{}", r.stderr);
    let r = turnsafe(&["show", "--home", home, "--session", "s2", "--json"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(lines(&r.stdout).pop().unwrap()["data"]["complete"], true);
    let r = turnsafe(&["search", "--home", home, "other", "--json"], "");
    assert_eq!(r.code, 7, "a search over every session is not complete: {}", r.stderr);
    assert_eq!(lines(&r.stdout).pop().unwrap()["data"]["complete"], false);
    let r = turnsafe(&["search", "--home", home, "other", "--session", "s2", "--json"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);

    // Settling needs the maker gone; then s1 is written again.
    assert_eq!(turnsafe(&["recover", "--source", cap, "--dismiss"], "").code, 5);
    live.finish();
    let r = turnsafe(&["recover", "--source", cap, "--dismiss"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = turnsafe(
        &["append", "--home", home, "--session", "s1"],
        "[{\"role\":\"user\",\"content\":\"six\",\"uid\":\"m6\"}]\n",
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = turnsafe(&["show", "--home", home, "--session", "s1", "--json"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
}

/// A writer that only diverts holds no file of the database, so an
/// operator can install over the home while it runs; `--install` from the
/// capture's own `state.db` settles that capture.
#[test]
fn a_diverting_writer_holds_nothing_and_install_from_the_file_settles() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let (live, capture) = captured(dir.path());
    live.finish();
    let mut waiting = Live::start(dir.path(), "s1");
    let v = waiting.send(r#"[{"role":"user","content":"four","uid":"m4"}]"#);
    assert_eq!(v["cause"], "deleted_wal", "{v}");
    let fds = std::fs::read_dir(format!("/proc/{}/fd", waiting.pid())).unwrap();
    for fd in fds.flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        assert!(
            !target.to_string_lossy().contains("state.db"),
            "a writer that only diverts holds {}",
            target.display()
        );
    }
    let source = capture.join("state.db");
    let output = dir.path().join("rebuilt.db");
    let r = turnsafe(
        &[
            "recover",
            "--source",
            source.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--install",
            "--home",
            home,
            "--json",
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(capture.join("SETTLED").is_file(), "the capture is settled");
    // The same writer now commits: the capture stops nothing any more.
    let v = waiting.send(r#"[{"role":"user","content":"five","uid":"m5"}]"#);
    assert_eq!(v["persisted"], true, "{v}");
    assert_eq!(waiting.finish(), 3);
    let r = turnsafe(&["replay", "--home", home, "--json"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = turnsafe(&["show", "--home", home, "--session", "s1", "--json"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let uids: Vec<String> = lines(&r.stdout)
        .iter()
        .filter(|v| v["type"] == "message")
        .map(|v| v["data"]["uid"].as_str().unwrap().to_string())
        .collect();
    for u in ["m1", "m2", "m3", "m4", "m5"] {
        assert_eq!(uids.iter().filter(|x| *x == u).count(), 1, "{u} once: {uids:?}");
    }
}

/// A capture whose cause is not `deleted_wal` says so everywhere: a
/// corrupt database closed by its sticky writer.
#[test]
fn doctor_takes_a_captures_cause_from_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let cap = dir.path().join("state.db.retired-20261201T000000Z-999999");
    std::fs::create_dir(&cap).unwrap();
    std::fs::write(
        cap.join("manifest.json"),
        serde_json::json!({"format": 1, "cause": "corrupt", "evidence": [], "pid": 999_999,
                           "missing_rows": {"s1": 1}, "files": []})
        .to_string(),
    )
    .unwrap();
    let r = turnsafe(&["doctor", "--home", home, "--json"], "");
    let finding = lines(&r.stdout)
        .into_iter()
        .find(|v| v["type"] == "finding" && v["data"]["kind"] == "captures")
        .expect("a captures finding");
    assert_eq!(finding["data"]["cause"], "corrupt", "{finding}");
    assert!(!finding.to_string().contains("deleted_wal"), "{finding}");
    let r = turnsafe(&["replay", "--home", home], "");
    assert_eq!(r.code, 5);
    assert!(r.stderr.contains("(cause corrupt)"), "{}", r.stderr);
}
