//! A `turnsafe append` line that is not UTF-8 is refused, never read as
//! lossy text: before, its bad byte became U+FFFD and the message was
//! committed with other bytes than were given (found by the
//! `append_stdin` fuzz target's property: stored bytes are the line's).

use rusqlite::Connection;
use serde_json::Value;

mod live;
use live::bin;

/// Runs `append` on `stdin` and returns its exit code, answers, and the
/// stored `(uid, item)` rows of session `s1`.
fn run(extra: &[&str], stdin: Vec<u8>) -> (Option<i32>, Vec<Value>, Vec<(String, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let out = assert_cmd::Command::new(bin())
        .args(["append", "--home"])
        .arg(&home)
        .args(extra)
        .write_stdin(stdin)
        .output()
        .unwrap();
    let answers = String::from_utf8(out.stdout)
        .expect("answers are UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let conn = Connection::open(home.join("state.db")).unwrap();
    let rows = conn
        .prepare("SELECT uid, item FROM messages WHERE session_id = 's1' ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (out.status.code(), answers, rows)
}

fn check(extra: &[&str], line: impl Fn(&str, &[u8]) -> Vec<u8>) {
    let mut stdin = line("u1", b"caf\xc3\xa9");
    stdin.extend(line("u2", b"caf\xff"));
    stdin.extend(line("u3", b"ok"));
    let (code, answers, rows) = run(extra, stdin);
    assert_eq!(code, Some(3), "a refused line: not every batch persisted");
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0]["persisted"], true, "{}", answers[0]);
    assert_eq!(answers[1]["line"], 2, "{}", answers[1]);
    let error = answers[1]["error"].as_str().unwrap_or_default();
    assert!(error.contains("not UTF-8"), "{error}");
    assert_eq!(answers[2]["persisted"], true, "{}", answers[2]);
    let uids: Vec<&str> = rows.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(uids, ["u1", "u3"], "the line that is not UTF-8 is not stored");
    let item: Value = serde_json::from_str(&rows[0].1).unwrap();
    assert_eq!(item["content"], "caf\u{e9}");
}

#[test]
fn a_line_that_is_not_utf8_is_refused_with_one_session() {
    check(&["--session", "s1"], |uid, content| {
        let mut l = format!("[{{\"role\":\"user\",\"uid\":\"{uid}\",\"content\":\"").into_bytes();
        l.extend_from_slice(content);
        l.extend_from_slice(b"\"}]\n");
        l
    });
}

#[test]
fn a_line_that_is_not_utf8_is_refused_when_lines_name_their_session() {
    check(&[], |uid, content| {
        let mut l = format!("{{\"session\":\"s1\",\"messages\":[{{\"role\":\"user\",\"uid\":\"{uid}\",\"content\":\"")
            .into_bytes();
        l.extend_from_slice(content);
        l.extend_from_slice(b"\"}]}\n");
        l
    });
}
