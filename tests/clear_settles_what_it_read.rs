//! `clear` settles exactly the pending divert lines it read, on SQLite:
//! a line that cannot be read is `quarantined` with replay's reason and
//! the rest `cleared` (the counts exact); a read that fails (a folder
//! where a file being settled should be, an EIO injected into the divert
//! file's read under its lock) fails the clear before anything changed,
//! rows and lines untouched; and a line diverted once the clear has read the file stays
//! pending, and replay brings it in.
mod common;

use assert_cmd::Command;
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;

/// `s1` with two stored rows and three lines diverted for real: the
/// database refuses every insert (an abort trigger), so the batch goes to
/// `sessions/s1.jsonl` with a receipt.
fn home_with_pending() -> Home {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    home.other()
        .execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON messages BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
        )
        .unwrap();
    let out = store.append_batch(&sid("s1"), &batch("d", 3));
    assert!(!out.persisted && out.receipt.is_some(), "{}", out.to_value());
    home.other().execute_batch("DROP TRIGGER refuse").unwrap();
    home
}

fn ledger(home: &Home) -> Vec<Value> {
    match std::fs::read_to_string(home.path().join("sessions/ledger.jsonl")) {
        Ok(text) => text.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("read the ledger: {e}"),
    }
}

fn archived_uids(home: &Home, session: &str) -> Vec<String> {
    let c = home.other();
    let mut stmt = c
        .prepare("SELECT uid FROM archive WHERE session_id = ?1 ORDER BY id")
        .unwrap();
    stmt.query_map([session], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn clear_cli(home: &Home) -> std::process::Output {
    Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["clear", "--session", "s1", "--json", "--home"])
        .arg(home.path())
        .output()
        .unwrap()
}

#[test]
fn an_unreadable_line_is_quarantined_and_the_rest_cleared() {
    let home = home_with_pending();
    // A torn line and a line of an unknown format, between readable ones.
    let file = home.divert_file("s1");
    let lines: Vec<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let mut bad_version: Value = serde_json::from_str(&lines[2]).unwrap();
    bad_version["v"] = json!(99);
    bad_version["uid"] = json!("d-9");
    let text = format!(
        "{}\n{}\n{}\n{}\n{}\n",
        lines[0],
        &lines[1][..40],
        lines[1],
        bad_version,
        lines[2]
    );
    std::fs::write(&file, text).unwrap();

    let out = clear_cli(&home);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let end: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .expect("an end record");
    assert_eq!(end["data"], json!({"rows": 2, "pending_lines": 3}));

    let states: Vec<(u64, Option<String>, String, Option<String>)> = ledger(&home)
        .iter()
        .map(|e| {
            (
                e["line"].as_u64().unwrap(),
                e["uid"].as_str().map(String::from),
                e["state"].as_str().unwrap().to_string(),
                e["reason"].as_str().map(String::from),
            )
        })
        .collect();
    let cleared = Some("the session was cleared".to_string());
    assert_eq!(
        states,
        [
            (1, Some("d-0".into()), "cleared".into(), cleared.clone()),
            (2, None, "quarantined".into(), Some("torn or invalid JSON".into())),
            (3, Some("d-1".into()), "cleared".into(), cleared.clone()),
            (
                4,
                Some("d-9".into()),
                "quarantined".into(),
                Some("unsupported or missing format version `v`".into())
            ),
            (5, Some("d-2".into()), "cleared".into(), cleared),
        ]
    );
    // What was cleared is what the archive holds; the quarantined lines
    // stay, with the rest, in the settled file.
    assert_eq!(archived_uids(&home, "s1"), ["a-0", "a-1", "d-0", "d-1", "d-2"]);
    assert!(!file.exists());
    let settled: Vec<_> = std::fs::read_dir(home.path().join("sessions/settled"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(settled.len(), 1);
    assert_eq!(std::fs::read_to_string(&settled[0]).unwrap().lines().count(), 5);
}

#[test]
fn a_folder_where_a_settling_file_should_be_fails_the_clear_and_changes_nothing() {
    let home = home_with_pending();
    // A file of s1 being settled that cannot be read: a folder in its place.
    let stray = home.path().join("sessions/settling/s1@1-1.jsonl");
    std::fs::create_dir_all(&stray).unwrap();
    let before = std::fs::read(home.divert_file("s1")).unwrap();

    let out = clear_cli(&home);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("its pending divert lines could not be read") && stderr.contains("s1@1-1.jsonl"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was changed"), "{stderr}");
    assert_eq!(home.rows("s1").len(), 2, "no row left the transcript");
    assert!(archived_uids(&home, "s1").is_empty());
    assert_eq!(
        std::fs::read(home.divert_file("s1")).unwrap(),
        before,
        "the lines are where they were"
    );
    assert!(ledger(&home).is_empty(), "nothing settled");
}

#[test]
fn an_eio_reading_the_divert_file_fails_the_clear_and_changes_nothing() {
    let home = home_with_pending();
    let before = std::fs::read(home.divert_file("s1")).unwrap();

    let mut store = home.store();
    let fault = turnsafe_host::failpoint::fail_on(&["clear.read"], libc::EIO);
    let e = turnsafe_host::clear::clear(&mut store, home.path(), &sid("s1")).unwrap_err();
    drop(fault);
    assert!(matches!(e, turnsafe_host::clear::ClearError::Read { .. }), "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains("s1.jsonl")
            && message.contains("Input/output error")
            && message.contains("nothing was changed"),
        "{message}"
    );
    assert_eq!(home.rows("s1").len(), 2);
    assert!(archived_uids(&home, "s1").is_empty());
    assert_eq!(
        std::fs::read(home.divert_file("s1")).unwrap(),
        before,
        "the lines are where they were"
    );
    let settling = home.path().join("sessions/settling");
    assert!(!settling.exists() || std::fs::read_dir(&settling).unwrap().next().is_none());
    assert!(ledger(&home).is_empty());

    // Without the fault, the same clear goes through.
    let done = turnsafe_host::clear::clear(&mut store, home.path(), &sid("s1")).unwrap();
    assert_eq!((done.cleared.rows.len(), done.settled.settled), (2, 3));
    assert_eq!(ledger(&home).len(), 3);
}

#[test]
fn a_line_diverted_after_the_clear_read_stays_pending_and_is_replayed() {
    let home = home_with_pending();
    let sessions = home.path().join("sessions");
    // Once the clear has read the lines (its archive committed), another
    // writer of s1 diverts one more line.
    let late = Message::new("user", "diverted after the clear read the file").with_uid("late-0");
    let hook = {
        let sessions = sessions.clone();
        let late = late.clone();
        let fired = std::sync::atomic::AtomicBool::new(false);
        turnsafe_host::failpoint::on("edit.after_commit", move || {
            if fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let line = turnsafe_host::divert::DivertLine {
                uid: "late-0",
                seq: None,
                message: &late,
            };
            turnsafe_host::divert::divert(&sessions, "s1", "late-batch", turnsafe_policy::Cause::Disk, &[line])
                .expect("divert the late line");
        })
    };
    let mut store = home.store();
    let report = turnsafe_host::clear::clear(&mut store, home.path(), &sid("s1")).unwrap();
    drop(hook);
    assert_eq!(report.settled.settled, 3);
    assert_eq!(
        report
            .cleared
            .pending
            .iter()
            .map(|m| m.uid.as_str())
            .collect::<Vec<_>>(),
        ["d-0", "d-1", "d-2"]
    );
    let settled_uids: Vec<String> = ledger(&home)
        .iter()
        .map(|e| e["uid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(settled_uids, ["d-0", "d-1", "d-2"], "the late line is not settled");
    let pending = std::fs::read_to_string(home.divert_file("s1")).unwrap();
    assert_eq!(pending.lines().count(), 1);
    assert!(pending.contains("late-0"));

    let run = turnsafe_host::replay::replay_run(home.path(), &Default::default()).unwrap();
    assert_eq!(run.summary(false)["replayed"], 1, "{}", run.summary(false));
    assert_eq!(home.rows("s1").into_iter().map(|r| r.0).collect::<Vec<_>>(), ["late-0"]);
}
