//! The guard's own probe failing under fd exhaustion: with only a few
//! descriptors left, SQLite can open its files but the guard cannot list
//! `/proc/self/fd`. The store must then fail closed as `disk`, never write
//! unguarded, and claim nothing it did not do. Whether the probe failed is
//! seen from outside (strace: its `openat` of `/proc/self/fd` returned
//! EMFILE), not from the writer's own log.

use serde_json::Value;

/// Whether the trace shows the guard's probe of `/proc/self/fd` refused a
/// descriptor (EMFILE), whatever the writer itself reported.
fn probe_refused(trace: &str) -> bool {
    trace
        .lines()
        .any(|l| l.contains("openat(") && l.contains("\"/proc/self/fd\"") && l.contains("= -1 EMFILE"))
}

#[test]
fn a_failed_guard_probe_fails_closed_as_disk() {
    turnsafe_tests::require!(turnsafe_tests::strace());
    let mut probe_failures = 0;
    for headroom in 1..=8 {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let trace_file = dir.path().join("trace");
        // Watched from outside: strace records every openat of the writer.
        let out = assert_cmd::Command::new("strace")
            .args(["-f", "-e", "trace=openat", "-o"])
            .arg(&trace_file)
            .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
            .args(["append", "--session", "s1", "--exhaust-fds-after", "0", "--fd-headroom"])
            .arg(headroom.to_string())
            .arg("--home")
            .arg(&home)
            .write_stdin("[{\"role\":\"user\",\"content\":\"a\"}]\n")
            .output()
            .unwrap();
        let trace = std::fs::read_to_string(&trace_file).unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("headroom {headroom}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        if probe_refused(&trace) {
            probe_failures += 1;
            // Nothing was committed while the guard could not look, and
            // the writer did not say otherwise.
            let db = home.join("state.db");
            if db.exists() {
                assert_eq!(
                    stored_messages(&db),
                    0,
                    "headroom {headroom}: a write went through unguarded: {v}"
                );
            }
            assert_eq!(v["persisted"], false, "headroom {headroom}: {v}");
            assert_eq!(v["committed"], 0, "headroom {headroom}: {v}");
        }
        if v["persisted"] == true {
            assert_eq!(out.status.code(), Some(0));
            continue;
        }
        assert_eq!(v["cause"], "disk", "headroom {headroom}: {v}");
        assert!(v["receipt"].is_null() || v["copy"]["code"] == "disk.diverted");
        if v["receipt"].is_null() {
            assert!(!v["copy"].to_string().to_lowercase().contains("a copy was kept"));
        }
    }
    assert!(probe_failures > 0, "no headroom made the guard's own probe fail");
}

/// The messages stored in `db`, read-only. A database whose schema was
/// never created holds none; any other failure to count fails the test.
fn stored_messages(db: &std::path::Path) -> i64 {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap_or_else(|e| panic!("cannot open {} to recount: {e}", db.display()));
    let has_table: bool = c
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = 'messages'",
            [],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("cannot read the schema of {}: {e}", db.display()));
    if !has_table {
        return 0;
    }
    c.query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("cannot count the messages in {}: {e}", db.display()))
}
