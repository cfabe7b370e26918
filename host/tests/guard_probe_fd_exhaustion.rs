//! The guard's own probe failing under fd exhaustion: with only a few
//! descriptors left, SQLite can open its files but the guard cannot list
//! `/proc/self/fd`. The store must then fail closed as `disk`, never write
//! unguarded, and claim nothing it did not do.

use serde_json::Value;

#[test]
fn a_failed_guard_probe_fails_closed_as_disk() {
    let mut probe_failures = 0;
    for headroom in 1..=8 {
        let dir = tempfile::tempdir().unwrap();
        let out = assert_cmd::Command::cargo_bin("turnsafe")
            .unwrap()
            .args(["append", "--session", "s1", "--exhaust-fds-after", "0", "--fd-headroom"])
            .arg(headroom.to_string())
            .arg("--home")
            .arg(dir.path())
            .env("TURNSAFE_LOG", "warn")
            .write_stdin("[{\"role\":\"user\",\"content\":\"a\"}]\n")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["persisted"] == true {
            assert_eq!(out.status.code(), Some(0));
            continue;
        }
        assert_eq!(v["cause"], "disk", "headroom {headroom}: {v}");
        assert!(v["receipt"].is_null() || v["copy"]["code"] == "disk.diverted");
        if v["receipt"].is_null() {
            assert!(!v["copy"].to_string().to_lowercase().contains("a copy was kept"));
        }
        if stderr.contains("guard probe `scan /proc/self/fd` failed") {
            probe_failures += 1;
            // Nothing was committed while the guard could not look.
            let db = dir.path().join("state.db");
            if db.exists() {
                let c = rusqlite::Connection::open(&db).unwrap();
                let n: i64 = c
                    .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
                    .unwrap_or(0);
                assert_eq!(n, 0, "headroom {headroom}: a write went through unguarded");
            }
        }
    }
    assert!(probe_failures > 0, "no headroom made the guard's own probe fail");
}
