//! `turnsafe append`, driven from outside, opens the store by the same
//! decision table it writes by:
//! - a write lock held by another process while the writer creates its
//!   schema is waited out within the policy's patience, then persisted;
//! - a corrupt `state.db` is opened on the first batch only (seen by
//!   strace, not by the writer's own counters), and every batch diverts.
mod live;
use std::process::Command;
use std::time::{Duration, Instant};

use live::{Live, bin};
use rusqlite::Connection;

const BATCH: &str = r#"[{"role":"user","content":"hello","uid":"u1"}]"#;

#[test]
fn a_lock_held_while_the_schema_is_created_is_outlasted() {
    let dir = tempfile::tempdir().unwrap();
    // Another process's connection holds the write lock on the file the
    // writer must create its schema in.
    let other = Connection::open(dir.path().join("state.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        other.execute_batch("COMMIT").unwrap();
    });
    let mut live = Live::start(dir.path(), "s1");
    let v = live.send(BATCH);
    releaser.join().unwrap();
    assert_eq!(v["persisted"], true, "{v}");
    assert!(started.elapsed() >= Duration::from_millis(750));
    assert_eq!(v["operation"], "open", "{v}");
    assert_eq!(v["cause"], "locked", "{v}");
    assert_eq!(v["action"], "retry", "{v}");
    assert!(v["attempts"].as_u64().unwrap() > 1, "{v}");
    assert_eq!(v["copy"]["code"], "locked.persisted");
    assert_eq!(live.finish(), 0);
    let c = Connection::open(dir.path().join("state.db")).unwrap();
    let n: i64 = c.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 1);
}

#[test]
fn a_corrupt_db_is_opened_on_the_first_batch_only() {
    let strace = Command::new("strace")
        .arg("-V")
        .output()
        .map(drop)
        .map_err(|e| format!("strace is needed to watch the opens from outside (.ci/run installs it): {e}"));
    turnsafe_tests::require!(strace);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let garbage = vec![0x5Au8; 8192];
    std::fs::write(&db, &garbage).unwrap();
    let trace = dir.path().join("trace");
    let input = [
        BATCH,
        BATCH.replace("u1", "u2").as_str(),
        BATCH.replace("u1", "u3").as_str(),
    ]
    .join("\n")
        + "\n";
    let out = assert_cmd::Command::new("strace")
        .args(["-f", "-e", "trace=openat,open,creat", "-o"])
        .arg(&trace)
        .arg(bin())
        .args(["append", "--home"])
        .arg(dir.path())
        .args(["--session", "s1"])
        .write_stdin(input)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let outcomes: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(outcomes.len(), 3);
    for v in &outcomes {
        assert_eq!(
            (v["cause"].as_str(), v["diverted"].as_u64()),
            (Some("corrupt"), Some(1)),
            "{v}"
        );
    }
    let needle = format!("\"{}\"", db.display());
    let trace = std::fs::read_to_string(&trace).unwrap();
    let opens: Vec<&str> = trace.lines().filter(|l| l.contains(&needle)).collect();
    assert_eq!(opens.len(), 1, "state.db opened more than once:\n{}", opens.join("\n"));
    assert_eq!(std::fs::read(&db).unwrap(), garbage, "the corrupt file was written");
}
