//! What Hermes' compaction or a rewind took out of a transcript is
//! archived by `turnsafe import hermes` and `turnsafe restore` brings it
//! back (README, "For Hermes users"), through the command line, on a copy
//! of the committed Hermes home (`tests/fixtures/hermes-0.19.0`): session
//! `20260101_090000_a1b2c3` was compacted (its first three rows replaced
//! by a summary), session `user 42/ü` was rewound to its first message.
//! Each archived row comes back at its seq with the very message the
//! archive held, before the rows that stayed, which do not change; the
//! archive is then empty, and a second restore brings nothing.

use std::path::{Path, PathBuf};

use serde_json::Value;

const COMPACTED: &str = "20260101_090000_a1b2c3";
/// `user 42/ü` under the id `TurnsafeSession` gives it.
const REWOUND: &str = "user_42__-h10fbab2a704de8bd73782225570d18a0";

/// Run the `turnsafe` built with this package; exit 0, stdout's JSON lines.
fn turnsafe(args: &[&str]) -> Vec<Value> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnsafe"))
        .args(args)
        .output()
        .expect("run turnsafe");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A copy of the fixture home in `dir/hermes`.
fn hermes_home(dir: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hermes-0.19.0");
    let to = dir.join("hermes");
    copy_dir(&fixture, &to);
    to
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read the fixture") {
        let path = entry.expect("entry").path();
        let target = to.join(path.file_name().expect("a name"));
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// `(uid, seq, message)` of each record of `kind` in `lines`.
fn records(lines: &[Value], kind: &str) -> Vec<(String, i64, Value)> {
    lines
        .iter()
        .filter(|l| l["type"] == kind)
        .map(|l| {
            let d = &l["data"];
            (
                d["uid"].as_str().expect("uid").to_string(),
                d["seq"].as_i64().expect("seq"),
                d["message"].clone(),
            )
        })
        .collect()
}

/// `show --json` (or `--archived`) of `session`: its rows, and the end record.
fn show(home: &str, session: &str, archived: bool) -> (Vec<(String, i64, Value)>, Value) {
    let mut args = vec!["show", "--home", home, "--session", session, "--json"];
    if archived {
        args.push("--archived");
    }
    let lines = turnsafe(&args);
    let end = lines.last().expect("an end record").clone();
    assert_eq!(end["type"], "end");
    (
        records(&lines, if archived { "archived" } else { "message" }),
        end["data"].clone(),
    )
}

/// Restore `session`'s rows archived for `reason`; the end record's data.
fn restore(home: &str, session: &str, reason: &str) -> Value {
    let lines = turnsafe(&[
        "restore",
        "--home",
        home,
        "--session",
        session,
        "--reason",
        reason,
        "--json",
    ]);
    let end = lines.last().expect("an end record");
    assert_eq!(end["type"], "end");
    end["data"].clone()
}

fn archived_reasons(home: &str, session: &str) -> Vec<(String, String)> {
    let lines = turnsafe(&["show", "--home", home, "--session", session, "--archived", "--json"]);
    lines
        .iter()
        .filter(|l| l["type"] == "archived")
        .map(|l| {
            (
                l["data"]["uid"].as_str().expect("uid").to_string(),
                l["data"]["reason"].as_str().expect("reason").to_string(),
            )
        })
        .collect()
}

/// Restore `session`'s `reason` rows and check they come back exactly.
fn brings_back(home: &str, session: &str, reason: &str, uids: &[&str]) {
    let reasons: Vec<(String, String)> = uids.iter().rev().map(|u| (u.to_string(), reason.to_string())).collect();
    assert_eq!(archived_reasons(home, session), reasons, "newest archived first");
    let (mut archived, _) = show(home, session, true);
    archived.reverse();
    let (active, _) = show(home, session, false);

    let end = restore(home, session, reason);
    let restored: Vec<(String, i64)> = archived.iter().map(|(u, s, _)| (u.clone(), *s)).collect();
    let listed: Vec<(String, i64)> = end["restored"]
        .as_array()
        .expect("restored")
        .iter()
        .map(|r| {
            (
                r["uid"].as_str().expect("uid").to_string(),
                r["seq"].as_i64().expect("seq"),
            )
        })
        .collect();
    assert_eq!(listed, restored, "{end}");
    assert_eq!(end["skipped_active"], serde_json::json!([]), "{end}");
    assert_eq!(end["not_archived"], serde_json::json!([]), "{end}");

    // The archived rows, each at its seq with the message the archive
    // held, then the rows that stayed, unchanged.
    let (now, complete) = show(home, session, false);
    let mut expected = archived.clone();
    expected.extend(active);
    assert_eq!(now, expected);
    assert_eq!(complete["complete"], true);
    let (left, end) = show(home, session, true);
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(end["archived"], 0);
    // Restored once: a second restore finds nothing to bring back.
    let again = restore(home, session, reason);
    assert_eq!(again["restored"], serde_json::json!([]), "{again}");
    assert_eq!(show(home, session, false).0, expected);
}

#[test]
fn restore_brings_back_what_hermes_compaction_and_rewind_took_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = hermes_home(dir.path());
    let home = dir.path().join("turnsafe");
    let (src, dst) = (source.to_str().expect("utf-8"), home.to_str().expect("utf-8"));
    let end = turnsafe(&["import", "hermes", "--source", src, "--home", dst, "--json"]);
    assert_eq!(end.last().expect("end")["data"]["archived"], 5);

    brings_back(dst, COMPACTED, "compaction", &["hermes:1", "hermes:2", "hermes:3"]);
    let (rows, _) = show(dst, COMPACTED, false);
    let uids: Vec<&str> = rows.iter().map(|(u, _, _)| u.as_str()).collect();
    assert_eq!(
        uids,
        [
            "hermes:1",
            "hermes:2",
            "hermes:3",
            "hermes:4",
            "hermes:5",
            "hermes:jsonl:2:3875bc185acd0c9228a5bcc9",
            "hermes:json:3:43a2da6251c8a669bf6631e6",
        ]
    );
    assert_eq!(rows[0].2["content"], "Wie weit ist es zum Hafen? 🚢");
    assert_eq!(rows[1].2["tool_calls"][0]["id"], "call_1");

    brings_back(dst, REWOUND, "rewind", &["hermes:6", "hermes:7"]);
    let (rows, _) = show(dst, REWOUND, false);
    let contents: Vec<&Value> = rows.iter().map(|(_, _, m)| &m["content"]).collect();
    assert_eq!(contents, ["erste Frage", "erste Antwort", "zweite Frage"]);
}
