//! `turnsafe clear` reads a session's pending divert lines as replay does:
//! a line that is not UTF-8 is quarantined with its reason, never read as
//! lossy text and archived with U+FFFD in place of its bytes.

use rusqlite::Connection;
use serde_json::Value;

mod live;
use live::bin;

fn divert_line(uid: &str, content: &[u8]) -> Vec<u8> {
    let mut l = format!(
        r#"{{"v":2,"session":"s1","uid":"{uid}","seq":null,"batch":"b","cause":"disk","at":"2026-01-01T00:00:00.000Z","message":{{"role":"user","content":""#
    )
    .into_bytes();
    l.extend_from_slice(content);
    l.extend_from_slice(b"\"}}\n");
    l
}

#[test]
fn a_pending_line_that_is_not_utf8_is_quarantined_by_clear() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let out = assert_cmd::Command::new(bin())
        .args(["append", "--home"])
        .arg(&home)
        .args(["--session", "s1"])
        .write_stdin("[{\"role\":\"user\",\"content\":\"stored\",\"uid\":\"u1\"}]\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let sessions = home.join("sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let mut file = divert_line("d1", b"fine");
    file.extend(divert_line("d2", b"caf\xff"));
    std::fs::write(sessions.join("s1.jsonl"), &file).unwrap();

    let out = assert_cmd::Command::new(bin())
        .args(["clear", "--home"])
        .arg(&home)
        .args(["--session", "s1", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    let ledger: Vec<Value> = std::fs::read_to_string(sessions.join("ledger.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let line2 = ledger.iter().find(|e| e["line"] == 2).expect("line 2 is settled");
    assert_eq!(line2["state"], "quarantined", "{line2}");
    assert_eq!(line2["reason"], "not UTF-8", "{line2}");
    let conn = Connection::open(home.join("state.db")).unwrap();
    let items: Vec<String> = conn
        .prepare("SELECT item FROM archive")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(items.iter().any(|i| i.contains("fine")), "{items:?}");
    assert!(!items.iter().any(|i| i.contains('\u{fffd}')), "{items:?}");
}
