//! The crash torture driver, shared by the tests and the bench. Each
//! iteration runs real `turnsafe` processes in a fresh
//! home and kills one of them with SIGKILL at an effect boundary
//! (`TURNSAFE_CRASH_AT=<point>:<n>`), with random delays at every boundary
//! and, at random, injected WAL write faults so that batches get diverted
//! and retired generations (sidecars deleted after a checkpoint) so that
//! captures run.
//! Then it reopens the store, runs `turnsafe replay`, and recounts.
//!
//! A message is acknowledged when the writer printed `persisted`, or a
//! receipt, before it died. Every acknowledged message must be stored
//! exactly once; any other message at most once. The crash points are
//! taken in turn, so a run of at least `POINTS.len()` iterations tries
//! every one.
//!
//! One writer here (`crash_torture.rs`, 200 iterations; the `torture`
//! bench, 10,000); four at once, two of them on one session, in [`multi`].
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Every crash point the host has: one list, in `turnsafe_host::failpoint`.
pub use turnsafe_host::failpoint::POINTS;

#[derive(Debug, Default)]
pub struct Stats {
    pub iterations: u64,
    pub kills: u64,
    pub sent: u64,
    pub acknowledged: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub unacknowledged_stored: u64,
    pub by_point: BTreeMap<&'static str, u64>,
    pub failures: Vec<String>,
    /// With several writers ([`multi`]): messages resent by the client
    /// after their batch was handed back or never answered, and then
    /// acknowledged.
    pub resent: u64,
    /// Batches a writer got back with `turn_lease` (fenced).
    pub fenced: u64,
    /// Outcomes whose cause was `locked`.
    pub locked: u64,
    /// Diverted lines replay settled, and how.
    pub replayed: u64,
    pub duplicate_lines: u64,
    pub quarantined: u64,
}

pub mod multi;

/// splitmix64: a seeded generator, so `TORTURE_SEED` replays a run.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `TORTURE_SEED`, or a seed from the clock.
pub fn seed_from_env() -> u64 {
    seed_from_env_or(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    )
}

/// `TORTURE_SEED`, or `default`.
pub fn seed_from_env_or(default: u64) -> u64 {
    std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnsafe")
}

/// Run `turnsafe append`, feeding `lines`; return each printed outcome.
/// The process may be killed by its crash point. With `retire`, the WAL is
/// checkpointed and both sidecars deleted after the first batch's answer,
/// so the next batch meets the guard and captures the retired generation.
fn append(
    home: &Path,
    lines: &[String],
    crash: Option<String>,
    fault_every: Option<u64>,
    retire: bool,
) -> (Vec<Value>, bool) {
    let mut child = append_command(home, "s1", crash, fault_every)
        .spawn()
        .expect("spawn append");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
    let mut outcomes = Vec::new();
    let mut rest = lines;
    if retire && !lines.is_empty() {
        let _ = writeln!(stdin, "{}", lines[0]);
        let _ = stdin.flush();
        let mut first = String::new();
        if reader.read_line(&mut first).unwrap_or(0) > 0 {
            if let Ok(v) = serde_json::from_str::<Value>(&first) {
                outcomes.push(v);
            }
            retire_sidecars(home);
        }
        rest = &lines[1..];
    }
    let writer = {
        let rest = rest.to_vec();
        std::thread::spawn(move || {
            for l in rest {
                if writeln!(stdin, "{l}").is_err() {
                    break;
                }
            }
        })
    };
    for line in reader.lines() {
        let Ok(line) = line else { break };
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            outcomes.push(v);
        }
    }
    let _ = writer.join();
    let status = child.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    let killed = status.signal() == Some(9);
    // Killed by its crash point, or done: 0 when every batch was
    // persisted, 3 when one was not. Anything else is a failure.
    assert!(
        killed || matches!(status.code(), Some(0) | Some(3)),
        "turnsafe append ended with {status}"
    );
    (outcomes, killed)
}

/// `turnsafe append` on `session`, its stdin and stdout piped, with random
/// delays at every effect boundary, a crash point (`point:n`) and a WAL
/// write fault every `fault_every` writes when given.
fn append_command(home: &Path, session: &str, crash: Option<String>, fault_every: Option<u64>) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(["append", "--session", session, "--home"])
        .arg(home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd.env("TURNSAFE_JITTER_US", "200");
    if let Some(k) = fault_every {
        cmd.args(["--fault-wal-write-every", &k.to_string()]);
    }
    if let Some(c) = crash {
        cmd.env("TURNSAFE_CRASH_AT", c);
    }
    cmd
}

/// Checkpoint what the writer committed into the main file, then delete
/// the sidecars under it: the generation it holds is retired.
fn retire_sidecars(home: &Path) {
    if let Ok(c) = rusqlite::Connection::open(home.join("state.db")) {
        let _ = c.busy_timeout(std::time::Duration::from_secs(5));
        let _ = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
    for s in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(home.join(s));
    }
}

fn replay(home: &Path, crash: Option<String>) -> bool {
    let mut cmd = Command::new(bin());
    cmd.args(["replay", "--force", "--home"])
        .arg(home)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.env("TURNSAFE_JITTER_US", "200");
    if let Some(c) = crash {
        cmd.env("TURNSAFE_CRASH_AT", c);
    }
    use std::os::unix::process::ExitStatusExt;
    let status = cmd.status().expect("replay");
    let killed = status.signal() == Some(9);
    assert!(
        killed || status.code() == Some(0),
        "turnsafe replay ended with {status}"
    );
    killed
}

/// Settle every capture a retired generation left, after checking it holds
/// no row the database lacks (the torture checkpoints before it retires):
/// dismissing then loses nothing, and the recount reads a whole history.
fn settle_captures(home: &Path) {
    for entry in std::fs::read_dir(home).expect("home").flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("state.db.retired-") || path.join("SETTLED").exists() {
            continue;
        }
        if let Ok(m) = std::fs::read(path.join("manifest.json")) {
            let m: Value = serde_json::from_slice(&m).expect("a capture manifest");
            let held: u64 = m["missing_rows"]
                .as_object()
                .map(|o| o.values().filter_map(Value::as_u64).sum())
                .unwrap_or(0);
            assert_eq!(held, 0, "{name} holds rows the database lacks: {m}");
        }
        let status = Command::new(bin())
            .args(["recover", "--dismiss", "--source"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("recover --dismiss");
        assert_eq!(status.code(), Some(0), "recover --dismiss {name}");
    }
}

fn stored_uids(home: &Path) -> Vec<String> {
    stored(home, "s1").into_iter().map(|(uid, _)| uid).collect()
}

/// The uid and seq of every message stored for `session`, read with our
/// own read-only connection, not through the binary under test.
fn stored(home: &Path, session: &str) -> Vec<(String, Option<i64>)> {
    let db = home.join("state.db");
    if !db.exists() {
        return Vec::new();
    }
    let c = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("state.db opens read-only");
    c.busy_timeout(std::time::Duration::from_secs(5)).expect("busy timeout");
    let mut stmt = c
        .prepare("SELECT uid, seq FROM messages WHERE session_id = ?1 ORDER BY seq, id")
        .expect("the messages table");
    stmt.query_map([session], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?)))
        .expect("query")
        .map(|r| r.expect("a readable row"))
        .collect()
}

/// One iteration; returns whether something was killed.
pub fn iteration(i: u64, rng: &mut Rng, stats: &mut Stats) {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path();
    // Round-robin over the points, so every one of them is tried in every
    // run of at least POINTS.len() iterations; the n-th hit to die at goes
    // 1, 2, 3 from one round to the next, so each point is also tried at
    // its first hit, which every reachable point meets.
    let round = i / POINTS.len() as u64;
    let point = POINTS[(i % POINTS.len() as u64) as usize];
    let n = 1 + round % 3;
    let crash = Some(format!("{point}:{n}"));
    // Divert and replay points need failed writes (diverted batches). The
    // other points meet their first hit for sure without faults.
    let needs_faults = point.starts_with("divert.") || point.starts_with("replay.");
    let faults = needs_faults || (n > 1 && rng.below(3) != 0);
    let fault_every = faults.then(|| 5 + rng.below(10));
    let batches = 2 + rng.below(4);
    let mut lines = Vec::new();
    let mut sent = BTreeSet::new();
    for b in 0..batches {
        let msgs: Vec<Value> = (0..(1 + rng.below(3)))
            .map(|m| {
                let uid = format!("i{i}-b{b}-m{m}");
                sent.insert(uid.clone());
                json!({"role": "user", "content": format!("iteration {i} batch {b} message {m}"), "uid": uid})
            })
            .collect();
        lines.push(Value::Array(msgs).to_string());
    }
    let replay_point = point.starts_with("replay.");
    // Capture points need a retired generation; other iterations get one now and then.
    let retire = point.starts_with("capture.") || rng.below(8) == 0;
    let (outcomes, mut killed) = append(
        home,
        &lines,
        if replay_point { None } else { crash.clone() },
        fault_every,
        retire,
    );
    let mut acked = BTreeSet::new();
    for o in &outcomes {
        let receipt = o["receipt"].is_object();
        if o["persisted"] == true || receipt {
            for u in o["uids"].as_array().into_iter().flatten() {
                if let Some(u) = u.as_str() {
                    acked.insert(u.to_string());
                }
            }
        }
    }
    // Reopen the store (recovers the WAL), then replay; a replay crash
    // point kills the first replay, and a second one finishes the job.
    let (_, _) = append(home, &[], None, None, false);
    if replay_point {
        killed |= replay(home, crash.clone());
    }
    settle_captures(home);
    replay(home, None);
    if killed {
        stats.kills += 1;
        *stats.by_point.entry(point).or_default() += 1;
    }
    let stored = stored_uids(home);
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for u in &stored {
        *counts.entry(u.as_str()).or_default() += 1;
    }
    stats.iterations += 1;
    stats.sent += sent.len() as u64;
    stats.acknowledged += acked.len() as u64;
    for u in &acked {
        match counts.get(u.as_str()).copied().unwrap_or(0) {
            1 => {}
            0 => {
                stats.lost += 1;
                stats.failures.push(format!(
                    "iteration {i} ({point}:{n}, faults {fault_every:?}): acknowledged {u} lost"
                ));
            }
            c => {
                stats.duplicated += 1;
                stats.failures.push(format!(
                    "iteration {i} ({point}:{n}): acknowledged {u} stored {c} times"
                ));
            }
        }
    }
    for (u, c) in &counts {
        if !sent.contains(*u) {
            stats.failures.push(format!("iteration {i}: stored {u} was never sent"));
        } else if !acked.contains(*u) {
            stats.unacknowledged_stored += 1;
            if *c > 1 {
                stats.duplicated += 1;
                stats.failures.push(format!(
                    "iteration {i} ({point}:{n}): unacknowledged {u} stored {c} times"
                ));
            }
        }
    }
}

pub fn run(iterations: u64, seed: u64) -> Stats {
    println!("crash torture: seed {seed} (replay with TORTURE_SEED={seed}), {iterations} iterations");
    let mut rng = Rng::new(seed);
    let mut stats = Stats::default();
    for i in 0..iterations {
        iteration(i, &mut rng, &mut stats);
    }
    println!(
        "crash torture: iterations {}, kills {}, messages sent {}, acknowledged {}, lost {}, duplicated {}, unacknowledged but stored {}",
        stats.iterations,
        stats.kills,
        stats.sent,
        stats.acknowledged,
        stats.lost,
        stats.duplicated,
        stats.unacknowledged_stored
    );
    println!("kills by point: {:?}", stats.by_point);
    stats
}
