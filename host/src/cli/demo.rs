//! `turnsafe demo`: a scripted conversation through the real host, with
//! real failures injected one after another, then a recount from disk that
//! proves every message sent is in exactly one place.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::backend::Backend;
use crate::divert::{self, Receipt};
use crate::exit;
use crate::faultvfs::{self, Fault, FileKind, Op};
use crate::ids::SessionId;
use crate::message::Message;
use crate::store::{SessionStore, StoreOptions};

/// Run a scripted conversation with real injected failures and verify that
/// every message ends committed, diverted with a receipt, or handed back.
///
/// Failures: injected WAL write and fsync errors (fault VFS), SQLITE_FULL
/// (max_page_count), fd exhaustion in a child process (RLIMIT_NOFILE), a
/// write lock held by another connection, a corrupt FTS index, and a
/// divert blocked by a file where `sessions/` should be. Exit 4 if the
/// recount does not add up.
///
/// Message uids are fixed, `demo-<batch>-<message>` (both from 01), and the
/// home keeps every batch's outcome in `demo-outcomes.jsonl` (the JSON
/// `turnsafe append` prints), so anyone can recount a kept home without
/// trusting the demo's own report.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep the demo home in DIR (must not exist or be empty) instead of a temporary folder.
    #[arg(long)]
    keep: Option<PathBuf>,
}

struct Row {
    failure: &'static str,
    cause: String,
    action: String,
    committed: usize,
    diverted: usize,
    handed_back: usize,
    copy: String,
}

/// What the recount needs from each batch.
#[derive(Default)]
struct Ledger {
    sent: Vec<String>,
    receipts: Vec<Receipt>,
    handed_back: Vec<String>,
    claims: Vec<(String, Option<String>)>,
}

impl Ledger {
    /// Record one batch from its `append` JSON, whichever process wrote it.
    fn record(&mut self, out: &Value) {
        let uids: Vec<String> = out["uids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| u.as_str().map(String::from))
            .collect();
        if out["handed_back"].as_u64().unwrap_or(0) > 0 {
            self.handed_back.extend(uids.iter().cloned());
        }
        self.sent.extend(uids);
        let receipt = serde_json::from_value::<Receipt>(out["receipt"].clone()).ok();
        if let Some(body) = out["copy"]["body"].as_str() {
            self.claims
                .push((body.to_string(), receipt.as_ref().map(|r| r.path.clone())));
        }
        self.receipts.extend(receipt);
    }
}

fn row(failure: &'static str, out: &Value) -> Row {
    let label = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let count = |k: &str| out[k].as_u64().unwrap_or(0) as usize;
    Row {
        failure,
        cause: label(&out["cause"]),
        action: label(&out["action"]),
        committed: count("committed"),
        diverted: count("diverted"),
        handed_back: count("handed_back"),
        copy: label(&out["copy"]["code"]),
    }
}

/// The file in a demo home that keeps each batch's outcome, one JSON line each.
pub const OUTCOMES_FILE: &str = "demo-outcomes.jsonl";

/// The uid of message `message` (from 1) of batch `batch` (from 1).
pub fn demo_uid(batch: usize, message: usize) -> String {
    format!("demo-{batch:02}-{message:02}")
}

/// Batch number `batch`: `n` messages of about `size` bytes.
fn turn(batch: usize, n: usize, size: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            Message::new(
                role,
                &format!("turn message {i}: {}", "the quick brown fox ".repeat(size / 20 + 1)),
            )
            .with_uid(&demo_uid(batch, i + 1))
        })
        .collect()
}

pub fn run(args: Args) -> i32 {
    let started = Instant::now();
    let temp;
    let home: PathBuf = match &args.keep {
        Some(dir) => {
            let used = std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(false);
            if used {
                eprintln!(
                    "error: --keep {} is not empty; the demo needs a fresh home",
                    dir.display()
                );
                return exit::USAGE;
            }
            dir.clone()
        }
        None => match tempfile::tempdir() {
            Ok(t) => {
                temp = t;
                temp.path().to_path_buf()
            }
            Err(e) => {
                eprintln!("turnsafe demo: no temporary folder: {e}");
                return exit::FAILURE;
            }
        },
    };
    if let Err(e) = faultvfs::register() {
        eprintln!("turnsafe demo: cannot register the fault VFS: {e}");
        return exit::FAILURE;
    }
    match demo(&home) {
        Ok((rows, ledger, notes)) => {
            print_table(&rows);
            for note in &notes {
                println!("{note}");
            }
            if !notes.is_empty() {
                println!();
            }
            let ok = verify(&home, &ledger);
            println!(
                "finished in {:.1} s; home: {}",
                started.elapsed().as_secs_f64(),
                home.display()
            );
            if ok { exit::OK } else { exit::UNACCOUNTED }
        }
        Err(e) => {
            eprintln!("turnsafe demo: {e}");
            exit::FAILURE
        }
    }
}

/// The rows of the table, what the recount needs, and lines printed under the table.
fn demo(home: &Path) -> Result<(Vec<Row>, Ledger, Vec<String>), String> {
    let opts = StoreOptions {
        vfs: Some(faultvfs::VFS_NAME.into()),
        holder: "demo".into(),
        ..StoreOptions::default()
    };
    let mut store = SessionStore::create(home, opts).map_err(|e| e.to_string())?;
    let session = SessionId::new("demo-session")?;
    let tag = home.to_string_lossy().into_owned();
    let mut rows = Vec::new();
    let mut ledger = Ledger::default();
    let mut outcomes = Vec::new();
    let mut step = |failure: &'static str, out: Value, rows: &mut Vec<Row>| {
        ledger.record(&out);
        rows.push(row(failure, &out));
        outcomes.push(out);
    };
    let mut batches = 0;
    let mut turn = |n: usize, size: usize| {
        batches += 1;
        turn(batches, n, size)
    };

    step(
        "none",
        store.append_batch(&session, &turn(10, 200)).to_value(),
        &mut rows,
    );

    let g = faultvfs::arm(Fault::new(&tag, Op::Write, FileKind::Wal, 1))?;
    let out = store.append_batch(&session, &turn(10, 200));
    drop(g);
    step("I/O error at WAL write (fault VFS)", out.to_value(), &mut rows);

    let g = faultvfs::arm(Fault::new(&tag, Op::Sync, FileKind::Wal, 1).persistent())?;
    let out = store.append_batch(&session, &turn(10, 200));
    drop(g);
    step("I/O error at WAL fsync (fault VFS)", out.to_value(), &mut rows);

    let g = faultvfs::arm(Fault::new(&tag, Op::Write, FileKind::Wal, 1).errno(libc::ENOSPC))?;
    let out = store.append_batch(&session, &turn(10, 200));
    drop(g);
    step("ENOSPC at WAL write (fault VFS)", out.to_value(), &mut rows);

    if let Some(c) = store.connection() {
        let pages: i64 = c
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        c.pragma_update(None, "max_page_count", pages)
            .map_err(|e| e.to_string())?;
    }
    let out = store.append_batch(&session, &turn(10, 4000));
    if let Some(c) = store.connection() {
        c.pragma_update(None, "max_page_count", 1_073_741_823i64)
            .map_err(|e| e.to_string())?;
    }
    step("SQLITE_FULL (max_page_count)", out.to_value(), &mut rows);

    let out = fd_exhausted_child(home, &turn(4, 200))?;
    step("fd exhaustion in a child (RLIMIT_NOFILE)", out, &mut rows);

    let holder = hold_lock(&home.join("state.db"), Duration::from_millis(1200))?;
    let out = store.append_batch(&session, &turn(10, 200));
    let _ = holder.join();
    step("write lock held 1.2 s by another process", out.to_value(), &mut rows);

    {
        let other = rusqlite::Connection::open(home.join("state.db")).map_err(|e| e.to_string())?;
        other
            .execute("UPDATE messages_fts_data SET block = X'FFFFFFFFFFFF' WHERE id = 10", [])
            .map_err(|e| e.to_string())?;
    }
    let out = store.append_batch(&session, &turn(10, 200));
    step("corrupt FTS5 index", out.to_value(), &mut rows);
    // The index is off the commit path: the turn above committed. Search
    // finds the damage when it indexes that turn, marks the index for
    // rebuild, and scans the messages instead.
    let found = crate::store::search::search(home, "quick brown fox", &crate::store::search::SearchOptions::default())
        .map_err(|e| e.to_string())?;
    let mut notes = Vec::new();
    notes.push(format!(
        "search with the corrupt FTS5 index: {}; {} hit(s) from {} message(s) scanned without it",
        match (&found.index, &found.catch_up) {
            (crate::store::search::IndexHealth::Damaged, Err(e)) => format!("index damaged ({e})"),
            (crate::store::search::IndexHealth::Damaged, Ok(_)) => "index damaged".to_string(),
            _ => "index NOT reported damaged".to_string(),
        },
        found.hits.len(),
        found.unindexed
    ));
    store.rebuild_fts().map_err(|e| e.to_string())?;

    let sessions = home.join("sessions");
    let aside = home.join("sessions.aside");
    std::fs::rename(&sessions, &aside).map_err(|e| e.to_string())?;
    std::fs::write(&sessions, b"a file where the sessions folder should be").map_err(|e| e.to_string())?;
    let g = faultvfs::arm(Fault::new(&tag, Op::Write, FileKind::Wal, 1))?;
    let out = store.append_batch(&session, &turn(10, 200));
    drop(g);
    std::fs::remove_file(&sessions).map_err(|e| e.to_string())?;
    std::fs::rename(&aside, &sessions).map_err(|e| e.to_string())?;
    step("I/O error, and the divert blocked", out.to_value(), &mut rows);

    step(
        "none",
        store.append_batch(&session, &turn(10, 200)).to_value(),
        &mut rows,
    );
    drop(store);
    keep_outcomes(home, &outcomes)?;
    Ok((rows, ledger, notes))
}

/// Write each batch's outcome to `home/demo-outcomes.jsonl` (0600, new file).
fn keep_outcomes(home: &Path, outcomes: &[Value]) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = home.join(OUTCOMES_FILE);
    let mut text = String::new();
    for o in outcomes {
        text.push_str(&o.to_string());
        text.push('\n');
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .map_err(|e| format!("cannot keep the outcomes in {}: {e}", path.display()))
}

/// Another connection holds `BEGIN IMMEDIATE` for `hold`.
fn hold_lock(db: &Path, hold: Duration) -> Result<std::thread::JoinHandle<()>, String> {
    let c = rusqlite::Connection::open(db).map_err(|e| e.to_string())?;
    c.execute_batch("BEGIN IMMEDIATE").map_err(|e| e.to_string())?;
    Ok(std::thread::spawn(move || {
        std::thread::sleep(hold);
        let _ = c.execute_batch("COMMIT");
    }))
}

/// The child's RLIMIT_NOFILE: its stdin, stdout and stderr, plus the one
/// descriptor the dynamic loader and the runtime's start-up open and close
/// again before `main`. Past start-up the child has one free descriptor,
/// and opening the store takes more than that.
const CHILD_NOFILE: u64 = 4;

/// `turnsafe append` in a child whose RLIMIT_NOFILE (set between fork and
/// exec) leaves it no descriptor to open its store or its divert with.
fn fd_exhausted_child(home: &Path, batch: &[Message]) -> Result<Value, String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "append",
        "--session",
        "demo-session",
        "--holder",
        "demo-child",
        "--home",
    ])
    .arg(home)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    // SAFETY: between fork and exec the closure only makes the two
    // async-signal-safe system calls behind getrlimit and setrlimit.
    unsafe {
        cmd.pre_exec(|| {
            let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            let lowered = rustix::process::Rlimit {
                current: Some(CHILD_NOFILE),
                maximum: lim.maximum,
            };
            rustix::process::setrlimit(rustix::process::Resource::Nofile, lowered).map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("spawning the child: {e}"))?;
    let line: Vec<Value> = batch
        .iter()
        .map(|m| {
            // The line format's `uid` field carries the message's uid.
            let mut o = m.item().clone();
            if let Some(uid) = &m.uid {
                o.insert("uid".into(), uid.clone().into());
            }
            Value::Object(o)
        })
        .collect();
    let mut stdin = child.stdin.take().ok_or("no child stdin")?;
    writeln!(stdin, "{}", Value::Array(line)).map_err(|e| e.to_string())?;
    drop(stdin);
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut text = String::new();
    BufReader::new(stdout).read_line(&mut text).map_err(|e| e.to_string())?;
    let _ = child.wait();
    serde_json::from_str(&text).map_err(|e| format!("child answered {text:?}: {e}"))
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<42} {:<10} {:<12} {:>9} {:>8} {:>11}  copy shown",
        "failure", "cause", "action", "committed", "diverted", "handed back"
    );
    println!("{}", "-".repeat(120));
    for r in rows {
        println!(
            "{:<42} {:<10} {:<12} {:>9} {:>8} {:>11}  {}",
            r.failure, r.cause, r.action, r.committed, r.diverted, r.handed_back, r.copy
        );
    }
    println!();
}

/// Recount from disk: rows in state.db, lines inside each receipt's range,
/// and the messages handed back. Every uid sent must appear exactly once.
fn verify(home: &Path, ledger: &Ledger) -> bool {
    let mut seen: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let mut problems = Vec::new();
    let db_rows = match rusqlite::Connection::open(home.join("state.db")).and_then(|c| {
        let mut s = c.prepare("SELECT uid FROM messages WHERE session_id = 'demo-session'")?;
        s.query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()
    }) {
        Ok(r) => r,
        Err(e) => {
            println!("recount: cannot read state.db: {e}");
            return false;
        }
    };
    for uid in &db_rows {
        seen.entry(uid.clone()).or_default().push("state.db");
    }
    let mut diverted_lines = 0;
    for r in &ledger.receipts {
        match divert::verify_receipt(r) {
            Ok(true) => {}
            _ => problems.push(format!(
                "receipt {} [{}+{}] does not match its sha256",
                r.path, r.offset, r.length
            )),
        }
        if let Ok(data) = std::fs::read(&r.path)
            && let Some(range) = data.get(r.offset as usize..(r.offset + r.length) as usize)
        {
            for line in String::from_utf8_lossy(range).lines() {
                if let Some(uid) = crate::json_in::value(line)
                    .ok()
                    .and_then(|v| v["uid"].as_str().map(String::from))
                {
                    diverted_lines += 1;
                    seen.entry(uid).or_default().push("divert");
                }
            }
        }
    }
    for uid in &ledger.handed_back {
        seen.entry(uid.clone()).or_default().push("handed back");
    }
    for uid in &ledger.sent {
        match seen.get(uid).map(Vec::len) {
            Some(1) => {}
            Some(n) => problems.push(format!("message {uid} is in {n} places: {:?}", seen[uid])),
            None => problems.push(format!("message {uid} is nowhere")),
        }
    }
    if seen.len() != ledger.sent.len() {
        problems.push(format!("{} messages found but {} sent", seen.len(), ledger.sent.len()));
    }
    for (body, receipt) in &ledger.claims {
        let claims = body.to_lowercase().contains("a copy was kept");
        match (claims, receipt) {
            (true, None) => problems.push(format!("copy claims a kept copy without a receipt: {body}")),
            (true, Some(p)) if !body.contains(p.as_str()) => problems.push(format!("copy names another path: {body}")),
            _ => {}
        }
    }
    println!(
        "recount: sent {}, in state.db {}, in receipts {}, handed back {}",
        ledger.sent.len(),
        db_rows.len(),
        diverted_lines,
        ledger.handed_back.len()
    );
    if problems.is_empty() {
        println!(
            "verified: every message is accounted for exactly once, and no copy claims a divert without a receipt"
        );
        true
    } else {
        for p in &problems {
            println!("NOT VERIFIED: {p}");
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recount_fails_when_a_message_is_nowhere_or_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SessionStore::create(dir.path(), StoreOptions::default()).unwrap();
        let s = SessionId::new("demo-session").unwrap();
        let out = store.append_batch(&s, &turn(1, 2, 10));
        drop(store);
        let mut ledger = Ledger::default();
        ledger.record(&out.to_value());
        assert!(verify(dir.path(), &ledger));
        // A message the recount cannot find.
        ledger.sent.push("ghost".into());
        assert!(!verify(dir.path(), &ledger));
        ledger.sent.pop();
        // A committed message also reported as handed back.
        ledger.handed_back.push(out.uids[0].clone());
        assert!(!verify(dir.path(), &ledger));
        ledger.handed_back.clear();
        // A copy that claims a kept copy without a receipt.
        ledger.claims.push(("A copy was kept at /nowhere.".into(), None));
        assert!(!verify(dir.path(), &ledger));
    }
}
