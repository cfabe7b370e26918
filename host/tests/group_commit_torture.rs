//! SIGKILL inside a group commit: between two batches' savepoints, before
//! COMMIT, after COMMIT, and after the outcomes are decided but before
//! they are printed. Each iteration runs `turnsafe append` without
//! `--session` on a fresh home, writes every line before the writer reads
//! any (so they group), and kills it at one point; then `turnsafe replay`
//! runs and the store is recounted from disk:
//! - every acknowledged message (its batch printed `persisted`, or a
//!   receipt) is stored exactly once;
//! - no message is stored twice, under any uid;
//! - every crash point killed a writer at least once (`group.between_batches`
//!   is reached only inside a transaction of more than one batch).
//!
//! At random a WAL write fault is armed too, so some groups fail at COMMIT
//! and their batches are diverted, each with its own receipt.
//! `TORTURE_SEED` and `TORTURE_ITERATIONS` (default 40) change the run.
mod torture;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use torture::Rng;
use turnsafe_host::failpoint::GROUP_POINTS;

const SESSIONS: [&str; 3] = ["alpha", "beta", "gamma"];

struct Sent {
    /// Per line: its session, and each message's uid and content.
    lines: Vec<(String, Vec<(String, String)>)>,
}

fn lines_for(iteration: u64, rng: &mut Rng) -> Sent {
    let n = 6 + rng.below(10);
    let lines = (0..n)
        .map(|l| {
            let session = SESSIONS[rng.below(SESSIONS.len() as u64) as usize].to_string();
            let size = 1 + rng.below(4);
            let messages = (0..size)
                .map(|m| {
                    let uid = format!("i{iteration}-l{l}-m{m}");
                    (uid.clone(), format!("content of {uid}"))
                })
                .collect();
            (session, messages)
        })
        .collect();
    Sent { lines }
}

fn line_text(session: &str, messages: &[(String, String)]) -> String {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(uid, content)| json!({"role": "user", "content": content, "uid": uid}))
        .collect();
    json!({"session": session, "messages": messages}).to_string()
}

/// Run one writer; return its printed answers and whether it was killed.
fn run_writer(home: &Path, sent: &Sent, crash: &str, fault_every: Option<u64>) -> (Vec<Value>, bool) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_turnsafe"));
    cmd.args(["append", "--home"])
        .arg(home)
        .env("TURNSAFE_CRASH_AT", crash)
        .env("TURNSAFE_JITTER_US", "200")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(k) = fault_every {
        cmd.args(["--fault-wal-write-every", &k.to_string()]);
    }
    let mut child = cmd.spawn().expect("spawn turnsafe append");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        let all: String = sent.lines.iter().map(|(s, m)| line_text(s, m) + "\n").collect();
        // A writer killed before reading everything closes the pipe.
        let _ = stdin.write_all(all.as_bytes());
    }
    let answers: Vec<Value> = BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let status = child.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    (answers, status.signal() == Some(libc::SIGKILL))
}

/// Every stored message: uid -> times stored, and content -> times stored.
fn recount(home: &Path) -> (HashMap<String, u64>, HashMap<String, u64>) {
    let db = home.join("state.db");
    let mut by_uid = HashMap::new();
    let mut by_content = HashMap::new();
    if !db.exists() {
        return (by_uid, by_content);
    }
    let conn = rusqlite::Connection::open(db).expect("open state.db");
    let mut stmt = conn.prepare("SELECT uid, content FROM messages").expect("prepare");
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)))
        .expect("query");
    for row in rows {
        let (uid, content) = row.expect("row");
        *by_uid.entry(uid).or_insert(0) += 1;
        *by_content.entry(content.unwrap_or_default()).or_insert(0) += 1;
    }
    (by_uid, by_content)
}

#[test]
fn a_kill_inside_a_group_commit_loses_and_duplicates_nothing_acknowledged() {
    let iterations: u64 = std::env::var("TORTURE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let seed = torture::seed_from_env_or(7);
    let mut rng = Rng::new(seed);
    let (mut kills, mut sent_n, mut acked_n) = (0u64, 0u64, 0u64);
    let mut by_point: BTreeMap<&str, u64> = BTreeMap::new();
    let mut failures = Vec::new();

    for i in 0..iterations {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let sent = lines_for(i, &mut rng);
        let point = GROUP_POINTS[(i % GROUP_POINTS.len() as u64) as usize];
        let nth = 1 + rng.below(3);
        let fault = (rng.below(4) == 0).then(|| 2 + rng.below(6));
        let (answers, killed) = run_writer(&home, &sent, &format!("{point}:{nth}"), fault);
        if killed {
            kills += 1;
            *by_point.entry(point).or_insert(0) += 1;
        }

        // Acknowledged: printed persisted, or diverted with a receipt.
        let mut acked = BTreeSet::new();
        for (answer, (session, messages)) in answers.iter().zip(&sent.lines) {
            if answer["session"] != json!(session) {
                failures.push(format!("iteration {i}: answer out of order: {answer}"));
            }
            if answer["persisted"] == json!(true) || !answer["receipt"].is_null() {
                acked.extend(messages.iter().map(|(uid, _)| uid.clone()));
            }
        }

        let replay = Command::new(env!("CARGO_BIN_EXE_turnsafe"))
            .args(["replay", "--force", "--home"])
            .arg(&home)
            .output()
            .expect("run replay");
        if !replay.status.success() && home.join("sessions").exists() {
            failures.push(format!(
                "iteration {i}: replay failed: {}",
                String::from_utf8_lossy(&replay.stderr)
            ));
        }

        let (by_uid, by_content) = recount(&home);
        for uid in &acked {
            let n = by_uid.get(uid).copied().unwrap_or(0);
            if n != 1 {
                failures.push(format!(
                    "iteration {i} (seed {seed}, {point}:{nth}, fault {fault:?}): acknowledged {uid} stored {n} times"
                ));
            }
        }
        for (content, n) in &by_content {
            if *n > 1 {
                failures.push(format!("iteration {i}: {content:?} stored {n} times"));
            }
        }
        for (uid, n) in &by_uid {
            if *n > 1 {
                failures.push(format!("iteration {i}: uid {uid} stored {n} times"));
            }
        }
        sent_n += sent.lines.iter().map(|(_, m)| m.len() as u64).sum::<u64>();
        acked_n += acked.len() as u64;
    }

    eprintln!(
        "group commit torture: seed {seed}, {iterations} iterations, {kills} kills {by_point:?}, \
         {sent_n} messages sent, {acked_n} acknowledged, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(acked_n > 0, "nothing was ever acknowledged");
    let missed: Vec<&&str> = GROUP_POINTS.iter().filter(|p| !by_point.contains_key(**p)).collect();
    assert!(
        missed.is_empty(),
        "crash points never hit in {iterations} iterations: {missed:?} ({by_point:?})"
    );
}
