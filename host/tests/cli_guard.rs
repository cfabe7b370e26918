//! Through `turnsafe append`: deleting the sidecars, or renaming the db,
//! between two batches yields `deleted_wal` or `replaced`, a receipt, and a
//! capture folder that holds the first batch's committed frames.
mod live;
use live::Live;
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;

const FIRST: &str = r#"[{"role":"user","content":"one","uid":"m1"},{"role":"assistant","content":"two","uid":"m2"}]"#;
const SECOND: &str = r#"[{"role":"user","content":"three","uid":"m3"}]"#;

fn capture_has_first_batch(v: &Value) {
    let dir = std::path::PathBuf::from(v["capture"]["path"].as_str().expect("capture path"));
    let copy = tempfile::tempdir().unwrap();
    for f in v["capture"]["files"].as_array().unwrap() {
        let f = f["name"].as_str().unwrap();
        std::fs::copy(dir.join(f), copy.path().join(f)).unwrap();
    }
    let c = Connection::open_with_flags(copy.path().join("state.db"), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut s = c.prepare("SELECT uid FROM messages ORDER BY seq").unwrap();
    let uids: Vec<String> = s.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    assert_eq!(uids, ["m1", "m2"]);
}

#[test]
fn sidecars_deleted_between_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::start(dir.path(), "s1");
    assert_eq!(live.send(FIRST)["persisted"], true);
    std::fs::remove_file(dir.path().join("state.db-wal")).unwrap();
    std::fs::remove_file(dir.path().join("state.db-shm")).unwrap();
    let v = live.send(SECOND);
    assert_eq!(v["persisted"], false);
    assert_eq!(v["cause"], "deleted_wal");
    assert_eq!(v["action"], "divert");
    assert_eq!(v["diverted"], 1);
    assert!(v["receipt"]["path"].is_string());
    assert_eq!(v["copy"]["code"], "deleted_wal.diverted");
    capture_has_first_batch(&v);
    // The copy names the capture it has a receipt for.
    let capture = v["capture"]["path"].as_str().unwrap();
    assert!(v["capture"]["manifest_sha256"].as_str().is_some_and(|s| s.len() == 64));
    assert!(
        v["copy"]["body"]
            .as_str()
            .unwrap()
            .contains(&format!("captured at {capture}"))
    );
    assert_eq!(v["copy"]["details"]["capture_path"], capture);
    assert_eq!(live.finish(), 3);
}

/// The whole home deleted under a live writer: the guard sees it, but
/// neither the capture nor the divert can be written. The outcome says so,
/// and the copy claims neither a kept copy nor a capture.
#[test]
fn home_deleted_under_a_live_writer_claims_no_capture() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut live = Live::start(&home, "s1");
    assert_eq!(live.send(FIRST)["persisted"], true);
    std::fs::remove_dir_all(&home).unwrap();
    let v = live.send(SECOND);
    assert_eq!(v["persisted"], false, "{v}");
    assert!(
        v["cause"] == "deleted_wal" || v["cause"] == "replaced",
        "the guard names the retired generation: {v}"
    );
    assert_eq!((v["diverted"].as_u64(), v["handed_back"].as_u64()), (Some(0), Some(1)));
    assert_eq!(v["capture"]["operation"], "mkdir", "{v}");
    assert_eq!(v["capture"]["errno"], libc::ENOENT);
    assert!(v["capture"].get("path").is_none(), "{v}");
    assert_eq!(v["divert_error"]["operation"], "mkdir", "{v}");
    let copy = v["copy"].to_string();
    assert!(!copy.contains("was captured"), "{copy}");
    assert!(!copy.to_lowercase().contains("a copy was kept"), "{copy}");
    assert!(
        copy.contains("Capturing the retired database generation failed (mkdir: no such file or directory (ENOENT))"),
        "{copy}"
    );
    // The frames are in the writer's open files: the copy says how to keep
    // them before anything is stopped.
    assert!(copy.contains("turnsafe capture --pid"), "{copy}");
    assert!(!copy.contains("recover --source state.db"), "{copy}");
    assert!(!home.exists(), "nothing was recreated");
    assert_eq!(live.finish(), 3);
}

#[test]
fn db_renamed_between_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Live::start(dir.path(), "s1");
    assert_eq!(live.send(FIRST)["persisted"], true);
    std::fs::rename(dir.path().join("state.db"), dir.path().join("state.db.moved")).unwrap();
    let v = live.send(SECOND);
    assert_eq!(v["cause"], "replaced");
    assert_eq!(v["diverted"], 1);
    assert_eq!(v["copy"]["code"], "replaced.diverted");
    capture_has_first_batch(&v);
    assert_eq!(live.finish(), 3);
}
