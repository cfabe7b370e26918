//! `turnsafe pop`, `clear`, `restore`, `fork` and `show --archived` from
//! the command line: what each prints (`--json` records and human lines),
//! that nothing an edit takes out is lost, and the refusals (a fork into a
//! session that exists, a lease another writer holds).
use std::path::Path;

use serde_json::{Value, json};

fn turnsafe(home: &Path, args: &[&str], stdin: &str) -> (i32, Vec<Value>, String) {
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(args)
        .arg("--home")
        .arg(home)
        .env_remove("TURNSAFE_DB")
        .write_stdin(stdin.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let records = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (
        out.status.code().unwrap_or(-1),
        records,
        stdout + &String::from_utf8_lossy(&out.stderr),
    )
}

fn append(home: &Path, session: &str, tag: &str, n: usize) {
    let msgs: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("{tag} {i}"), "uid": format!("{tag}-{i}")}))
        .collect();
    let (code, _, text) = turnsafe(
        home,
        &["append", "--session", session],
        &format!("{}\n", Value::Array(msgs)),
    );
    assert_eq!(code, 0, "{text}");
}

fn shown(home: &Path, session: &str) -> Vec<Value> {
    let (code, records, text) = turnsafe(home, &["show", "--session", session, "--json"], "");
    assert_eq!(code, 0, "{text}");
    records
}

#[test]
fn pop_clear_restore_and_show_archived() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    append(&home, "s1", "a", 3);

    let (code, popped, text) = turnsafe(&home, &["pop", "--session", "s1", "--json"], "");
    assert_eq!(code, 0, "{text}");
    assert_eq!(popped[0]["type"], "popped");
    assert_eq!(popped[0]["data"]["uid"], "a-2");
    assert_eq!(popped[0]["data"]["message"]["content"], "a 2");
    let (code, _, human) = turnsafe(&home, &["pop", "--session", "s1"], "");
    assert_eq!(code, 0);
    assert!(human.contains("a 1"), "{human}");

    let (code, archived, _) = turnsafe(&home, &["show", "--session", "s1", "--archived", "--json"], "");
    assert_eq!(code, 0);
    let rows: Vec<&Value> = archived.iter().filter(|r| r["type"] == "archived").collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["data"]["uid"], "a-1", "newest archived first");
    for key in ["uid", "seq", "message", "archived_at", "reason"] {
        assert!(rows[0]["data"].get(key).is_some(), "{key} in {}", rows[0]);
    }
    assert_eq!(rows[0]["data"]["reason"], "pop");
    assert_eq!(archived.last().unwrap()["type"], "end", "the summary line goes last");

    let (code, cleared, text) = turnsafe(&home, &["clear", "--session", "s1", "--json"], "");
    assert_eq!(code, 0, "{text}");
    assert_eq!(cleared[0]["type"], "archived");
    assert_eq!(cleared[0]["data"]["uid"], "a-0");
    assert_eq!(cleared.last().unwrap()["data"]["rows"], 1);
    assert_eq!(shown(&home, "s1").len(), 1, "only the end line is left");

    let (code, restored, text) = turnsafe(&home, &["restore", "--session", "s1", "--reason", "pop", "--json"], "");
    assert_eq!(code, 0, "{text}");
    let uids: Vec<&str> = restored
        .iter()
        .filter(|r| r["type"] == "restored")
        .map(|r| r["data"]["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids, ["a-1", "a-2"], "in seq order");
    let (code, _, text) = turnsafe(&home, &["restore", "--session", "s1", "--uid", "a-0"], "");
    assert_eq!(code, 0, "{text}");
    let seqs: Vec<i64> = shown(&home, "s1")
        .iter()
        .filter(|r| r["type"] == "message")
        .map(|r| r["data"]["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3], "every message back at its seq");

    // Usage errors.
    let (code, _, _) = turnsafe(&home, &["restore", "--session", "s1"], "");
    assert_eq!(code, 2, "--uid or --reason is required");
    let (code, _, _) = turnsafe(
        &home,
        &["restore", "--session", "s1", "--reason", "pop", "--since", "soon"],
        "",
    );
    assert_eq!(code, 2);
}

#[test]
fn fork_copies_and_show_prints_the_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    append(&home, "s1", "a", 4);
    let (code, forked, text) = turnsafe(
        &home,
        &["fork", "--session", "s1", "--at", "2", "--to", "s2", "--json"],
        "",
    );
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        forked[0]["data"],
        json!({"source": "s1", "at_seq": 2, "session": "s2", "copied": 2, "already": 0})
    );
    let records = shown(&home, "s2");
    assert_eq!(records.len(), 3);
    assert_eq!(records[2]["type"], "end");
    assert_eq!(records[2]["data"]["forked_from"], json!({"session": "s1", "seq": 2}));
    assert_eq!(shown(&home, "s1").last().unwrap()["data"]["forked_from"], Value::Null);
    let (_, _, human) = turnsafe(&home, &["show", "--session", "s2"], "");
    assert!(human.starts_with("(forked from s1 at seq 2)"), "{human}");

    // A retry stores nothing twice; another fork into it is refused (exit 5).
    let (code, again, _) = turnsafe(
        &home,
        &["fork", "--session", "s1", "--at", "2", "--to", "s2", "--json"],
        "",
    );
    assert_eq!(code, 0);
    assert_eq!(again[0]["data"]["already"], 2);
    let (code, _, text) = turnsafe(&home, &["fork", "--session", "s1", "--at", "3", "--to", "s2"], "");
    assert_eq!(code, 5, "{text}");
    assert!(text.contains("already exists"), "{text}");
}

#[test]
fn an_edit_of_a_session_another_writer_holds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    append(&home, "s1", "a", 2);
    // Another writer holds the session's live lease.
    let conn = rusqlite::Connection::open(home.join("state.db")).unwrap();
    conn.execute(
        "UPDATE sessions SET lease_token = 'theirs', lease_holder = 'other', lease_expires_ms = ?1 WHERE id = 's1'",
        [i64::MAX / 2],
    )
    .unwrap();
    let (code, records, text) = turnsafe(&home, &["pop", "--session", "s1", "--json"], "");
    assert_eq!(code, 5, "{text}");
    assert_eq!(records[0]["type"], "error");
    assert_eq!(records[0]["data"]["cause"], "turn_lease");
    let (code, _, _) = turnsafe(&home, &["clear", "--session", "s1"], "");
    assert_eq!(code, 5);
    assert_eq!(shown(&home, "s1").len(), 3, "nothing was taken out");
}

/// `chattr +i` on `path`, undone on drop.
struct Immutable(std::path::PathBuf);

impl Immutable {
    fn new(path: &Path) -> Result<Immutable, String> {
        let out = std::process::Command::new("chattr")
            .arg("+i")
            .arg(path)
            .output()
            .map_err(|e| format!("chattr: {e}"))?;
        if !out.status.success() {
            return Err(format!("chattr +i: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Immutable(path.to_path_buf()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr").arg("-i").arg(&self.0).output();
    }
}

/// A failed edit prints the policy's copy: what failed, that nothing
/// changed, and what to do; `--json` carries the same copy. Real failures:
/// a lease another writer holds, and a `state.db` made immutable.
#[test]
fn a_failed_edit_says_nothing_changed_in_the_policys_copy() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    append(&home, "s1", "a", 3);
    let before = shown(&home, "s1");

    let conn = rusqlite::Connection::open(home.join("state.db")).unwrap();
    conn.execute(
        "UPDATE sessions SET lease_token = 'theirs', lease_holder = 'other', lease_expires_ms = ?1 WHERE id = 's1'",
        [i64::MAX / 2],
    )
    .unwrap();
    let (code, records, text) = turnsafe(&home, &["clear", "--session", "s1", "--json"], "");
    assert_eq!(code, 5, "{text}");
    let copy = &records[0]["data"]["copy"];
    assert_eq!(copy["code"], "edit.turn_lease", "{text}");
    assert_eq!(copy["title"], "The clear did not happen; nothing changed");
    assert_eq!(copy["details"]["session"], "s1");
    assert!(text.contains("Nothing was removed, archived or added"), "{text}");
    assert!(text.contains("  - Then run the clear again."), "{text}");
    conn.execute("UPDATE sessions SET lease_token = NULL, lease_expires_ms = NULL", [])
        .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);

    let db = home.join("state.db");
    let _frozen = turnsafe_tests::require!(Immutable::new(&db));
    for edit in [
        &["pop", "--session", "s1", "--json"][..],
        &["prune", "--keep-last", "1", "--json"],
    ] {
        let (code, records, text) = turnsafe(&home, edit, "");
        assert_ne!(code, 0, "{edit:?} on an immutable state.db: {text}");
        let error = records
            .iter()
            .find(|r| r["type"] == "error")
            .unwrap_or_else(|| panic!("{text}"));
        let copy = &error["data"]["copy"];
        assert!(copy["code"].as_str().is_some_and(|c| c.starts_with("edit.")), "{text}");
        assert!(
            copy["body"].as_str().is_some_and(|b| b.contains("did not happen")),
            "{text}"
        );
        assert!(text.contains(copy["title"].as_str().unwrap()), "{text}");
    }
    assert_eq!(shown(&home, "s1"), before, "nothing changed");
}

/// `search --archived` finds what edits took out, after the transcripts'
/// hits and marked as archived (reason, time); without it, nothing
/// archived is found. Plain words and raw FTS5 both reach the archive.
#[test]
fn search_archived_finds_what_edits_took_out() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    append(&home, "s1", "kiwi", 3);
    append(&home, "s2", "kiwi", 1);
    let (code, _, text) = turnsafe(&home, &["pop", "--session", "s1"], "");
    assert_eq!(code, 0, "{text}");
    let (code, _, text) = turnsafe(&home, &["clear", "--session", "s2"], "");
    assert_eq!(code, 0, "{text}");

    let hits = |args: &[&str]| {
        let mut full = vec!["search"];
        full.extend_from_slice(args);
        let (code, records, text) = turnsafe(&home, &full, "");
        assert_eq!(code, 0, "{text}");
        assert_eq!(records.last().unwrap()["type"], "end", "{text}");
        records
            .into_iter()
            .filter(|r| r["type"] == "hit")
            .map(|r| r["data"].clone())
            .collect::<Vec<_>>()
    };
    let active = hits(&["kiwi", "--json"]);
    assert_eq!(active.len(), 2, "{active:?}");
    assert!(active.iter().all(|h| h.get("archived").is_none()), "{active:?}");

    for query in [
        &["kiwi", "--json", "--archived"][..],
        &["--fts5", "kiw*", "--json", "--archived"],
    ] {
        let all = hits(query);
        let uids: Vec<&str> = all.iter().map(|h| h["uid"].as_str().unwrap()).collect();
        assert_eq!(uids.len(), 4, "{query:?}: {all:?}");
        assert!(
            all[..2].iter().all(|h| h.get("archived").is_none()),
            "active hits first: {all:?}"
        );
        let archived: Vec<(&str, &str)> = all[2..]
            .iter()
            .map(|h| {
                assert_eq!(h["archived"], true, "{h}");
                assert!(h["archived_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{h}");
                (h["uid"].as_str().unwrap(), h["reason"].as_str().unwrap())
            })
            .collect();
        // Most recently archived first: the clear came after the pop.
        assert_eq!(archived, [("kiwi-0", "clear"), ("kiwi-2", "pop")], "{query:?}");
        assert_eq!(all[2]["session"], "s2");
    }

    let scoped = hits(&["kiwi", "--json", "--archived", "--session", "s1", "--limit", "3"]);
    assert_eq!(scoped.len(), 3, "{scoped:?}");
    assert_eq!(scoped[2]["reason"], "pop");
    let (code, _, human) = turnsafe(&home, &["search", "kiwi", "--archived"], "");
    assert_eq!(code, 0);
    assert!(human.contains("[archived pop "), "{human}");
}
