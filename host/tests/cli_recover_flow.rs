//! The whole operator flow through the CLI: delete the sidecars between
//! two batches, close, recover from the capture, install, replay. `show`
//! then has every batch exactly once, in order.
mod live;
use live::{Live, bin};
use serde_json::Value;

fn run(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn capture_recover_install_replay_show() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let mut live = Live::start(dir.path(), "s1");
    assert_eq!(
        live.send(r#"[{"role":"user","content":"one","uid":"m1"},{"role":"assistant","content":"two","uid":"m2"}]"#)["persisted"],
        true
    );
    std::fs::remove_file(dir.path().join("state.db-wal")).unwrap();
    std::fs::remove_file(dir.path().join("state.db-shm")).unwrap();
    let second = live.send(r#"[{"role":"user","content":"three","uid":"m3"}]"#);
    assert_eq!(second["cause"], "deleted_wal");
    let third = live.send(r#"[{"role":"assistant","content":"four","uid":"m4"}]"#);
    assert_eq!(third["diverted"], 1, "sticky");
    assert_eq!(live.finish(), 3);
    let capture = second["capture"]["path"].as_str().unwrap().to_string();

    let (code, out) = run(&["recover", "--source", &capture, "--inspect-only", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["type"], "inspect");
    assert_eq!(v["data"]["readable"]["messages"], 2);

    let output = dir.path().join("recovered.db");
    let (code, out) = run(&[
        "recover",
        "--source",
        &capture,
        "--output",
        output.to_str().unwrap(),
        "--install",
        "--home",
        home,
        "--json",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"type\":\"installed\""));
    let mut report = output.as_os_str().to_owned();
    report.push(".report.json");
    assert!(std::path::Path::new(&report).exists());

    let (code, out) = run(&["replay", "--home", home, "--json"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&["replay", "--home", home, "--json"]);
    assert_eq!(code, 0);
    assert!(out.contains("\"files\":0"), "a second replay has nothing to do: {out}");

    let (code, out) = run(&["show", "--home", home, "--session", "s1", "--json"]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.last().unwrap()["data"]["complete"], true, "{out}");
    let uids: Vec<String> = lines
        .iter()
        .filter(|v| v["type"] == "message")
        .map(|v| v["data"]["uid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(uids, ["m1", "m2", "m3", "m4"]);
}

#[test]
fn doctor_reports_a_healthy_home_and_each_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    let mut live = Live::start(dir.path(), "s1");
    assert_eq!(live.send(r#"[{"role":"user","content":"one"}]"#)["persisted"], true);
    // Healthy, with a live holder (this quick_check runs on a copy).
    let (code, out) = run(&["doctor", "--home", home, "--json"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("held open by pid"), "{out}");
    assert!(out.contains("quick_check: ok"));
    // A holder writing to a deleted WAL.
    std::fs::remove_file(dir.path().join("state.db-wal")).unwrap();
    let (code, out) = run(&["doctor", "--home", home]);
    assert_eq!(code, 6, "{out}");
    assert!(out.contains("deleted state.db file or sidecar"), "{out}");
    live.finish();
    // A degraded search index, repaired.
    let c = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
    c.execute("UPDATE state_meta SET value = '0' WHERE key = 'fts_enabled'", [])
        .unwrap();
    drop(c);
    let (_, out) = run(&["doctor", "--home", home]);
    assert!(out.contains("search index degraded"), "{out}");
    let (_, out) = run(&["doctor", "--home", home, "--repair-fts"]);
    assert!(out.contains("search index rebuilt"), "{out}");
    // Corruption.
    let db = dir.path().join("state.db");
    let mut bytes = std::fs::read(&db).unwrap();
    let n = bytes.len();
    bytes[4096..n.min(4096 * 3)].fill(0xA5);
    std::fs::write(&db, &bytes).unwrap();
    let (code, out) = run(&["doctor", "--home", home]);
    assert_eq!(code, 6, "{out}");
    assert!(out.contains("[error] integrity"), "{out}");
}
