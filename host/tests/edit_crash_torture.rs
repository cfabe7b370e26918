//! SIGKILL inside every history edit's transaction: `pop`, `clear`,
//! `restore`, `fork` and `prune` from the command line, killed at each of
//! their crash points (`turnsafe_host::failpoint::EDIT_POINTS`: after the
//! rows were copied into the archive and before they leave the transcript,
//! between two rows a restore or a fork writes, before COMMIT, after it).
//!
//! After each kill the home is read with a connection of the test's own,
//! and every session must be exactly as it was before the edit, or exactly
//! as the same edit leaves it when nothing kills it (run on a copy of the
//! home taken before): never half applied, no row lost, none doubled, the
//! archive and the transcript moved together. A kill before COMMIT must
//! leave the session as it was; a kill after COMMIT, as the edit left it.
//! Then the binary reads the home again (`show`) and a retry of an
//! idempotent edit (restore, fork) ends where one run ends.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use turnsafe_host::failpoint::EDIT_POINTS;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnsafe")
}

fn run(home: &Path, args: &[&str], crash: Option<&str>, stdin: &str) -> Output {
    use std::io::Write;
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .arg("--home")
        .arg(home)
        .env_remove("TURNSAFE_DB")
        .env_remove("TURNSAFE_CRASH_AT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(c) = crash {
        cmd.env("TURNSAFE_CRASH_AT", c);
    }
    let mut child = cmd.spawn().expect("spawn turnsafe");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait turnsafe")
}

fn killed(out: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(9)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn append(home: &Path, session: &str, tag: &str, n: usize) {
    let msgs: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("{tag} {i} ü"), "uid": format!("{tag}-{i}")}))
        .collect();
    let out = run(
        home,
        &["append", "--session", session],
        None,
        &format!("{}\n", Value::Array(msgs)),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// What a session is, leaving out what differs between two runs of one
/// edit (times, edit ids, lease holders): its transcript, its archive and
/// its lineage.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SessionState {
    rows: Vec<(String, i64, String)>,
    archived: Vec<(String, i64, String, String)>,
    lineage: Option<(Option<String>, Option<i64>)>,
}

/// Every session of the home, read with the test's own read-only
/// connection; `PRAGMA integrity_check` must say `ok`.
fn state(home: &Path) -> BTreeMap<String, SessionState> {
    let c = rusqlite::Connection::open_with_flags(home.join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("state.db opens read-only");
    c.busy_timeout(std::time::Duration::from_secs(5)).expect("busy timeout");
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(ok, "ok", "{}", home.display());
    let mut out: BTreeMap<String, SessionState> = BTreeMap::new();
    let blank = || SessionState {
        rows: Vec::new(),
        archived: Vec::new(),
        lineage: None,
    };
    let mut s = c
        .prepare("SELECT id, forked_from, forked_at_seq FROM sessions ORDER BY id")
        .unwrap();
    for r in s
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
    {
        let (id, from, at) = r.unwrap();
        out.entry(id).or_insert_with(blank).lineage = Some((from, at));
    }
    let mut s = c
        .prepare("SELECT session_id, uid, seq, item FROM messages ORDER BY session_id, seq, id")
        .unwrap();
    for r in s
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
    {
        let (session, uid, seq, item) = r.unwrap();
        out.entry(session).or_insert_with(blank).rows.push((uid, seq, item));
    }
    let mut s = c
        .prepare("SELECT session_id, uid, seq, item, reason FROM archive ORDER BY session_id, seq, uid, id")
        .unwrap();
    for r in s
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
    {
        let (session, uid, seq, item, reason) = r.unwrap();
        out.entry(session)
            .or_insert_with(blank)
            .archived
            .push((uid, seq, item, reason));
    }
    out
}

fn copy_home(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for name in ["state.db", "state.db-wal"] {
        if from.join(name).exists() {
            std::fs::copy(from.join(name), to.join(name)).unwrap();
        }
    }
}

/// Two sessions with rows and an archive: s1 has 6 rows, 2 of them popped
/// then cleared back in by nothing (archived, reason `pop`); s2 has 4 rows
/// and one cleared session's worth of archive (reason `clear`).
fn seeded(dir: &Path) -> PathBuf {
    let home = dir.join("seed");
    append(&home, "s1", "a", 6);
    for _ in 0..2 {
        let out = run(&home, &["pop", "--session", "s1", "--json"], None, "");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    append(&home, "s2", "b", 3);
    let out = run(&home, &["clear", "--session", "s2"], None, "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    append(&home, "s2", "c", 4);
    home
}

struct Edit {
    name: &'static str,
    args: &'static [&'static str],
    /// The crash points on this edit's path; the others must not fire.
    points: &'static [&'static str],
    /// Hits of each point in one run (prune edits each session alone).
    hits: u32,
    /// A second run after a completed one ends where one run ends.
    idempotent: bool,
}

const EDITS: &[Edit] = &[
    Edit {
        name: "pop",
        args: &["pop", "--session", "s1", "--json"],
        points: &["edit.after_archive", "edit.before_commit", "edit.after_commit"],
        hits: 1,
        idempotent: false,
    },
    Edit {
        name: "clear",
        args: &["clear", "--session", "s2", "--json"],
        points: &["edit.after_archive", "edit.before_commit", "edit.after_commit"],
        hits: 1,
        idempotent: false,
    },
    Edit {
        name: "restore",
        args: &["restore", "--session", "s1", "--reason", "pop", "--json"],
        points: &["edit.between_rows", "edit.before_commit", "edit.after_commit"],
        hits: 1,
        idempotent: true,
    },
    Edit {
        name: "fork",
        args: &["fork", "--session", "s2", "--at", "6", "--to", "s3", "--json"],
        points: &["edit.between_rows", "edit.before_commit", "edit.after_commit"],
        hits: 1,
        idempotent: true,
    },
    Edit {
        name: "prune",
        args: &["prune", "--keep-last", "2", "--json"],
        points: &["edit.after_archive", "edit.before_commit", "edit.after_commit"],
        hits: 2,
        // What one prune archives, the next may delete.
        idempotent: false,
    },
];

/// Each session either as before or as after; with `expect`, exactly the
/// one the point implies for a single-session edit.
fn check(
    what: &str,
    got: &BTreeMap<String, SessionState>,
    before: &BTreeMap<String, SessionState>,
    after: &BTreeMap<String, SessionState>,
    expect: Option<&BTreeMap<String, SessionState>>,
) {
    if let Some(want) = expect {
        assert_eq!(got, want, "{what}");
        return;
    }
    let names: std::collections::BTreeSet<&String> = got.keys().chain(before.keys()).chain(after.keys()).collect();
    for name in names {
        let g = got.get(name);
        assert!(
            g == before.get(name) || g == after.get(name),
            "{what}: session {name} is half edited:\n got    {g:?}\n before {:?}\n after  {:?}",
            before.get(name),
            after.get(name)
        );
    }
}

#[test]
fn no_edit_is_half_applied_under_sigkill_at_any_point() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seeded(dir.path());
    let before = state(&seed);
    assert_eq!(before["s1"].rows.len(), 4);
    assert_eq!(before["s1"].archived.len(), 2);
    assert_eq!(before["s2"].archived.len(), 3);

    let mut kills: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for (e, edit) in EDITS.iter().enumerate() {
        // What the edit does when nothing kills it.
        let clean = dir.path().join(format!("{}-clean", edit.name));
        copy_home(&seed, &clean);
        let out = run(&clean, edit.args, None, "");
        assert_eq!(out.status.code(), Some(0), "{}: {}", edit.name, text(&out));
        let after = state(&clean);
        assert_ne!(after, before, "{}: the edit changes something", edit.name);
        if edit.idempotent {
            let out = run(&clean, edit.args, None, "");
            assert_eq!(out.status.code(), Some(0), "{} again: {}", edit.name, text(&out));
            assert_eq!(state(&clean), after, "{}: a second run changes nothing", edit.name);
        }

        for (p, point) in EDIT_POINTS.iter().enumerate() {
            for n in 1..=edit.hits {
                let what = format!("{} killed at {point}:{n}", edit.name);
                let home = dir.path().join(format!("{e}-{p}-{n}"));
                copy_home(&seed, &home);
                let out = run(&home, edit.args, Some(&format!("{point}:{n}")), "");
                if !edit.points.contains(point) {
                    assert_eq!(out.status.code(), Some(0), "{what}: not on its path: {}", text(&out));
                    assert_eq!(state(&home), after, "{what}");
                    continue;
                }
                assert!(killed(&out), "{what}: not killed: {}", text(&out));
                *kills.entry((edit.name, *point)).or_default() += 1;
                let got = state(&home);
                let expect = match (edit.hits, *point) {
                    (1, "edit.after_commit") => Some(&after),
                    (1, _) => Some(&before),
                    _ => None,
                };
                check(&what, &got, &before, &after, expect);

                // The binary reads what the kill left, and a retry of an
                // idempotent edit ends where one run ends.
                let out = run(&home, &["show", "--session", "s1", "--json"], None, "");
                assert_eq!(out.status.code(), Some(0), "{what}: show: {}", text(&out));
                if edit.idempotent {
                    let out = run(&home, edit.args, None, "");
                    let code = out.status.code();
                    assert!(code == Some(0) || code == Some(5), "{what}: retry: {}", text(&out));
                    if code == Some(0) {
                        assert_eq!(state(&home), after, "{what}: the retry ends where one run ends");
                    } else {
                        // The killed writer's lease is still live: the
                        // retry is refused and changes nothing.
                        assert_eq!(state(&home), got, "{what}: a refused retry changes nothing");
                    }
                }
            }
        }
    }
    for edit in EDITS {
        for point in edit.points {
            assert!(
                kills.get(&(edit.name, *point)).copied().unwrap_or(0) >= 1,
                "{} was never killed at {point}: {kills:?}",
                edit.name
            );
        }
    }
}
