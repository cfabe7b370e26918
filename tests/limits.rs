//! The limits `docs/STORAGE.md` states ("Limits"), each tried at the limit
//! and one byte past it: the first is taken, the second refused with an
//! answer that names the limit, and nothing past a limit is held in
//! memory whole or stored.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use turnsafe_host::divert::{DivertLine, MAX_SESSION_ID, divert};
use turnsafe_host::lines::{MAX_BATCH_LINE, MAX_DIVERT_LINE, MAX_WHOLE_FILE, read_whole};
use turnsafe_host::message::{MAX_UID, Message};
use turnsafe_policy::Cause;

fn turnsafe(args: &[&str], home: &Path, stdin: &[u8]) -> Output {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(args)
        .arg("--home")
        .arg(home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().unwrap()
}

fn answers(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A batch line of one message, exactly `len` bytes with its newline.
fn batch_line_of(len: usize) -> Vec<u8> {
    let empty = serde_json::to_vec(&json!([{"role": "user", "content": ""}])).unwrap();
    let pad = len - empty.len() - 1;
    let mut line = serde_json::to_vec(&json!([{"role": "user", "content": "x".repeat(pad)}])).unwrap();
    line.push(b'\n');
    assert_eq!(line.len(), len);
    line
}

#[test]
fn an_append_line_at_the_limit_is_stored_and_one_byte_more_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let mut input = batch_line_of(MAX_BATCH_LINE);
    input.extend(batch_line_of(MAX_BATCH_LINE + 1));
    input.extend(b"[{\"role\":\"user\",\"content\":\"after\"}]\n");
    let out = turnsafe(&["append", "--session", "s1"], home.path(), &input);
    // One line was not stored: exit 3, as for any line that was not.
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let a = answers(&out);
    assert_eq!(a.len(), 3);
    assert_eq!(a[0]["persisted"], true);
    assert_eq!(a[1]["line"], 2);
    assert_eq!(
        a[1]["error"],
        format!(
            "line of {} bytes is longer than the limit of {MAX_BATCH_LINE} bytes; nothing of it was stored",
            MAX_BATCH_LINE + 1
        )
    );
    assert_eq!(a[2]["persisted"], true, "the line after it is read");
    let c = rusqlite::Connection::open(home.path().join("state.db")).unwrap();
    let lens: Vec<i64> = c
        .prepare("SELECT length(item) FROM messages WHERE session_id = 's1' ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(lens.len(), 2);
    assert!(lens[0] > (MAX_BATCH_LINE - 64) as i64, "{lens:?}");
}

/// A message whose divert line is exactly `len` bytes with its newline.
fn message_for_divert_line(dir: &Path, len: usize) -> Message {
    // The envelope's size, from a divert of an empty message (the time
    // stamp has a fixed width).
    let probe = Message::new("user", "");
    let line = DivertLine {
        uid: "u0",
        seq: Some(1),
        message: &probe,
    };
    // The same session, batch and uid widths as the line it stands for.
    let r = divert(&dir.join("probe"), "s0", "b0", Cause::Disk, &[line]).unwrap();
    Message::new("user", &"y".repeat(len - r.length as usize))
}

#[test]
fn a_divert_line_at_the_limit_is_written_and_read_back_and_one_byte_more_is_neither() {
    let home = tempfile::tempdir().unwrap();
    let sessions = home.path().join("sessions");
    let at = message_for_divert_line(home.path(), MAX_DIVERT_LINE);
    let r = divert(
        &sessions,
        "s1",
        "b0",
        Cause::Disk,
        &[DivertLine {
            uid: "u0",
            seq: Some(1),
            message: &at,
        }],
    )
    .unwrap();
    assert_eq!(r.length as usize, MAX_DIVERT_LINE);

    let past = message_for_divert_line(home.path(), MAX_DIVERT_LINE + 1);
    let e = divert(
        &sessions,
        "s1",
        "b1",
        Cause::Disk,
        &[DivertLine {
            uid: "u1",
            seq: Some(2),
            message: &past,
        }],
    )
    .unwrap_err();
    assert_eq!(e.operation, "encode");
    assert_eq!(
        e.message,
        format!(
            "a divert line of {} bytes is longer than the limit of {MAX_DIVERT_LINE} bytes",
            MAX_DIVERT_LINE + 1
        )
    );
    // Nothing of it reached the file; for a new session, no file is made.
    let file = sessions.join("s1.jsonl");
    assert_eq!(std::fs::metadata(&file).unwrap().len() as usize, MAX_DIVERT_LINE);
    let none = divert(
        &sessions,
        "s3",
        "b1",
        Cause::Disk,
        &[DivertLine {
            uid: "u1",
            seq: Some(2),
            message: &past,
        }],
    );
    assert!(none.is_err());
    assert!(!sessions.join("s3.jsonl").exists());

    // A line one byte past the limit written by someone else, after a
    // short line of the same session: replay quarantines it, names the
    // limit, and replays the line at the limit and the short one.
    let mut extra = std::fs::read(&file).unwrap();
    extra.insert(extra.len() - 2, b' '); // `}}` -> `} }`: same JSON, one byte more
    let extra = String::from_utf8(extra)
        .unwrap()
        .replace("\"session\":\"s1\"", "\"session\":\"s2\"");
    assert_eq!(extra.len(), MAX_DIVERT_LINE + 1);
    let short = json!({"v": 2, "session": "s2", "uid": "w0", "seq": null, "batch": "b", "cause": "disk",
        "at": "2026-01-01T00:00:00.000Z", "message": {"role": "user", "content": "short"}});
    std::fs::write(sessions.join("s2.jsonl"), format!("{short}\n{extra}")).unwrap();
    let out = turnsafe(&["replay", "--json"], home.path(), b"");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = answers(&out).pop().unwrap();
    assert_eq!(summary["data"]["replayed"], 2, "{summary}");
    assert_eq!(summary["data"]["quarantined"], 1, "{summary}");
    let ledger = std::fs::read_to_string(sessions.join("ledger.jsonl")).unwrap();
    let entries: Vec<Value> = ledger.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let q = entries.iter().find(|e| e["state"] == "quarantined").unwrap();
    assert_eq!(q["session"], "s2");
    assert_eq!(
        q["reason"],
        format!(
            "line of {} bytes is longer than the limit of {MAX_DIVERT_LINE} bytes",
            MAX_DIVERT_LINE + 1
        )
    );
    let replayed: Vec<&Value> = entries.iter().filter(|e| e["state"] == "replayed").collect();
    assert_eq!(replayed.len(), 2);
    assert!(replayed.iter().any(|e| e["session"] == "s1" && e["uid"] == "u0"));
}

#[test]
fn a_session_id_of_the_longest_length_is_taken_and_one_byte_more_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let at = "a".repeat(MAX_SESSION_ID);
    let out = turnsafe(
        &["append", "--session", &at],
        home.path(),
        b"[{\"role\":\"user\",\"content\":\"x\"}]\n",
    );
    assert_eq!(out.status.code(), Some(0));
    let past = "a".repeat(MAX_SESSION_ID + 1);
    let out = turnsafe(
        &["append", "--session", &past],
        home.path(),
        b"[{\"role\":\"user\",\"content\":\"x\"}]\n",
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("session id must be 1 to {MAX_SESSION_ID} bytes")),
        "{err}"
    );
}

#[test]
fn a_uid_of_the_longest_length_is_taken_and_one_byte_more_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let line = |uid: &str| {
        let mut l = serde_json::to_vec(&json!({"items": [{"role": "user", "content": "x"}], "uids": [uid]})).unwrap();
        l.push(b'\n');
        l
    };
    let mut input = line(&"u".repeat(MAX_UID));
    input.extend(line(&"v".repeat(MAX_UID + 1)));
    let out = turnsafe(&["append", "--session", "s1"], home.path(), &input);
    let a = answers(&out);
    assert_eq!(a[0]["persisted"], true, "{}", a[0]);
    assert_eq!(a[1]["line"], 2, "{}", a[1]);
    assert_eq!(
        a[1]["error"], "`uids` must be an array, one per item, of strings of 1 to 256 bytes or nulls",
        "{}",
        a[1]
    );
    assert_eq!(out.status.code(), Some(3));
}

/// A sparse file of `size` bytes (a hole: no disk used).
fn sparse(path: &Path, size: u64) -> std::fs::File {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    f
}

#[test]
fn a_file_read_whole_at_the_limit_is_read_and_one_byte_more_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("at");
    sparse(&at, MAX_WHOLE_FILE);
    let data = read_whole(&mut std::fs::File::open(&at).unwrap(), "at").unwrap();
    assert_eq!(data.len() as u64, MAX_WHOLE_FILE);
    drop(data);
    let past = dir.path().join("past");
    sparse(&past, MAX_WHOLE_FILE + 1);
    let e = read_whole(&mut std::fs::File::open(&past).unwrap(), "past").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
    assert!(
        e.to_string()
            .starts_with(&format!("past is longer than the {MAX_WHOLE_FILE} bytes read whole")),
        "{e}"
    );

    // `turnsafe clear` on a session whose divert file is past it: refused,
    // naming the file and the way out; the file stays where it was.
    let home = dir.path().join("home");
    let out = turnsafe(
        &["append", "--session", "s1"],
        &home,
        b"[{\"role\":\"user\",\"content\":\"x\"}]\n",
    );
    assert_eq!(out.status.code(), Some(0));
    let sessions = home.join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let file = sessions.join("s1.jsonl");
    let line = json!({"v": 2, "session": "s1", "uid": "u9", "seq": null, "batch": "b", "cause": "disk",
        "at": "2026-01-01T00:00:00.000Z", "message": {"role": "user", "content": "y"}});
    std::fs::write(&file, format!("{line}\n")).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap()
        .set_len(MAX_WHOLE_FILE + 1)
        .unwrap();
    let out = turnsafe(&["clear", "--session", "s1"], &home, b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("s1.jsonl is longer than the") && err.contains("turnsafe replay"),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), MAX_WHOLE_FILE + 1);
}
