//! `turnsafe search --db`: the `tsvector` index is kept off the commit
//! path (a commit writes no index row), search brings it up to date first,
//! and when it cannot (a read-only server) the messages it lacks are still
//! found, and counted as `unindexed`. The output is SQLite's.
#[path = "../../tests/common/pg.rs"]
mod pg;

use assert_cmd::Command;
use serde_json::Value;

fn lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn search(url: &str, args: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .arg("search")
        .args(args)
        .args(["--json", "--db", url])
        .output()
        .unwrap();
    (
        out.status.code(),
        lines(&out.stdout),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn search_never_misses_a_commit() {
    let server = pg_or_skip!();
    let db = server.create_db("search");
    let url = server.url(&db);
    let home = tempfile::tempdir().unwrap();
    let batches = "[{\"role\":\"user\",\"content\":\"the zebra crossed\",\"uid\":\"a\"},\
                   {\"role\":\"assistant\",\"content\":\"a quiet afternoon\",\"uid\":\"b\"}]\n\
                   [{\"role\":\"user\",\"content\":\"another zebra, striped\",\"uid\":\"c\"}]\n";
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "s1", "--db", &url, "--home"])
        .arg(home.path())
        .write_stdin(batches)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let mut admin = server.admin(&db);
    let indexed: i64 = admin
        .query_one("SELECT count(*) FROM messages_search", &[])
        .unwrap()
        .get(0);
    assert_eq!(indexed, 0, "no commit writes the index");

    let (code, found, stderr) = search(&url, &["zebra"]);
    assert_eq!(code, Some(0), "{stderr}");
    let hits: Vec<&Value> = found.iter().filter(|v| v["type"] == "hit").collect();
    assert_eq!(hits.len(), 2, "{found:?}");
    assert_eq!(hits[0]["data"]["uid"], "a");
    assert_eq!(hits[0]["data"]["seq"], 1);
    assert_eq!(hits[0]["data"]["session"], "s1");
    assert_eq!(hits[0]["data"]["role"], "user");
    assert!(hits[0]["data"]["snippet"].as_str().unwrap().contains("[zebra]"));
    assert_eq!(
        found.last().unwrap()["data"],
        serde_json::json!({"hits": 2, "unindexed": 0})
    );
    let indexed: i64 = admin
        .query_one("SELECT count(*) FROM messages_search", &[])
        .unwrap()
        .get(0);
    assert_eq!(indexed, 3, "the search indexed what it lacked");

    // Every word must appear; --limit and --session apply.
    let (_, found, _) = search(&url, &["striped zebra"]);
    assert_eq!(found.iter().filter(|v| v["type"] == "hit").count(), 1);
    let (_, found, _) = search(&url, &["zebra", "--limit", "1"]);
    assert_eq!(found.iter().filter(|v| v["type"] == "hit").count(), 1);
    let (_, found, _) = search(&url, &["zebra", "--session", "other"]);
    assert_eq!(found.iter().filter(|v| v["type"] == "hit").count(), 0);

    // A message committed while the index cannot be written is found anyway.
    admin
        .execute(
            "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
             VALUES ('s1', 'd', 4, 'user', 'zebra at dusk', '{\"content\":\"zebra at dusk\",\"role\":\"user\"}', 0)",
            &[],
        )
        .unwrap();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" SET default_transaction_read_only = on"
        ))
        .unwrap();
    let (code, found, stderr) = search(&url, &["zebra"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(found.iter().filter(|v| v["type"] == "hit").count(), 3, "{found:?}");
    assert_eq!(found.last().unwrap()["data"]["unindexed"], 1);
    assert!(stderr.contains("not indexed yet"), "{stderr}");

    // Usage errors: an empty query, FTS5 syntax.
    assert_eq!(search(&url, &[" "]).0, Some(2));
    assert_eq!(search(&url, &["zebra", "--fts5"]).0, Some(2));
}
