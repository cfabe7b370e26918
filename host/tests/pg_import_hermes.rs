//! `turnsafe import hermes --db`: a Hermes home written by hermes-agent
//! 0.19.0 (`tests/fixtures/hermes-0.19.0`) imported into a real
//! PostgreSQL server gives the same report and the same stored rows,
//! archived rows and session records as the same import into a SQLite
//! home; a second import adds nothing; a dry run writes nothing and counts
//! the same; the Hermes home keeps every byte.
#[path = "../../tests/common/pg.rs"]
mod pg;

mod hermes_fixture;

use hermes_fixture::{bytes, hermes_home};
use std::path::Path;

use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnsafe")
}

/// `turnsafe import hermes --json` with `extra`; the exit code and the
/// report's lines, each without the fields that name where it went.
fn import(source: &Path, home: &Path, extra: &[&str]) -> (i32, Vec<Value>) {
    let out = std::process::Command::new(bin())
        .args(["import", "hermes", "--json", "--source"])
        .arg(source)
        .arg("--home")
        .arg(home)
        .args(extra)
        .env_remove("TURNSAFE_DB")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).replace(home.to_str().unwrap(), "[HOME]");
    let lines = stdout
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            if let Some(d) = v.get_mut("data").and_then(Value::as_object_mut) {
                d.remove("home");
            }
            v
        })
        .collect();
    (out.status.code().unwrap_or(-1), lines)
}

/// What the import stored: rows, archived rows and session records, with
/// the import's own times left out.
type Stored = (Vec<Vec<String>>, Vec<Vec<String>>, Vec<Vec<String>>);

fn stored_pg(server: &pg::PgServer, db: &str) -> Stored {
    let mut c = server.admin(db);
    let q = |c: &mut postgres::Client, sql: &str| -> Vec<Vec<String>> {
        c.query(sql, &[])
            .unwrap()
            .into_iter()
            .map(|r| (0..r.len()).map(|i| r.get::<_, String>(i)).collect())
            .collect()
    };
    (
        q(
            &mut c,
            "SELECT session_id, uid, seq::text, item, created_ms::text FROM messages ORDER BY session_id, seq",
        ),
        q(
            &mut c,
            "SELECT session_id, uid, seq::text, item, reason, holder, edit FROM archive ORDER BY session_id, seq, uid",
        ),
        q(
            &mut c,
            "SELECT session_id, origin, origin_id, meta FROM session_meta ORDER BY session_id",
        ),
    )
}

fn stored_sqlite(home: &Path) -> Stored {
    let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
    let q = |sql: &str, n: usize| -> Vec<Vec<String>> {
        let mut s = c.prepare(sql).unwrap();
        s.query_map([], |r| {
            (0..n).map(|i| r.get::<_, String>(i)).collect::<Result<Vec<_>, _>>()
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    (
        q(
            "SELECT session_id, uid, CAST(seq AS TEXT), item, CAST(created_ms AS TEXT) FROM messages ORDER BY session_id, seq",
            5,
        ),
        q(
            "SELECT session_id, uid, CAST(seq AS TEXT), item, reason, holder, edit FROM archive ORDER BY session_id, seq, uid",
            7,
        ),
        q(
            "SELECT session_id, origin, origin_id, meta FROM session_meta ORDER BY session_id",
            4,
        ),
    )
}

#[test]
fn an_import_into_a_server_matches_the_same_import_into_sqlite() {
    let server = pg_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let source = hermes_home(dir.path());
    let untouched = bytes(&source);

    let sqlite_home = dir.path().join("sqlite");
    let (code, want) = import(&source, &sqlite_home, &[]);
    assert_eq!(code, 0, "{want:?}");

    let db = server.create_db("hermes");
    let url = server.url(&db);
    let pg_home = dir.path().join("pg");
    // A dry run first: the same counts, nothing written.
    let (code, dry) = import(&source, &pg_home, &["--db", &url, "--dry-run"]);
    assert_eq!(code, 0, "{dry:?}");
    let mut dry_as_real = dry.clone();
    if let Some(end) = dry_as_real.last_mut() {
        end["data"]["dry_run"] = Value::Bool(false);
    }
    assert_eq!(dry_as_real, want, "a dry run counts what the import does");
    let (rows, archived, meta) = stored_pg(&server, &db);
    assert!(
        rows.is_empty() && archived.is_empty() && meta.is_empty(),
        "the dry run wrote"
    );

    let (code, got) = import(&source, &pg_home, &["--db", &url]);
    assert_eq!(code, 0, "{got:?}");
    assert_eq!(got, want, "the same report as into SQLite");
    let on_server = stored_pg(&server, &db);
    assert_eq!(
        on_server,
        stored_sqlite(&sqlite_home),
        "the same rows, archive and records"
    );
    let end = &got.last().unwrap()["data"];
    assert_eq!(
        (
            on_server.0.len() as u64,
            on_server.1.len() as u64,
            on_server.2.len() as u64
        ),
        (5, 5, 2),
        "the fixture's counts"
    );
    assert_eq!(
        (
            end["imported"].as_u64(),
            end["archived"].as_u64(),
            end["sessions"].as_u64()
        ),
        (Some(5), Some(5), Some(2)),
        "{end}"
    );
    assert!(
        !pg_home.join("state.db").exists(),
        "nothing went to SQLite under --home"
    );

    // Again: nothing new, every row a duplicate.
    let (code, again) = import(&source, &pg_home, &["--db", &url]);
    assert_eq!(code, 0, "{again:?}");
    let end = &again.last().unwrap()["data"];
    assert_eq!(
        (end["imported"].as_u64(), end["archived"].as_u64()),
        (Some(0), Some(0)),
        "{end}"
    );
    assert_eq!(stored_pg(&server, &db), on_server);

    // A uid the session holds with other bytes is never a duplicate: the
    // one comparison of bytes says conflict, and the stored row stays.
    let (session, uid) = (on_server.0[0][0].clone(), on_server.0[0][1].clone());
    let other = r#"{"role":"user","content":"edited since"}"#;
    server
        .admin(&db)
        .execute(
            "UPDATE messages SET item = $3 WHERE session_id = $1 AND uid = $2",
            &[&session, &uid, &other],
        )
        .unwrap();
    let c = rusqlite::Connection::open(sqlite_home.join("state.db")).unwrap();
    c.execute(
        "UPDATE messages SET item = ?3 WHERE session_id = ?1 AND uid = ?2",
        [&session, &uid, &other.to_string()],
    )
    .unwrap();
    drop(c);
    for (home, extra) in [(&pg_home, vec!["--db", url.as_str()]), (&sqlite_home, vec![])] {
        let (code, edited) = import(&source, home, &extra);
        assert_eq!(code, 0, "{edited:?}");
        let end = &edited.last().unwrap()["data"];
        assert_eq!(
            (
                end["conflict"].as_u64(),
                end["imported"].as_u64(),
                end["archived"].as_u64()
            ),
            (Some(1), Some(0), Some(0)),
            "{extra:?}: {end}"
        );
        assert_eq!(
            end["duplicate"].as_u64(),
            again.last().unwrap()["data"]["duplicate"].as_u64().map(|d| d - 1)
        );
    }
    let kept: String = server
        .admin(&db)
        .query_one(
            "SELECT item FROM messages WHERE session_id = $1 AND uid = $2",
            &[&session, &uid],
        )
        .unwrap()
        .get(0);
    assert_eq!(kept, other, "the stored row stays");
    server
        .admin(&db)
        .execute(
            "UPDATE messages SET item = $3 WHERE session_id = $1 AND uid = $2",
            &[&session, &uid, &on_server.0[0][3]],
        )
        .unwrap();

    // Read back by the server's own readers, as written.
    let shown = std::process::Command::new(bin())
        .args(["show", "--json", "--db", &url, "--home"])
        .arg(&pg_home)
        .args(["--session", on_server.0[0][0].as_str()])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let messages = String::from_utf8_lossy(&shown.stdout)
        .lines()
        .filter(|l| l.contains("\"type\":\"message\""))
        .count();
    assert_eq!(
        messages,
        on_server.0.iter().filter(|r| r[0] == on_server.0[0][0]).count()
    );

    assert_eq!(bytes(&source), untouched, "the Hermes home changed");
}

#[test]
fn a_server_that_cannot_be_reached_is_a_clear_failure_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let source = hermes_home(dir.path());
    let untouched = bytes(&source);
    let out = std::process::Command::new(bin())
        .args(["import", "hermes", "--source"])
        .arg(&source)
        .arg("--home")
        .arg(dir.path().join("home"))
        .args(["--db", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"])
        .env_remove("TURNSAFE_DB")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // An I/O failure (exit 1, as every failed edit), with the policy's
    // copy and the server it could not reach.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("into postgres://nobody@127.0.0.1:1/none"),
        "names the server: {stderr}"
    );
    assert!(stderr.contains("unavailable"), "says why: {stderr}");
    assert!(!dir.path().join("home/state.db").exists(), "nothing went to SQLite");
    assert_eq!(bytes(&source), untouched);
}
