//! A clear killed after its archive committed and before it settled the
//! session's pending divert lines: the lines are in the archive and still
//! pending. Replay finds each one archived by the clear with its own bytes
//! and settles it `cleared`; the cleared session stays empty, and every
//! line is in exactly one place (the archive), never also an active row.
mod common;

use assert_cmd::Command;
use common::*;
use serde_json::Value;
use turnsafe_host::backend::Backend;
use turnsafe_host::divert::{DivertLine, divert};
use turnsafe_host::message::Message;
use turnsafe_host::replay::{ReplayOptions, replay_run};
use turnsafe_policy::Cause;

#[test]
fn a_clear_cut_before_it_settled_its_lines_is_finished_by_replay() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("stored", 2)).persisted);
    drop(store);
    let pending: Vec<Message> = (0..2).map(|i| Message::new("user", &format!("pending {i}"))).collect();
    let uids: Vec<String> = (0..2).map(|i| format!("pending-{i}")).collect();
    let lines: Vec<DivertLine<'_>> = pending
        .iter()
        .zip(&uids)
        .enumerate()
        .map(|(i, (message, uid))| DivertLine {
            uid,
            seq: Some(i as i64 + 3),
            message,
        })
        .collect();
    divert(&home.path().join("sessions"), "s1", "b1", Cause::Disk, &lines).expect("divert");

    // Killed right after the archive's COMMIT.
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["clear", "--session", "s1", "--home"])
        .arg(home.path())
        .env("TURNSAFE_CRASH_AT", "edit.after_commit:1")
        .output()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archived: i64 = home
        .other()
        .query_row(
            "SELECT count(*) FROM archive WHERE session_id = 's1' AND reason = 'clear'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(archived, 4, "the rows and the pending lines are archived");
    assert!(home.rows("s1").is_empty());

    let run = replay_run(home.path(), &ReplayOptions::default()).expect("replay");
    let s = run.summary(false);
    assert_eq!(
        (&s["lines"], &s["cleared"], &s["replayed"]),
        (&2.into(), &2.into(), &0.into()),
        "{s}"
    );
    assert!(
        home.rows("s1").is_empty(),
        "a cleared line never comes back as an active row"
    );
    let ledger = std::fs::read_to_string(home.path().join("sessions/ledger.jsonl")).unwrap();
    let states: Vec<(String, String)> = ledger
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| {
            (
                v["uid"].as_str().unwrap_or("").to_string(),
                v["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("pending-0".to_string(), "cleared".to_string()),
            ("pending-1".to_string(), "cleared".to_string())
        ]
    );

    // The lines come back with the rows, once, by restore.
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["restore", "--session", "s1", "--reason", "clear", "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let uids: Vec<String> = home.rows("s1").into_iter().map(|r| r.0).collect();
    assert_eq!(uids, ["stored-0", "stored-1", "pending-0", "pending-1"]);
}
