//! The crash torture with four writers at once on one home: `s1` and `s2`
//! have a writer each, `s3` has two, so one of them holds the session's
//! turn lease and the other is fenced. Each iteration takes the next crash
//! point, as the one-writer torture does, and arms most of the writers
//! with it (each dies at its n-th hit of the point), with random delays at
//! every boundary, WAL write faults for some, and now and then a retired
//! generation while they run.
//!
//! Then the client does what the outcomes tell it to: every batch that was
//! handed back (fenced) or never answered (killed) is resent with its
//! uids, at once, by a fresh writer per session: a dead holder's lease ends
//! on the evidence that its process is gone, never by waiting it out (the
//! lease is the default 30 s, and a resend fenced by it is a failure). The store is reopened, `turnsafe replay` runs (and is
//! killed first at the replay points), every capture a retired generation
//! left is checked to hold nothing the database lacks and settled, and
//! everything is recounted from disk, with a read-only connection of our
//! own, not through the binary under test:
//!
//! - every acknowledged message (persisted, or diverted with a receipt, by
//!   a writer or at its resend) is stored exactly once, and nothing is
//!   stored that was not sent or stored twice;
//! - every diverted line settled as `replayed` or `duplicate`, none
//!   quarantined, none left pending;
//! - every outcome adds up, and a fenced batch was handed back, never
//!   diverted;
//! - no session holds two messages at one `seq`;
//! - every process ended as the README says it must: a writer is killed
//!   only by the crash point it was armed with (SIGKILL), and otherwise
//!   exits 0 when every batch was persisted and 3 when one was not, having
//!   answered every batch with a line of JSON; the resending client the
//!   same; the reopen (no batch) exits 0 and prints nothing; a replay
//!   exits 0, or is killed only at its armed crash point; a dismiss of a
//!   capture exits 0.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use serde_json::{Value, json};

use super::{POINTS, Rng, Stats, append_command, replay, retire_sidecars, settle_captures, stored};

/// The session of each writer.
pub const WRITERS: [&str; 4] = ["s1", "s2", "s3", "s3"];
const SESSIONS: [&str; 3] = ["s1", "s2", "s3"];
/// Every writer's lease TTL (seconds): the default. A killed holder's lease
/// on `s3` ends on the evidence that it is gone, so the client's resend,
/// started the moment the writers have ended, takes it over at once.
const LEASE_TTL: &str = "30";

struct Batch {
    session: &'static str,
    line: String,
    uids: Vec<String>,
}

/// What one writer printed before it ended, and how it ended.
struct Ran {
    outcomes: Vec<Value>,
    /// Lines it printed that were not JSON (each one a failure).
    garbage: Vec<String>,
    status: ExitStatus,
}

impl Ran {
    /// Killed by a crash point (which SIGKILLs the process).
    fn killed(&self) -> bool {
        self.status.signal() == Some(libc::SIGKILL)
    }
}

fn writer_command(home: &Path, w: usize, crash: Option<String>, fault_every: Option<u64>) -> Command {
    let mut cmd = append_command(home, WRITERS[w], crash, fault_every);
    cmd.args(["--holder", &format!("w{w}"), "--lease-ttl", LEASE_TTL]);
    cmd
}

/// The next line the writer printed: `None` at the end of its output,
/// `Err` with the line when it is not JSON.
fn read_outcome(reader: &mut BufReader<ChildStdout>) -> Option<Result<Value, String>> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(n) if n > 0 => Some(serde_json::from_str(&line).map_err(|_| line)),
        _ => None,
    }
}

/// What a process that ended with `status` and printed `outcomes` for
/// `batches` batches must have done, by the README: killed only by the
/// crash point it was armed with; otherwise every batch answered, and exit
/// 0 when every one was persisted, 3 when one was not.
fn check_append_exit(
    what: &str,
    status: ExitStatus,
    armed: bool,
    batches: usize,
    outcomes: &[Value],
) -> Option<String> {
    if let Some(signal) = status.signal() {
        return (!(armed && signal == libc::SIGKILL)).then(|| {
            format!(
                "{what}: killed by signal {signal}{}",
                if armed { "" } else { " with no crash point armed" }
            )
        });
    }
    if outcomes.len() != batches {
        return Some(format!(
            "{what}: ended ({status}) having answered {} of {batches} batches",
            outcomes.len()
        ));
    }
    let expected = if outcomes.iter().all(|o| o["persisted"] == true) {
        0
    } else {
        3
    };
    (status.code() != Some(expected))
        .then(|| format!("{what}: ended with {status}, not exit {expected} (0: every batch persisted, 3: one was not)"))
}

/// Drive one writer: its first batch; then, once every writer has had its
/// first answer (and the generation may have been retired), the rest,
/// queued at once.
fn drive(mut child: Child, lines: Vec<String>, first: mpsc::Sender<()>, go: mpsc::Receiver<()>) -> Ran {
    let mut stdin: Option<ChildStdin> = child.stdin.take();
    let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
    let mut outcomes = Vec::new();
    let mut garbage = Vec::new();
    if let (Some(s), Some(l)) = (stdin.as_mut(), lines.first()) {
        let _ = writeln!(s, "{l}");
        let _ = s.flush();
        match read_outcome(&mut reader) {
            Some(Ok(o)) => outcomes.push(o),
            Some(Err(line)) => garbage.push(line),
            None => {}
        }
    }
    let _ = first.send(());
    drop(first);
    let _ = go.recv();
    let rest = lines.get(1..).unwrap_or_default().to_vec();
    let feeder = stdin.take().map(|mut s| {
        std::thread::spawn(move || {
            for l in rest {
                if writeln!(s, "{l}").is_err() {
                    break;
                }
            }
        })
    });
    while let Some(line) = read_outcome(&mut reader) {
        match line {
            Ok(o) => outcomes.push(o),
            Err(line) => garbage.push(line),
        }
    }
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let status = child.wait().expect("wait");
    Ran {
        outcomes,
        garbage,
        status,
    }
}

/// A writer with no crash point and no faults: the client resending.
struct Client {
    child: Child,
    stdin: ChildStdin,
    reader: BufReader<ChildStdout>,
    /// Every outcome it printed, for its exit code.
    outcomes: Vec<Value>,
    /// Batches written to it.
    sent: usize,
}

impl Client {
    fn start(home: &Path, session: &str) -> Client {
        let mut cmd = append_command(home, session, None, None);
        cmd.args(["--holder", "client", "--lease-ttl", LEASE_TTL]);
        let mut child = cmd.spawn().expect("spawn append");
        let stdin = child.stdin.take().expect("stdin");
        let reader = BufReader::new(child.stdout.take().expect("stdout"));
        Client {
            child,
            stdin,
            reader,
            outcomes: Vec::new(),
            sent: 0,
        }
    }
    /// Its answer: `None` when it printed nothing more (it died), `Err`
    /// with the line when that was not JSON.
    fn send(&mut self, line: &str) -> Option<Result<Value, String>> {
        writeln!(self.stdin, "{line}").ok()?;
        self.stdin.flush().ok()?;
        self.sent += 1;
        let answer = read_outcome(&mut self.reader);
        if let Some(Ok(o)) = &answer {
            self.outcomes.push(o.clone());
        }
        answer
    }
    /// Close its stdin and wait: no crash point is armed, so it must exit
    /// 0 when it persisted every batch and 3 when it did not (a fenced
    /// batch it then sent again counts), having answered each one.
    fn finish(self, what: &str) -> Option<String> {
        drop(self.stdin);
        let mut child = self.child;
        let status = child.wait().expect("wait");
        check_append_exit(what, status, false, self.sent, &self.outcomes)
    }
}

/// Reopen the store (which recovers the WAL) with a writer given no batch:
/// it must print nothing and exit 0.
fn reopen(home: &Path) -> Option<String> {
    let out = append_command(home, "s1", None, None)
        .stdin(Stdio::null())
        .output()
        .expect("spawn append");
    (out.status.code() != Some(0) || !out.stdout.is_empty()).then(|| {
        format!(
            "the reopen ended with {}, printing {:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn acknowledged(o: &Value) -> bool {
    o["persisted"] == true || o["receipt"].is_object()
}

/// What every outcome must say, whatever happened.
fn check_outcome(what: &str, batch: &Batch, o: &Value, stats: &mut Stats) {
    let n = batch.uids.len() as u64;
    let count = |k: &str| o[k].as_u64().unwrap_or(u64::MAX);
    let mut bad = |why: &str| stats.failures.push(format!("{what}: {why}: {o}"));
    if o["uids"] != json!(batch.uids) {
        bad("the outcome names other uids");
    }
    if count("committed")
        .saturating_add(count("diverted"))
        .saturating_add(count("handed_back"))
        != n
    {
        bad("committed + diverted + handed_back is not the batch");
    }
    if o["persisted"] == true && count("committed") != n {
        bad("persisted, but not all committed");
    }
    if o["receipt"].is_object() && count("diverted") != n {
        bad("a receipt, but not all diverted");
    }
    if o["cause"] == "turn_lease" && (count("handed_back") != n || !o["receipt"].is_null()) {
        bad("fenced, but not handed back whole");
    }
    if o["cause"] == "turn_lease" {
        stats.fenced += 1;
    }
    if o["cause"] == "locked" {
        stats.locked += 1;
    }
}

/// One iteration of four writers.
pub fn iteration(i: u64, rng: &mut Rng, stats: &mut Stats) {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path();
    // The points in turn, and the n-th hit going 1, 2, 3 from round to
    // round, as in the one-writer torture.
    let round = i / POINTS.len() as u64;
    let point = POINTS[(i % POINTS.len() as u64) as usize];
    let n = 1 + round % 3;
    let crash = format!("{point}:{n}");
    let replay_point = point.starts_with("replay.");
    let needs_faults = point.starts_with("divert.") || replay_point;
    let faulty = needs_faults || (n > 1 && rng.below(3) != 0);
    let retire = point.starts_with("capture.") || rng.below(8) == 0;
    // Most writers die at the point (at least one); at a replay point, the
    // replay does.
    let mut armed: Vec<bool> = (0..WRITERS.len()).map(|_| !replay_point && rng.below(4) != 0).collect();
    if !replay_point && !armed.contains(&true) {
        armed[rng.below(WRITERS.len() as u64) as usize] = true;
    }
    let faults: Vec<Option<u64>> = (0..WRITERS.len())
        .map(|_| (faulty && (needs_faults || rng.below(2) == 0)).then(|| 5 + rng.below(10)))
        .collect();
    let batches: Vec<Vec<Batch>> = WRITERS
        .iter()
        .enumerate()
        .map(|(w, session)| {
            (0..2 + rng.below(4))
                .map(|b| {
                    let uids: Vec<String> = (0..1 + rng.below(3)).map(|m| format!("i{i}-w{w}-b{b}-m{m}")).collect();
                    let msgs: Vec<Value> = uids
                        .iter()
                        .map(|u| json!({"role": "user", "content": format!("iteration {i} {u}"), "uid": u}))
                        .collect();
                    Batch {
                        session,
                        line: Value::Array(msgs).to_string(),
                        uids,
                    }
                })
                .collect()
        })
        .collect();
    let sent: BTreeSet<&str> = batches
        .iter()
        .flatten()
        .flat_map(|b| b.uids.iter().map(String::as_str))
        .collect();
    let label = format!("iteration {i} ({crash}, armed {armed:?}, faults {faults:?}, retire {retire})");

    // All four at once.
    let (first_tx, first_rx) = mpsc::channel();
    let mut gos = Vec::new();
    let mut drivers = Vec::new();
    for (w, writer_batches) in batches.iter().enumerate() {
        let child = writer_command(home, w, armed[w].then(|| crash.clone()), faults[w])
            .spawn()
            .expect("spawn append");
        let (go_tx, go_rx) = mpsc::channel();
        gos.push(go_tx);
        let lines = writer_batches.iter().map(|b| b.line.clone()).collect();
        let first = first_tx.clone();
        drivers.push(std::thread::spawn(move || drive(child, lines, first, go_rx)));
    }
    drop(first_tx);
    for _ in 0..WRITERS.len() {
        let _ = first_rx.recv();
    }
    if retire {
        retire_sidecars(home);
    }
    for go in gos {
        let _ = go.send(());
    }
    let runs: Vec<Ran> = drivers.into_iter().map(|d| d.join().expect("writer driver")).collect();

    let mut acked: BTreeSet<&str> = BTreeSet::new();
    let mut pending: BTreeMap<&str, Vec<&Batch>> = BTreeMap::new();
    for (w, run) in runs.iter().enumerate() {
        let what = format!("{label} writer {w}");
        stats.failures.extend(check_append_exit(
            &what,
            run.status,
            armed[w],
            batches[w].len(),
            &run.outcomes,
        ));
        for line in &run.garbage {
            stats
                .failures
                .push(format!("{what} printed a line that is not JSON: {line:?}"));
        }
        if run.killed() && armed[w] {
            stats.kills += 1;
            *stats.by_point.entry(point).or_default() += 1;
        }
        for (b, batch) in batches[w].iter().enumerate() {
            match run.outcomes.get(b) {
                Some(o) => {
                    check_outcome(&format!("{label} writer {w} batch {b}"), batch, o, stats);
                    if acknowledged(o) {
                        acked.extend(batch.uids.iter().map(String::as_str));
                    } else {
                        pending.entry(batch.session).or_default().push(batch);
                    }
                }
                None => pending.entry(batch.session).or_default().push(batch),
            }
        }
    }

    // The client resends what it got back or never heard of, with its uids.
    let mut resent: BTreeSet<&str> = BTreeSet::new();
    for (session, list) in &pending {
        let mut client = Client::start(home, session);
        for batch in list {
            let o = match client.send(&batch.line) {
                Some(Ok(o)) => o,
                Some(Err(line)) => {
                    stats.failures.push(format!(
                        "{label}: the resending writer of {session} printed a line that is not JSON: {line:?}"
                    ));
                    break;
                }
                None => {
                    stats
                        .failures
                        .push(format!("{label}: the resending writer of {session} died"));
                    break;
                }
            };
            check_outcome(&format!("{label} resend to {session}"), batch, &o, stats);
            if acknowledged(&o) {
                resent.extend(batch.uids.iter().map(String::as_str));
            } else {
                // Every writer has ended: no live holder fences the resend.
                stats
                    .failures
                    .push(format!("{label}: resend to {session} not persisted: {o}"));
            }
        }
        stats
            .failures
            .extend(client.finish(&format!("{label}: the resending writer of {session}")));
    }

    // Reopen the store (recovers the WAL), then replay; a replay crash
    // point kills the first replay (`replay` asserts it exits 0 unless
    // killed). Every capture is then checked to hold nothing the database
    // lacks and settled, as in the one-writer torture, and a second
    // replay, which no crash point can kill, finishes the job.
    stats.failures.extend(reopen(home).map(|f| format!("{label}: {f}")));
    if replay_point && replay(home, Some(crash.clone())) {
        stats.kills += 1;
        *stats.by_point.entry(point).or_default() += 1;
    }
    settle_captures(home);
    if replay(home, None) {
        stats.failures.push(format!(
            "{label}: the last replay, with no crash point armed, was killed"
        ));
    }
    check_settled(home, &label, stats);

    // Recount from disk, with our own read-only connection (`stored`).
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for session in SESSIONS {
        let rows = stored(home, session);
        let mut seqs: BTreeMap<i64, u64> = BTreeMap::new();
        for (uid, seq) in rows {
            *counts.entry(uid).or_default() += 1;
            if let Some(s) = seq {
                *seqs.entry(s).or_default() += 1;
            }
        }
        let shared: Vec<i64> = seqs.iter().filter(|(_, c)| **c > 1).map(|(s, _)| *s).collect();
        if !shared.is_empty() {
            stats
                .failures
                .push(format!("{label}: {session} holds two messages at seq {shared:?}"));
        }
    }
    stats.iterations += 1;
    stats.sent += sent.len() as u64;
    stats.acknowledged += acked.len() as u64;
    stats.resent += resent.difference(&acked).count() as u64;
    for u in acked.union(&resent) {
        match counts.get(*u).copied().unwrap_or(0) {
            1 => {}
            0 => {
                stats.lost += 1;
                stats.failures.push(format!("{label}: acknowledged {u} lost"));
            }
            c => {
                stats.duplicated += 1;
                stats
                    .failures
                    .push(format!("{label}: acknowledged {u} stored {c} times"));
            }
        }
    }
    for (u, c) in &counts {
        if !sent.contains(u.as_str()) {
            stats.failures.push(format!("{label}: stored {u} was never sent"));
        } else if !acked.contains(u.as_str()) && !resent.contains(u.as_str()) {
            stats.unacknowledged_stored += 1;
            if *c > 1 {
                stats.duplicated += 1;
                stats
                    .failures
                    .push(format!("{label}: unacknowledged {u} stored {c} times"));
            }
        }
    }
}

/// After the last replay: every diverted line settled as replayed or
/// duplicate in the ledger, nothing quarantined, nothing left pending.
fn check_settled(home: &Path, label: &str, stats: &mut Stats) {
    let sessions = home.join("sessions");
    if let Ok(text) = std::fs::read_to_string(sessions.join("ledger.jsonl")) {
        for line in text.lines() {
            let Ok(entry) = serde_json::from_str::<Value>(line) else {
                stats
                    .failures
                    .push(format!("{label}: a ledger line is not JSON: {line}"));
                continue;
            };
            match entry["state"].as_str() {
                Some("replayed") => stats.replayed += 1,
                Some("duplicate") => stats.duplicate_lines += 1,
                _ => {
                    stats.quarantined += 1;
                    stats
                        .failures
                        .push(format!("{label}: a diverted line was not replayed: {entry}"));
                }
            }
        }
    }
    // A writer killed after creating its divert file and before writing to
    // it leaves the file empty: no line, nothing to replay (replay leaves
    // a file without a divert line alone, as another runtime's).
    let holds_a_line = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .any(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["uid"].is_string()))
    };
    let left: Vec<String> = std::fs::read_dir(&sessions)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| holds_a_line(&e.path()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl") && n != "ledger.jsonl")
        .chain(
            std::fs::read_dir(sessions.join("settling"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| format!("settling/{}", e.file_name().to_string_lossy())),
        )
        .collect();
    if !left.is_empty() {
        stats
            .failures
            .push(format!("{label}: divert files left pending: {left:?}"));
    }
}

/// `iterations` iterations from `seed`, with a summary printed.
pub fn run(iterations: u64, seed: u64) -> Stats {
    println!(
        "multi-writer torture: {} writers on sessions {WRITERS:?}, seed {seed} (replay with TORTURE_SEED={seed}), {iterations} iterations",
        WRITERS.len()
    );
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let mut stats = Stats::default();
    for i in 0..iterations {
        iteration(i, &mut rng, &mut stats);
    }
    println!(
        "multi-writer torture: iterations {}, kills {}, messages sent {}, acknowledged {}, resent and acknowledged {}, \
         lost {}, duplicated {}, unacknowledged but stored {}; batches fenced {}, outcomes locked {}; \
         diverted lines replayed {}, duplicate {}, quarantined {}; seed {seed}; {:.1} s",
        stats.iterations,
        stats.kills,
        stats.sent,
        stats.acknowledged,
        stats.resent,
        stats.lost,
        stats.duplicated,
        stats.unacknowledged_stored,
        stats.fenced,
        stats.locked,
        stats.replayed,
        stats.duplicate_lines,
        stats.quarantined,
        started.elapsed().as_secs_f64()
    );
    println!("kills by point: {:?}", stats.by_point);
    stats
}

/// Fail (panic) unless a run of `iterations` kept every invariant and
/// reached every crash point.
pub fn check(stats: &Stats, iterations: u64) {
    for f in stats.failures.iter().take(30) {
        println!("FAILURE {f}");
    }
    assert!(
        stats.failures.is_empty(),
        "{} failures:\n{}",
        stats.failures.len(),
        stats.failures.join("\n")
    );
    assert_eq!(stats.iterations, iterations);
    assert_eq!((stats.lost, stats.duplicated, stats.quarantined), (0, 0, 0));
    assert!(stats.acknowledged > 0 && stats.resent > 0);
    assert!(stats.fenced > 0, "the writers sharing a session never met the lease");
    assert!(
        stats.kills >= iterations,
        "too few kills to mean anything: {}",
        stats.kills
    );
    // Every crash point was reached and killed a process at least once.
    let missed: Vec<&str> = POINTS
        .iter()
        .copied()
        .filter(|p| !stats.by_point.contains_key(p))
        .collect();
    assert!(
        missed.is_empty(),
        "crash points never hit in {iterations} iterations: {missed:?} (kills by point: {:?})",
        stats.by_point
    );
}
