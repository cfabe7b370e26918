//! Users share `sessions/` with their own runtime. Replay takes only
//! turnsafe's divert files; another runtime's transcript stays in place,
//! byte for byte, and doctor lists it as foreign.
mod live;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use live::bin;
use serde_json::Value;

fn turnsafe(args: &[&str], stdin: &str) -> (i32, String, String) {
    let out = assert_cmd::Command::new(bin())
        .args(args)
        .write_stdin(stdin)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn data_of(stdout: &str, kind: &str) -> Value {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {stdout}"))["data"]
        .clone()
}

/// Divert one batch for `session` through the real CLI: a directory at
/// the db path makes the open fail, so the batch goes to sessions/.
fn divert(home: &Path, session: &str, uid: &str) {
    let line = format!("[{{\"role\":\"user\",\"content\":\"kept {uid}\",\"uid\":\"{uid}\"}}]\n");
    let (code, out, _) = turnsafe(
        &["append", "--home", home.to_str().unwrap(), "--session", session],
        &line,
    );
    assert_eq!(code, 3, "{out}");
    let outcome: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(outcome["diverted"], 1, "{outcome}");
}

/// Another agent runtime's transcript: one JSON object per line with
/// `role` and `content`, no `v`, `uid` or `batch`; named like a session.
const FOREIGN: &str = concat!(
    "{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"}\n",
    "{\"role\":\"user\",\"content\":\"What is the capital of France?\"}\n",
    "{\"role\":\"assistant\",\"content\":\"Paris.\",\"tool_calls\":[]}\n",
    "not even JSON, and no newline at the end",
);

#[test]
fn another_runtimes_transcript_stays_in_place_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let h = home.to_str().unwrap();
    std::fs::create_dir(home.join("state.db")).unwrap();
    divert(home, "s1", "a1");
    // A crash tore s2's first line; the next divert starts a fresh line.
    let sessions = home.join("sessions");
    std::fs::write(sessions.join("s2.jsonl"), "{\"v\":1,\"session\":\"s2\",\"ui").unwrap();
    divert(home, "s2", "b1");
    std::fs::remove_dir(home.join("state.db")).unwrap();

    let foreign = sessions.join("chat-7f3a.jsonl");
    std::fs::write(&foreign, FOREIGN).unwrap();
    let notes = sessions.join("notes.txt");
    std::fs::write(&notes, "the runtime's own notes\n").unwrap();
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let (foreign_ino, notes_ino) = (ino(&foreign), ino(&notes));

    // doctor counts turnsafe's files only, and lists the others.
    let (code, out, _) = turnsafe(&["doctor", "--home", h, "--json"], "");
    let facts = data_of(&out, "facts");
    assert_eq!(facts["pending_divert_files"], 2, "{out}");
    assert_eq!(
        facts["foreign_files"],
        serde_json::json!(["chat-7f3a.jsonl", "notes.txt"])
    );
    assert_eq!(code, 0, "{out}");

    let (code, out, err) = turnsafe(&["replay", "--home", h, "--json"], "");
    assert_eq!(code, 0, "{err}");
    let summary = data_of(&out, "summary");
    assert_eq!(
        (
            summary["files"].as_u64(),
            summary["replayed"].as_u64(),
            summary["quarantined"].as_u64()
        ),
        (Some(2), Some(2), Some(1)),
        "s1 and s2 replayed, s2's torn first line quarantined: {out}"
    );
    assert_eq!(
        summary["foreign_files"],
        serde_json::json!(["chat-7f3a.jsonl", "notes.txt"])
    );

    // In place, same file, same bytes.
    assert_eq!(std::fs::read(&foreign).unwrap(), FOREIGN.as_bytes());
    assert_eq!(ino(&foreign), foreign_ino);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "the runtime's own notes\n");
    assert_eq!(ino(&notes), notes_ino);
    assert!(!sessions.join("s1.jsonl").exists() && !sessions.join("s2.jsonl").exists());
    let ledger = std::fs::read_to_string(sessions.join("ledger.jsonl")).unwrap();
    assert!(!ledger.contains("chat-7f3a"), "{ledger}");
    let settled: Vec<String> = std::fs::read_dir(sessions.join("settled"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(settled.len(), 2, "{settled:?}");
    assert!(
        settled.iter().all(|n| n.starts_with("s1@") || n.starts_with("s2@")),
        "{settled:?}"
    );

    // A second run still leaves them alone.
    let (code, out, _) = turnsafe(&["replay", "--home", h], "");
    assert_eq!(code, 0);
    assert!(out.contains("left alone: 2 file(s)"), "{out}");
    assert_eq!(std::fs::read(&foreign).unwrap(), FOREIGN.as_bytes());
    let (_, out, _) = turnsafe(&["doctor", "--home", h, "--json"], "");
    let facts = data_of(&out, "facts");
    assert_eq!(facts["pending_divert_files"], 0);
    assert_eq!(
        facts["foreign_files"],
        serde_json::json!(["chat-7f3a.jsonl", "notes.txt"])
    );
}
