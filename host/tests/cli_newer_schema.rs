//! A database written by a newer turnsafe (a higher `user_version`) is
//! refused with exit 2 and a clear error by every command that opens a
//! home, and nothing is written: the file's bytes and the home's listing
//! stay as they were. The library's store never writes it either.

use std::path::Path;

use rusqlite::Connection;
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;
use turnsafe_host::store::{SessionId, SessionStore, StoreOptions};

const NEWER: i64 = turnsafe_host::store::SCHEMA_VERSION + 1;

/// A healthy home whose schema a newer turnsafe then stamped.
fn newer_home(dir: &Path) {
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "s1", "--home"])
        .arg(dir)
        .write_stdin("[{\"role\":\"user\",\"content\":\"hello\"}]\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let c = Connection::open(dir.join("state.db")).unwrap();
    c.execute_batch(&format!("PRAGMA user_version = {NEWER}")).unwrap();
    drop(c);
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn commands(home: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["append", "--session", "s1", "--home", home],
        vec!["search", "--home", home, "hello"],
        vec!["show", "--session", "s1", "--home", home],
        vec!["replay", "--home", home],
        vec!["doctor", "--repair-fts", "--home", home],
    ]
}

#[test]
fn every_command_refuses_a_newer_schema_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    newer_home(dir.path());
    let db = dir.path().join("state.db");
    let (bytes, names) = (std::fs::read(&db).unwrap(), listing(dir.path()));
    assert_eq!(names, ["state.db"]);
    let home = dir.path().to_str().unwrap();
    for args in commands(home) {
        let out = assert_cmd::Command::cargo_bin("turnsafe")
            .unwrap()
            .args(&args)
            .write_stdin("[{\"role\":\"user\",\"content\":\"lost?\"}]\n")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("schema version {NEWER}")) && stderr.contains("newer than this turnsafe"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?} answered on stdout");
        assert_eq!(std::fs::read(&db).unwrap(), bytes, "{args:?} wrote state.db");
        assert_eq!(listing(dir.path()), names, "{args:?} created files");
    }
}

#[test]
fn a_newer_schema_still_in_the_wal_is_refused_too() {
    let dir = tempfile::tempdir().unwrap();
    newer_home(dir.path());
    // The main file says NEWER; a later stamp stays in the WAL, not yet
    // checkpointed, while this connection is open.
    let header = |dir: &Path| {
        let b = std::fs::read(dir.join("state.db")).unwrap();
        i64::from(i32::from_be_bytes([b[60], b[61], b[62], b[63]]))
    };
    assert_eq!(header(dir.path()), NEWER);
    let c = Connection::open(dir.path().join("state.db")).unwrap();
    c.execute_batch(&format!(
        "PRAGMA wal_autocheckpoint = 0; PRAGMA user_version = {}",
        NEWER + 1
    ))
    .unwrap();
    assert_eq!(header(dir.path()), NEWER);
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["search", "--home"])
        .arg(dir.path())
        .arg("hello")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("schema version {}", NEWER + 1)), "{stderr}");
    drop(c);
}

#[test]
fn the_store_never_writes_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    newer_home(dir.path());
    let db = dir.path().join("state.db");
    let bytes = std::fs::read(&db).unwrap();
    let mut store = SessionStore::new(dir.path(), StoreOptions::default());
    let out = store.append_batch(&SessionId::new("s1").unwrap(), &[Message::new("user", "kept")]);
    assert!(!out.persisted);
    assert_eq!(out.committed, 0);
    assert_eq!(out.diverted + out.handed_back, 1);
    drop(store);
    assert_eq!(std::fs::read(&db).unwrap(), bytes, "the store wrote state.db");
}
