//! `turnsafe capture --pid`: the retired generation a live writer still
//! holds, copied out through `/proc/<pid>/fd/` before anything stops it.
mod live;
use live::{Live, bin};
use serde_json::Value;

fn capture(pid: u32, home: &std::path::Path) -> (i32, String, String) {
    let out = std::process::Command::new(bin())
        .args(["capture", "--pid", &pid.to_string(), "--json", "--home"])
        .arg(home)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn captures(home: &std::path::Path) -> usize {
    std::fs::read_dir(home)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("state.db.retired-"))
        .count()
}

#[test]
fn the_frames_a_live_writer_holds_are_kept_before_it_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let mut live = Live::start(home, "s1");
    let first =
        live.send(r#"[{"role":"user","content":"one","uid":"m1"},{"role":"assistant","content":"two","uid":"m2"}]"#);
    assert_eq!(first["persisted"], true);

    // Nothing retired yet: refused loudly, nothing written.
    let (code, stdout, stderr) = capture(live.pid(), home);
    assert_eq!(code, 1, "{stdout}");
    assert!(stderr.contains("no retired generation"), "{stderr}");
    assert_eq!(captures(home), 0);

    // The sidecars vanish; the writer has not noticed yet. doctor names it
    // and the command that keeps its frames.
    std::fs::remove_file(home.join("state.db-wal")).unwrap();
    std::fs::remove_file(home.join("state.db-shm")).unwrap();
    let doctor = std::process::Command::new(bin())
        .args(["doctor", "--json", "--home"])
        .arg(home)
        .output()
        .unwrap();
    let doctor = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.contains(&format!(
            "turnsafe capture --pid {} --home {}",
            live.pid(),
            home.display()
        )),
        "{doctor}"
    );

    let (code, stdout, stderr) = capture(live.pid(), home);
    assert_eq!(code, 0, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["type"], "capture");
    let path = std::path::PathBuf::from(v["data"]["path"].as_str().unwrap());
    let names: Vec<&str> = v["data"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"state.db-wal"), "{v}");
    let manifest: Value = serde_json::from_slice(&std::fs::read(path.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["cause"], "deleted_wal");
    assert_eq!(manifest["pid"], live.pid());
    assert_eq!(manifest["missing_rows"], serde_json::json!({"s1": 2}), "{manifest}");
    // Each file is what its manifest says.
    use sha2::Digest;
    for f in manifest["files"].as_array().unwrap() {
        let data = std::fs::read(path.join(f["name"].as_str().unwrap())).unwrap();
        assert_eq!(f["sha256"], hex::encode(sha2::Sha256::digest(&data)));
    }
    // The writer is stopped; at its close it captures what it holds too,
    // into a folder of its own (never the one `capture --pid` made, even
    // within the same second).
    assert_eq!(live.finish(), 0);
    assert_eq!(captures(home), 2, "the writer's own capture at close was made");
    let copy = tempfile::tempdir().unwrap();
    for n in ["state.db", "state.db-wal"] {
        std::fs::copy(path.join(n), copy.path().join(n)).unwrap();
    }
    let c = rusqlite::Connection::open(copy.path().join("state.db")).unwrap();
    let uids: Vec<String> = c
        .prepare("SELECT uid FROM messages WHERE session_id = 's1' ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(uids, ["m1", "m2"]);
}

#[test]
fn a_process_that_is_not_there_or_holds_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // This test's own process holds nothing of the home.
    let sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let (code, _, stderr) = capture(sleeper.id(), dir.path());
    assert_eq!(code, 1);
    assert!(stderr.contains("holds no state.db"), "{stderr}");
    let mut sleeper = sleeper;
    sleeper.kill().unwrap();
    let pid = sleeper.id();
    sleeper.wait().unwrap();
    let (code, _, stderr) = capture(pid, dir.path());
    assert_eq!(code, 1);
    assert!(stderr.contains(&format!("no process {pid}")), "{stderr}");
    assert_eq!(captures(dir.path()), 0);
}
