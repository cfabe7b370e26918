//! The edges of the pending-capture rule, from outside: a capture that
//! holds nothing the database lacks stops nothing, and `recover --dismiss`
//! waits only for the process that made the capture, not for any other
//! process that holds the home's files.
mod live;
use std::path::{Path, PathBuf};

use live::{Live, bin};
use serde_json::Value;

fn turnsafe(args: &[&str]) -> (i32, String, String) {
    let out = assert_cmd::Command::new(bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A live writer of s1 commits a turn; the WAL and shm are deleted under
/// it; its next batch captures the retired generation. With `checkpoint`,
/// another connection first moves every committed row into the main file.
fn capture_under(home: &Path, checkpoint: bool) -> (Live, PathBuf) {
    // A short lease, so a writer after it may take the turn soon.
    let mut live = Live::start_with(home, "s1", &["--lease-ttl", "1"]);
    let first = live.send(r#"[{"role":"user","content":"one","uid":"m1"}]"#);
    assert_eq!(first["persisted"], true, "{first}");
    if checkpoint {
        let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
        let (busy, _, _): (i64, i64, i64) = c
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(busy, 0, "the checkpoint ran to the end");
    }
    std::fs::remove_file(home.join("state.db-wal")).unwrap();
    std::fs::remove_file(home.join("state.db-shm")).unwrap();
    let second = live.send(r#"[{"role":"user","content":"two","uid":"m2"}]"#);
    assert_eq!(second["cause"], "deleted_wal", "{second}");
    let capture = PathBuf::from(second["capture"]["path"].as_str().expect("a capture was made"));
    (live, capture)
}

#[test]
fn a_capture_that_holds_nothing_new_stops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let (live, capture) = capture_under(dir.path(), true);
    let m: Value = serde_json::from_slice(&std::fs::read(capture.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        m["missing_rows"],
        serde_json::json!({}),
        "nothing the database lacks: {m}"
    );
    assert!(!capture.join("SETTLED").exists(), "the capture itself stays unsettled");
    // Its writer gone and its turn lease run out, a new writer of s1
    // commits: the capture holds no row of it.
    live.kill();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut next = Live::start(dir.path(), "s1");
    let v = next.send(r#"[{"role":"user","content":"three","uid":"m3"}]"#);
    assert_eq!(v["persisted"], true, "{v}");
    assert_eq!(next.finish(), 0);
    let (code, stdout, stderr) = turnsafe(&["show", "--home", home, "--session", "s1", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let end: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(end["data"]["complete"], true, "{end}");
}

#[test]
fn a_capture_that_holds_rows_stops_a_new_writer() {
    // Control: with rows the database lacks, the same new writer diverts.
    let dir = tempfile::tempdir().unwrap();
    let (live, _capture) = capture_under(dir.path(), false);
    live.kill();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut next = Live::start(dir.path(), "s1");
    let v = next.send(r#"[{"role":"user","content":"three","uid":"m3"}]"#);
    assert_eq!(
        (&v["persisted"], &v["cause"]),
        (&Value::Bool(false), &Value::from("deleted_wal")),
        "{v}"
    );
    assert_eq!(next.finish(), 3);
}

#[test]
fn dismiss_waits_for_the_capture_maker_only() {
    let dir = tempfile::tempdir().unwrap();
    let (maker, capture) = capture_under(dir.path(), false);
    let cap = capture.to_str().unwrap();
    // Another process holds the home's state.db open all along.
    let mut other = Live::start(dir.path(), "s2");
    let v = other.send(r#"[{"role":"user","content":"elsewhere","uid":"o1"}]"#);
    assert_eq!(v["persisted"], true, "{v}");
    let (code, _, stderr) = turnsafe(&["recover", "--source", cap, "--dismiss"]);
    assert_eq!(code, 5, "refused while its maker lives: {stderr}");
    assert!(!capture.join("SETTLED").exists());
    maker.kill();
    let (code, stdout, stderr) = turnsafe(&["recover", "--source", cap, "--dismiss", "--json"]);
    assert_eq!(
        code, 0,
        "another holder of the home does not block a dismiss: {stdout}{stderr}"
    );
    assert!(capture.join("SETTLED").is_file(), "the capture is settled");
    // The other writer holds the home's files still, and goes on.
    let v = other.send(r#"[{"role":"user","content":"still here","uid":"o2"}]"#);
    assert_eq!(v["persisted"], true, "{v}");
    assert_eq!(other.finish(), 0);
}
