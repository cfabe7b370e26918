//! `turnsafe schema` prints the statements the store runs: a database made
//! from its `create` alone, and one of version 3 taken through its
//! `migrations` alone, hold what the binary's own homes hold (the
//! JavaScript host builds `state.db` from exactly this output).

use std::path::Path;

use assert_cmd::Command;
use rusqlite::Connection;
use serde_json::Value;

fn turnsafe(args: &[&str], home: Option<&Path>) -> std::process::Output {
    let mut c = Command::cargo_bin("turnsafe").unwrap();
    c.args(args);
    if let Some(home) = home {
        c.arg("--home").arg(home).args(["--session", "s1"]).write_stdin("");
    }
    c.output().unwrap()
}

fn printed() -> Value {
    let out = turnsafe(&["schema"], None);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What sqlite_master holds, whitespace aside, and the version.
fn schema_of(conn: &Connection) -> (i64, Vec<(String, String, String, String)>) {
    let norm = |s: Option<String>| s.unwrap_or_default().split_whitespace().collect::<Vec<_>>().join(" ");
    let objects = conn
        .prepare(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, norm(r.get(3)?))))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (
        conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap(),
        objects,
    )
}

fn batches(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
}

#[test]
fn a_new_database_from_the_printed_create_is_the_binarys_own() {
    let schema = printed();
    let version = schema["version"].as_i64().unwrap();
    assert_eq!(version, turnsafe_host::store::SCHEMA_VERSION);
    let native = tempfile::tempdir().unwrap();
    assert_eq!(turnsafe(&["append"], Some(native.path())).status.code(), Some(0));
    let mine = Connection::open_in_memory().unwrap();
    for b in batches(&schema["create"]) {
        mine.execute_batch(b).unwrap();
    }
    mine.execute_batch(&format!("PRAGMA user_version = {version}")).unwrap();
    let theirs = Connection::open(native.path().join("state.db")).unwrap();
    assert_eq!(schema_of(&mine), schema_of(&theirs));
}

#[test]
fn a_version_3_database_through_the_printed_steps_is_what_the_binary_migrates_it_to() {
    let schema = printed();
    let version = schema["version"].as_i64().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state-v3.db");
    let (native, mine) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for home in [&native, &mine] {
        std::fs::copy(&fixture, home.path().join("state.db")).unwrap();
    }
    // An append of no input migrates and writes nothing else.
    assert_eq!(turnsafe(&["append"], Some(native.path())).status.code(), Some(0));
    let conn = Connection::open(mine.path().join("state.db")).unwrap();
    let mut from = 3;
    for step in schema["migrations"].as_array().unwrap() {
        if step["from"].as_i64().unwrap() < 3 {
            continue;
        }
        assert_eq!(step["from"].as_i64().unwrap(), from);
        for b in batches(&step["ddl"]) {
            conn.execute_batch(b).unwrap();
        }
        from += 1;
    }
    assert_eq!(from, version, "the steps reach the current version");
    conn.execute_batch(&format!("PRAGMA user_version = {version}")).unwrap();
    let theirs = Connection::open(native.path().join("state.db")).unwrap();
    assert_eq!(schema_of(&conn), schema_of(&theirs));
}
