//! SIGKILL to the client on PostgreSQL: `turnsafe append --db` and the
//! history edits (`pop`, `clear`, `restore`, `fork`, `prune` with `--db`)
//! killed at each of their crash points, on a real server.
//!
//! Appends (`turnsafe_host::failpoint::PG_POINTS`: after the rows and
//! before COMMIT, after COMMIT before anyone knows the outcome, after the
//! outcomes are decided but before they are printed). Each iteration runs
//! one writer on a fresh database with lines for three sessions given at
//! once (so they group), kills it, then runs `turnsafe replay --db`, and
//! then sends every line again, as a client that got no answer would:
//! - every acknowledged message (printed `persisted`, or with a receipt)
//!   is on the server exactly once after the replay;
//! - after the resend every message sent is there exactly once: an
//!   outcome the kill left unknown is settled by uid, never stored twice;
//! - nothing is on the server that was not sent;
//! - every crash point killed a writer.
//!
//! The killed writer's turn lease stays on its sessions; the replay and
//! the resend find its holder gone from `pg_stat_activity` (the evidence
//! that ends a lease before its TTL) and go on.
//!
//! Edits: each session must afterwards be exactly as before the edit, or
//! exactly as the same edit leaves it when nothing kills it (run on a copy
//! of the database made with `CREATE DATABASE ... TEMPLATE`): never half
//! applied, the archive and the transcript moved together.
//!
//! `TORTURE_SEED` and `TORTURE_ITERATIONS` (default 18) change the run.
#[path = "../../tests/common/pg.rs"]
mod pg;
mod torture;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use torture::Rng;
use turnsafe_host::failpoint::{EDIT_POINTS, PG_POINTS};

const SESSIONS: [&str; 3] = ["alpha", "beta", "gamma"];
const EXIT_REFUSED: i32 = 5;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnsafe")
}

fn killed(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(libc::SIGKILL)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `turnsafe args --home home --db url`, with `crash` armed, `stdin` given.
fn run(home: &Path, url: &str, args: &[&str], crash: Option<&str>, stdin: &str) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .arg("--home")
        .arg(home)
        .arg("--db")
        .arg(url)
        .env_remove("TURNSAFE_DB")
        .env_remove("TURNSAFE_CRASH_AT")
        .env("TURNSAFE_JITTER_US", "200")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(c) = crash {
        cmd.env("TURNSAFE_CRASH_AT", c);
    }
    let mut child = cmd.spawn().expect("spawn turnsafe");
    let mut input = child.stdin.take().expect("stdin");
    // A process killed before reading everything closes the pipe.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    child.wait_with_output().expect("wait turnsafe")
}

/// A command refused only because a killed writer's backend is still on
/// the server (exit 5, a live lease) is run again once the server has
/// ended that backend: the server's own list is the evidence awaited,
/// bounded, never a sleep that hopes.
fn run_after_dead_backends(
    server: &pg::PgServer,
    db: &str,
    home: &Path,
    url: &str,
    args: &[&str],
    stdin: &str,
) -> Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = run(home, url, args, None, stdin);
        if out.status.code() != Some(EXIT_REFUSED) || std::time::Instant::now() > deadline {
            return out;
        }
        // Wait until no backend but ours is connected to the database.
        let mut admin = server.admin("postgres");
        while std::time::Instant::now() < deadline
            && admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&db],
                )
                .map(|r| r.get::<_, i64>(0) > 0)
                .unwrap_or(true)
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

struct Sent {
    /// Per line: its session, and each message's uid and content.
    lines: Vec<(String, Vec<(String, String)>)>,
}

impl Sent {
    fn new(iteration: u64, rng: &mut Rng) -> Sent {
        let n = 4 + rng.below(8);
        let lines = (0..n)
            .map(|l| {
                let session = SESSIONS[rng.below(SESSIONS.len() as u64) as usize].to_string();
                let messages = (0..1 + rng.below(3))
                    .map(|m| {
                        let uid = format!("i{iteration}-l{l}-m{m}");
                        (uid.clone(), format!("content of {uid} ü"))
                    })
                    .collect();
                (session, messages)
            })
            .collect();
        Sent { lines }
    }

    fn stdin(&self) -> String {
        self.lines
            .iter()
            .map(|(session, messages)| {
                let messages: Vec<Value> = messages
                    .iter()
                    .map(|(uid, content)| json!({"role": "user", "content": content, "uid": uid}))
                    .collect();
                json!({"session": session, "messages": messages}).to_string() + "\n"
            })
            .collect()
    }

    fn uids(&self) -> BTreeSet<String> {
        self.lines
            .iter()
            .flat_map(|(_, m)| m.iter().map(|(u, _)| u.clone()))
            .collect()
    }
}

/// uid -> how many times it is stored, over every session of `db`.
fn recount(server: &pg::PgServer, db: &str) -> BTreeMap<String, i64> {
    server
        .admin(db)
        .query("SELECT uid, count(*) FROM messages GROUP BY uid", &[])
        .map(|rows| rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
        .unwrap_or_default()
}

#[test]
fn a_killed_pg_writer_loses_and_duplicates_nothing_acknowledged() {
    let server = pg_or_skip!();
    let iterations: u64 = std::env::var("TORTURE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(18);
    let seed = torture::seed_from_env_or(11);
    let mut rng = Rng::new(seed);
    let mut by_point: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut sent_n, mut acked_n) = (0usize, 0usize);
    let mut failures = Vec::new();

    for i in 0..iterations {
        let db = server.create_db(&format!("kill{i}"));
        let url = server.url(&db);
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path();
        let sent = Sent::new(i, &mut rng);
        let point = PG_POINTS[(i % PG_POINTS.len() as u64) as usize];
        let crash = format!("{point}:{}", 1 + rng.below(2));
        let what = format!("iteration {i} (seed {seed}, {crash})");

        let out = run(home, &url, &["append"], Some(&crash), &sent.stdin());
        if killed(&out.status) {
            *by_point.entry(point).or_default() += 1;
        }
        let answers: Vec<Value> = BufReader::new(&out.stdout[..])
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| turnsafe_host::json_in::value(&l).ok())
            .collect();
        let mut acked = BTreeSet::new();
        for (answer, (session, messages)) in answers.iter().zip(&sent.lines) {
            if answer["session"] != json!(session) {
                failures.push(format!("{what}: an answer out of order: {answer}"));
            }
            if answer["persisted"] == json!(true) || !answer["receipt"].is_null() {
                acked.extend(messages.iter().map(|(uid, _)| uid.clone()));
            }
        }

        let replay = run_after_dead_backends(&server, &db, home, &url, &["replay"], "");
        if !replay.status.success() {
            failures.push(format!("{what}: replay: {}", text(&replay)));
        }
        let counts = recount(&server, &db);
        for uid in &acked {
            let n = counts.get(uid).copied().unwrap_or(0);
            if n != 1 {
                failures.push(format!("{what}: acknowledged {uid} stored {n} times after the replay"));
            }
        }
        let all = sent.uids();
        for (uid, n) in &counts {
            if !all.contains(uid) {
                failures.push(format!("{what}: {uid} is stored and was never sent"));
            } else if *n > 1 {
                failures.push(format!("{what}: {uid} stored {n} times"));
            }
        }

        // The client sends what it got no answer for again (all of it: a
        // resend of what is stored is an idempotent no-op).
        let resend = run_after_dead_backends(&server, &db, home, &url, &["append"], &sent.stdin());
        let persisted = String::from_utf8_lossy(&resend.stdout)
            .lines()
            .filter(|l| l.contains("\"persisted\":true"))
            .count();
        if !resend.status.success() || persisted != sent.lines.len() {
            failures.push(format!("{what}: the resend: {}", text(&resend)));
        }
        let counts = recount(&server, &db);
        for uid in &all {
            let n = counts.get(uid).copied().unwrap_or(0);
            if n != 1 {
                failures.push(format!("{what}: after the resend {uid} is stored {n} times"));
            }
        }
        sent_n += all.len();
        acked_n += acked.len();
    }

    eprintln!(
        "pg kill torture: seed {seed}, {iterations} iterations, kills {by_point:?}, {sent_n} messages sent, \
         {acked_n} acknowledged before the kill, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let missed: Vec<&&str> = PG_POINTS.iter().filter(|p| !by_point.contains_key(**p)).collect();
    assert!(missed.is_empty(), "never killed at {missed:?} ({by_point:?})");
}

/// What a session is, leaving out what differs between two runs of one
/// edit (times, edit ids, lease holders).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SessionState {
    rows: Vec<(String, i64, String)>,
    archived: Vec<(String, i64, String, String)>,
    lineage: Option<(Option<String>, Option<i64>)>,
}

fn state(server: &pg::PgServer, db: &str) -> BTreeMap<String, SessionState> {
    let mut c = server.admin(db);
    let mut out: BTreeMap<String, SessionState> = BTreeMap::new();
    let blank = || SessionState {
        rows: Vec::new(),
        archived: Vec::new(),
        lineage: None,
    };
    for r in c
        .query("SELECT id, forked_from, forked_at_seq FROM sessions ORDER BY id", &[])
        .expect("sessions")
    {
        out.entry(r.get(0)).or_insert_with(blank).lineage = Some((r.get(1), r.get(2)));
    }
    for r in c
        .query(
            "SELECT session_id, uid, seq, item FROM messages ORDER BY session_id, seq, id",
            &[],
        )
        .expect("messages")
    {
        out.entry(r.get(0))
            .or_insert_with(blank)
            .rows
            .push((r.get(1), r.get(2), r.get(3)));
    }
    for r in c
        .query(
            "SELECT session_id, uid, seq, item, reason FROM archive ORDER BY session_id, seq, uid, id",
            &[],
        )
        .expect("archive")
    {
        out.entry(r.get(0))
            .or_insert_with(blank)
            .archived
            .push((r.get(1), r.get(2), r.get(3), r.get(4)));
    }
    out
}

/// A copy of database `from` named `to` (no session may be connected to
/// `from`: each command's connection ended with its process).
fn copy_db(server: &pg::PgServer, from: &str, to: &str) -> String {
    let mut admin = server.admin("postgres");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match admin.batch_execute(&format!("CREATE DATABASE {to} TEMPLATE {from}")) {
            Ok(()) => return to.to_string(),
            // A killed client's backend has not yet seen its socket close.
            Err(e) if std::time::Instant::now() < deadline && e.to_string().contains("being accessed") => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => panic!("CREATE DATABASE {to} TEMPLATE {from}: {e}"),
        }
    }
}

struct Edit {
    name: &'static str,
    args: &'static [&'static str],
    points: &'static [&'static str],
    hits: u32,
}

const EDITS: &[Edit] = &[
    Edit {
        name: "pop",
        args: &["pop", "--session", "s1", "--json"],
        points: &["edit.after_archive", "edit.before_commit", "edit.after_commit"],
        hits: 1,
    },
    Edit {
        name: "clear",
        args: &["clear", "--session", "s2", "--json"],
        points: &["edit.after_archive", "edit.before_commit", "edit.after_commit"],
        hits: 1,
    },
    Edit {
        name: "restore",
        args: &["restore", "--session", "s1", "--reason", "pop", "--json"],
        points: &["edit.between_rows", "edit.before_commit", "edit.after_commit"],
        hits: 1,
    },
    Edit {
        name: "fork",
        args: &["fork", "--session", "s2", "--at", "6", "--to", "s3", "--json"],
        points: &["edit.between_rows", "edit.before_commit", "edit.after_commit"],
        hits: 1,
    },
    Edit {
        name: "prune",
        args: &["prune", "--keep-last", "2", "--json"],
        points: &["edit.after_archive", "edit.before_commit", "edit.after_commit"],
        hits: 2,
    },
];

fn append(home: &Path, url: &str, session: &str, tag: &str, n: usize) {
    let msgs: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("{tag} {i} ü"), "uid": format!("{tag}-{i}")}))
        .collect();
    let out = run(
        home,
        url,
        &["append", "--session", session],
        None,
        &format!("{}\n", Value::Array(msgs)),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn no_pg_edit_is_half_applied_under_sigkill_at_any_point() {
    let server = pg_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    // s1: 6 rows, 2 popped (archived, reason `pop`); s2: a cleared
    // session's archive, then 4 rows.
    let seed_db = server.create_db("editseed");
    let seed_url = server.url(&seed_db);
    append(home, &seed_url, "s1", "a", 6);
    for _ in 0..2 {
        let out = run(home, &seed_url, &["pop", "--session", "s1", "--json"], None, "");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    append(home, &seed_url, "s2", "b", 3);
    let out = run(home, &seed_url, &["clear", "--session", "s2"], None, "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    append(home, &seed_url, "s2", "c", 4);
    let before = state(&server, &seed_db);
    assert_eq!((before["s1"].rows.len(), before["s1"].archived.len()), (4, 2));
    assert_eq!(before["s2"].archived.len(), 3);

    let mut kills: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for (e, edit) in EDITS.iter().enumerate() {
        let clean = copy_db(&server, &seed_db, &format!("clean{e}"));
        let out = run(home, &server.url(&clean), edit.args, None, "");
        assert_eq!(out.status.code(), Some(0), "{}: {}", edit.name, text(&out));
        let after = state(&server, &clean);
        assert_ne!(after, before, "{}: the edit changes something", edit.name);

        for (p, point) in EDIT_POINTS.iter().enumerate() {
            for n in 1..=edit.hits {
                let what = format!("{} killed at {point}:{n}", edit.name);
                let db = copy_db(&server, &seed_db, &format!("e{e}p{p}n{n}"));
                let url = server.url(&db);
                let out = run(home, &url, edit.args, Some(&format!("{point}:{n}")), "");
                if !edit.points.contains(point) {
                    assert_eq!(out.status.code(), Some(0), "{what}: not on its path: {}", text(&out));
                    assert_eq!(state(&server, &db), after, "{what}");
                    continue;
                }
                assert!(killed(&out.status), "{what}: not killed: {}", text(&out));
                *kills.entry((edit.name, *point)).or_default() += 1;
                let got = state(&server, &db);
                let expect = match (edit.hits, *point) {
                    (1, "edit.after_commit") => Some(&after),
                    (1, _) => Some(&before),
                    _ => None,
                };
                match expect {
                    Some(want) => assert_eq!(&got, want, "{what}"),
                    None => {
                        let names: BTreeSet<&String> = got.keys().chain(before.keys()).chain(after.keys()).collect();
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
                }
                // The server reads what the kill left.
                let out = run(home, &url, &["show", "--session", "s1", "--json"], None, "");
                assert_eq!(out.status.code(), Some(0), "{what}: show: {}", text(&out));
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
