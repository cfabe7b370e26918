//! `turnsafe search`, driven from outside: it indexes what was committed
//! before it queries, never misses a committed message (what a read-only
//! home or a full disk keeps it from indexing is scanned with `LIKE` and
//! reported as `unindexed`), takes plain words as quoted tokens, and
//! refuses a bad `--fts5` query with exit 2.
#[path = "../../tests/common/privileged.rs"]
#[macro_use]
mod privileged;

use std::path::Path;

use rusqlite::Connection;
use serde_json::{Value, json};

fn turnsafe() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("turnsafe").unwrap()
}

/// `turnsafe append` of one batch per line; every batch must persist.
fn append(home: &Path, session: &str, lines: &[Value]) {
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let out = turnsafe()
        .args(["append", "--session", session, "--home"])
        .arg(home)
        .write_stdin(input)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

struct Search {
    code: Option<i32>,
    records: Vec<Value>,
    stderr: String,
}

impl Search {
    fn hits(&self) -> Vec<&Value> {
        self.records.iter().filter(|r| r["type"] == "hit").collect()
    }
    fn end(&self) -> &Value {
        let last = self.records.last().expect("an end record");
        assert_eq!(last["type"], "end", "{last}");
        &last["data"]
    }
}

fn search(home: &Path, args: &[&str]) -> Search {
    let out = turnsafe()
        .args(["search", "--json", "--home"])
        .arg(home)
        .args(args)
        .output()
        .unwrap();
    let records = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    Search {
        code: out.status.code(),
        records,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn count(home: &Path, sql: &str) -> i64 {
    Connection::open(home.join("state.db"))
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

fn meta(home: &Path, key: &str) -> String {
    Connection::open(home.join("state.db"))
        .unwrap()
        .query_row("SELECT value FROM state_meta WHERE key = ?1", [key], |r| r.get(0))
        .unwrap()
}

/// Three batches about different things, in two sessions.
fn conversation(home: &Path) {
    append(
        home,
        "alpha",
        &[
            json!([{"role": "user", "content": "the harbour lighthouse keeps its lamp lit", "uid": "a1"},
                   {"role": "assistant", "content": "a lighthouse needs a keeper", "uid": "a2"}]),
            json!([{"role": "user", "content": "what about the glacier", "uid": "a3"}]),
        ],
    );
    append(
        home,
        "beta",
        &[json!([{"role": "user", "content": "glacier and lighthouse, AND \"quotes\" NEAR(x)", "uid": "b1"}])],
    );
}

#[test]
fn search_indexes_what_was_committed_then_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    conversation(dir.path());
    // The commits wrote only the messages: nothing is in the index yet.
    assert_eq!(count(dir.path(), "SELECT count(*) FROM messages_fts_docsize"), 0);
    assert_eq!(meta(dir.path(), "fts_watermark"), "0");

    let s = search(dir.path(), &["lighthouse"]);
    assert_eq!(s.code, Some(0), "{}", s.stderr);
    assert_eq!(s.end(), &json!({"hits": 3, "unindexed": 0}));
    let mut uids: Vec<&str> = s.hits().iter().map(|h| h["data"]["uid"].as_str().unwrap()).collect();
    uids.sort();
    assert_eq!(uids, ["a1", "a2", "b1"]);
    let a1 = s.hits().into_iter().find(|h| h["data"]["uid"] == "a1").unwrap();
    assert_eq!(
        a1["data"],
        json!({"session": "alpha", "uid": "a1", "seq": 1, "role": "user",
               "snippet": "the harbour [lighthouse] keeps its lamp lit"})
    );
    // The catch-up indexed every committed row and moved the watermark.
    assert_eq!(count(dir.path(), "SELECT count(*) FROM messages_fts_docsize"), 4);
    assert_eq!(meta(dir.path(), "fts_watermark"), "4");

    // A later commit is found by the next search, which indexes it first.
    append(
        dir.path(),
        "alpha",
        &[json!([{"role": "user", "content": "one more lighthouse", "uid": "a4"}])],
    );
    let s = search(dir.path(), &["lighthouse", "--session", "alpha"]);
    assert_eq!(s.end(), &json!({"hits": 3, "unindexed": 0}));
    assert_eq!(meta(dir.path(), "fts_watermark"), "5");
    let s = search(dir.path(), &["lighthouse", "--limit", "1"]);
    assert_eq!(s.end(), &json!({"hits": 1, "unindexed": 0}));
}

#[test]
fn plain_words_are_quoted_tokens_and_raw_fts5_errors_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    conversation(dir.path());
    // FTS5 operators and quotes in a plain query are just words.
    for q in ["AND", "\"quotes\"", "NEAR(x)", "glacier lighthouse"] {
        let s = search(dir.path(), &[q]);
        assert_eq!(s.code, Some(0), "{q}: {}", s.stderr);
        let uids: Vec<&str> = s.hits().iter().map(|h| h["data"]["uid"].as_str().unwrap()).collect();
        assert_eq!(uids, ["b1"], "{q}");
    }
    // Every word must appear.
    assert_eq!(search(dir.path(), &["glacier keeper"]).end()["hits"], 0);

    let s = search(dir.path(), &["--fts5", "light* NOT glacier"]);
    assert_eq!(s.code, Some(0), "{}", s.stderr);
    assert_eq!(s.end(), &json!({"hits": 2, "unindexed": 0}));
    let s = search(dir.path(), &["--fts5", "lighthouse AND ("]);
    assert_eq!(s.code, Some(2));
    assert!(s.stderr.contains("syntax error"), "{}", s.stderr);
    assert!(s.records.is_empty());
    let s = search(dir.path(), &["   "]);
    assert_eq!(s.code, Some(2), "{}", s.stderr);
}

#[test]
fn a_read_only_home_is_scanned_and_reported_unindexed() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    conversation(&home);
    assert_eq!(search(&home, &["glacier"]).end()["unindexed"], 0);
    // Two more commits, then the home becomes read-only before any search.
    append(
        &home,
        "alpha",
        &[
            json!([{"role": "user", "content": "a glacier calves", "uid": "a5"}]),
            json!([{"role": "assistant", "content": "icebergs drift", "uid": "a6"}]),
        ],
    );
    let db = home.join("state.db");
    let before = std::fs::read(&db).unwrap();
    let db_lock = skip_unless!(privileged::Immutable::new(&db));
    let home_lock = skip_unless!(privileged::Immutable::new(&home));

    let s = search(&home, &["glacier"]);
    assert_eq!(s.code, Some(0), "{}", s.stderr);
    // Two rows past the watermark, scanned with LIKE; none missed.
    assert_eq!(s.end(), &json!({"hits": 3, "unindexed": 2}));
    let mut uids: Vec<&str> = s.hits().iter().map(|h| h["data"]["uid"].as_str().unwrap()).collect();
    uids.sort();
    assert_eq!(uids, ["a3", "a5", "b1"]);
    assert!(s.stderr.contains("not indexed yet"), "{}", s.stderr);
    let s = search(&home, &["icebergs", "--session", "alpha"]);
    assert_eq!(s.end(), &json!({"hits": 1, "unindexed": 2}));
    assert_eq!(s.hits()[0]["data"]["snippet"], "[icebergs] drift");
    // A raw query reaches the unindexed rows too.
    let s = search(&home, &["--fts5", "iceb*"]);
    assert_eq!(s.end(), &json!({"hits": 1, "unindexed": 2}));

    drop(home_lock);
    drop(db_lock);
    assert_eq!(std::fs::read(&db).unwrap(), before, "search wrote to a read-only home");
    let mut names: Vec<String> = std::fs::read_dir(&home)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["state.db"]);
    // Writable again: the next search indexes them.
    assert_eq!(search(&home, &["glacier"]).end(), &json!({"hits": 3, "unindexed": 0}));
}

#[test]
fn a_damaged_index_never_fails_a_turn_and_search_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    conversation(dir.path());
    assert_eq!(search(dir.path(), &["glacier"]).end()["unindexed"], 0);
    Connection::open(dir.path().join("state.db"))
        .unwrap()
        .execute("UPDATE messages_fts_data SET block = X'FFFFFFFFFFFF' WHERE id = 10", [])
        .unwrap();
    // The turn commits: the index is not on its path.
    let out = turnsafe()
        .args(["append", "--session", "alpha", "--home"])
        .arg(dir.path())
        .write_stdin("[{\"role\":\"user\",\"content\":\"a glacier after the damage\",\"uid\":\"a9\"}]\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["persisted"], &v["cause"], &v["attempts"]),
        (&json!(true), &Value::Null, &json!(1))
    );

    // Search finds the damage, marks the index for rebuild, scans every row.
    let s = search(dir.path(), &["glacier"]);
    assert_eq!(s.code, Some(0), "{}", s.stderr);
    assert_eq!(s.end(), &json!({"hits": 3, "unindexed": 5}));
    assert!(s.stderr.contains("damaged"), "{}", s.stderr);
    assert_eq!(meta(dir.path(), "fts_enabled"), "0");

    let out = turnsafe()
        .args(["doctor", "--repair-fts", "--home"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("search index rebuilt"));
    assert_eq!(meta(dir.path(), "fts_watermark"), "5");
    assert_eq!(
        search(dir.path(), &["glacier"]).end(),
        &json!({"hits": 3, "unindexed": 0})
    );
}

#[test]
fn a_full_disk_is_scanned_and_reported_unindexed() {
    let dir = tempfile::tempdir().unwrap();
    let fs = skip_unless!(privileged::Tmpfs::new(&dir.path().join("fs"), "2m"));
    let home = fs.path().join("home");
    let batches: Vec<Value> = (0..30)
        .map(|b| {
            Value::Array(
                (0..10)
                    .map(|i| json!({"role": "user", "content": format!("batch {b} message {i} {}", "x".repeat(200))}))
                    .collect(),
            )
        })
        .collect();
    append(&home, "s1", &batches);
    privileged::fill(fs.path());
    let s = search(&home, &["message", "--limit", "500"]);
    assert_eq!(s.code, Some(0), "{}", s.stderr);
    assert_eq!(s.end(), &json!({"hits": 300, "unindexed": 300}));
    assert!(s.stderr.contains("disk_full"), "{}", s.stderr);
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    assert_eq!(search(&home, &["message"]).end(), &json!({"hits": 20, "unindexed": 0}));
}
