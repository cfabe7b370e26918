//! `turnsafe append --db` without `--session` (lines naming their sessions)
//! commits the lines waiting on stdin together on PostgreSQL too: 48 lines
//! for 16 sessions given at once take far fewer transactions than lines
//! (counted from the rows' `xmin`), every answer is persisted, in input
//! order, and each session keeps its seqs in order.
#[path = "../../tests/common/pg.rs"]
mod pg;

use std::collections::BTreeSet;

use serde_json::{Value, json};

fn line(session: &str, tag: &str, n: usize) -> String {
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("{tag} {i}"), "uid": format!("{tag}-{i}")}))
        .collect();
    json!({"session": session, "messages": messages}).to_string()
}

#[test]
fn lines_waiting_together_share_a_transaction() {
    let server = pg_or_skip!();
    let db = server.create_db("many");
    let home = tempfile::tempdir().unwrap();
    let mut input = String::new();
    for round in 0..3 {
        for s in 0..16 {
            input += &(line(&format!("s{s}"), &format!("r{round}-s{s}"), 2) + "\n");
        }
    }
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--home"])
        .arg(home.path())
        .env("TURNSAFE_DB", server.url(&db))
        .write_stdin(input)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(answers.len(), 48);
    for (k, a) in answers.iter().enumerate() {
        assert_eq!(a["persisted"], true, "{a}");
        assert_eq!(a["session"], format!("s{}", k % 16), "answers keep input order");
    }
    let mut admin = server.admin(&db);
    let xmins: BTreeSet<String> = admin
        .query("SELECT xmin::text FROM messages", &[])
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        xmins.len() <= 8,
        "48 lines waiting together took {} transactions",
        xmins.len()
    );
    for s in 0..16 {
        let seqs: Vec<i64> = admin
            .query(
                "SELECT seq FROM messages WHERE session_id = $1 ORDER BY seq",
                &[&format!("s{s}")],
            )
            .unwrap()
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(seqs, (1..=6).collect::<Vec<i64>>());
    }
}
