//! Both sidecars deleted under a live writer, then a second process
//! writes. Without the guard the first writer's committed rows vanish and
//! nobody is told; with it, the next batch is diverted, the handle turns
//! sticky, and the retired generation is captured with every committed row.
#[path = "../../tests/common/mod.rs"]
mod common;
use common::*;
use rusqlite::{Connection, OpenFlags};
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause};

/// A separate process writes to the same home (its own session).
fn second_writer(home: &Home) {
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "intruder", "--home"])
        .arg(home.path())
        .write_stdin("[{\"role\":\"user\",\"content\":\"from another process\"}]\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

fn delete_sidecars(home: &Home) {
    for s in ["state.db-wal", "state.db-shm"] {
        std::fs::remove_file(home.path().join(s)).unwrap();
    }
}

#[test]
fn without_the_guard_the_rows_are_lost_silently() {
    // The loss is real: a plain connection, the same sequence, no error.
    let home = Home::new();
    drop(home.store());
    let c = Connection::open(home.db()).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;")
        .unwrap();
    c.execute("INSERT INTO sessions(id, created_ms) VALUES ('s1', 0)", [])
        .unwrap();
    c.execute(
        "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
         VALUES ('s1','lost',1,'user','x','{\"content\":\"x\",\"role\":\"user\"}',0)",
        [],
    )
    .unwrap();
    delete_sidecars(&home);
    second_writer(&home);
    // The first writer still "works"...
    let n: i64 = c
        .query_row("SELECT count(*) FROM messages WHERE session_id = 's1'", [], |r| {
            r.get(0)
        })
        .unwrap_or(-1);
    // ...until it stops the way processes stop in production: killed,
    // with no close-time checkpoint. Its WAL was unlinked, so its frames go.
    std::mem::forget(c);
    // ...but a fresh reader sees nothing of it, and integrity_check is ok.
    let fresh = home.other();
    let after: i64 = fresh
        .query_row("SELECT count(*) FROM messages WHERE uid = 'lost'", [], |r| r.get(0))
        .unwrap();
    let ok: String = fresh.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    println!("first writer saw {n} row(s); after the second writer a fresh reader sees {after}; integrity_check: {ok}");
    assert_eq!(n, 1, "the first writer saw its commit");
    assert_eq!(after, 0, "the committed row vanished");
    assert_eq!(ok, "ok");
}

#[test]
fn the_guard_diverts_captures_and_keeps_every_committed_row() {
    let home = Home::new();
    let mut store = home.store();
    let first = batch("first", 5);
    assert!(store.append_batch(&sid("s1"), &first).persisted);
    delete_sidecars(&home);
    second_writer(&home);

    let out = store.append_batch(&sid("s1"), &batch("second", 3));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::DeletedWal));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!(out.diverted, 3);
    receipt_lines(out.receipt.as_ref().unwrap());
    assert_eq!(store.sticky(), Some(Cause::DeletedWal));
    let capture = out
        .capture
        .clone()
        .expect("a capture was made")
        .expect("capture succeeded");
    let dir = std::path::PathBuf::from(&capture.path);
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("state.db.retired-")
    );
    assert!(
        capture.files.iter().any(|f| f.name == "state.db-wal" && f.size > 0),
        "{:?}",
        capture.files
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["files"].as_array().unwrap().len(), capture.files.len());

    // Later batches divert without touching the db.
    let attempts = store.counters().append_attempts;
    let later = store.append_batch(&sid("s1"), &batch("third", 1));
    assert_eq!((later.cause, later.diverted), (Some(Cause::DeletedWal), 1));
    assert_eq!(store.counters().append_attempts, attempts);
    drop(store);

    // The capture, copied and opened read-only, holds every committed row.
    let copy = tempfile::tempdir().unwrap();
    for f in &capture.files {
        std::fs::copy(dir.join(&f.name), copy.path().join(&f.name)).unwrap();
    }
    let c = Connection::open_with_flags(copy.path().join("state.db"), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut stmt = c
        .prepare("SELECT uid FROM messages WHERE session_id = 's1' ORDER BY seq")
        .unwrap();
    let uids: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    assert_eq!(uids, ["first-0", "first-1", "first-2", "first-3", "first-4"]);
}

#[test]
fn sidecars_deleted_after_the_last_batch_are_caught_at_close() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("only", 4)).persisted);
    let before = std::fs::read(home.db()).unwrap();
    delete_sidecars(&home);
    let capture = store.close().expect("close captured").expect("capture succeeded");
    // No checkpoint ran into the file at the path.
    assert_eq!(
        std::fs::read(home.db()).unwrap(),
        before,
        "state.db was not written at close"
    );
    let dir = std::path::PathBuf::from(&capture.path);
    let copy = tempfile::tempdir().unwrap();
    for f in &capture.files {
        std::fs::copy(dir.join(&f.name), copy.path().join(&f.name)).unwrap();
    }
    let c = Connection::open_with_flags(copy.path().join("state.db"), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM messages WHERE session_id = 's1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 4);
}
