//! Sixteen `turnsafe append` processes write sixteen sessions of one new
//! home at once, each with all its batches queued on stdin: a gateway, a
//! command line and background jobs sharing a home. The write lock only
//! passes between them, so no writer may run out its patience: every batch
//! is persisted at its first attempt, no outcome names `locked`, nothing is
//! diverted or handed back, and a recount from disk finds every message
//! exactly once, in order.
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

const WRITERS: usize = 16;
const BATCHES: usize = 100;
const PER_BATCH: usize = 10;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnsafe")
}

/// One batch of ten messages of about 230 bytes, with known uids.
fn batch_line(w: usize, b: usize) -> String {
    let msgs: Vec<Value> = (0..PER_BATCH)
        .map(|m| {
            json!({
                "role": if m % 2 == 0 { "user" } else { "assistant" },
                "content": format!("writer {w} batch {b} message {m}: {}", "lorem ipsum dolor ".repeat(11)),
                "uid": uid(w, b, m),
            })
        })
        .collect();
    Value::Array(msgs).to_string()
}

fn uid(w: usize, b: usize, m: usize) -> String {
    format!("w{w}-b{b}-m{m}")
}

#[test]
fn sixteen_writers_on_one_home_all_make_progress() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let started = Instant::now();
    // Start every process first, then feed them all at once.
    let mut children: Vec<_> = (0..WRITERS)
        .map(|w| {
            Command::new(bin())
                .args(["append", "--home"])
                .arg(&home)
                .args(["--session", &format!("s{w}")])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn turnsafe append")
        })
        .collect();
    let feeders: Vec<_> = children
        .iter_mut()
        .enumerate()
        .map(|(w, child)| {
            let mut stdin = child.stdin.take().unwrap();
            std::thread::spawn(move || {
                let input: String = (0..BATCHES).map(|b| batch_line(w, b) + "\n").collect();
                stdin.write_all(input.as_bytes()).unwrap();
            })
        })
        .collect();
    let outputs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for f in feeders {
        f.join().unwrap();
    }
    let elapsed = started.elapsed();

    let (mut batches, mut diverted, mut locked, mut retried) = (0, 0, 0, 0);
    for (w, out) in outputs.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "writer {w}: {stderr}");
        let outcomes: Vec<Value> = String::from_utf8(out.stdout.clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(outcomes.len(), BATCHES, "writer {w}");
        for (b, o) in outcomes.iter().enumerate() {
            batches += 1;
            diverted += u64::from(o["diverted"].as_u64().unwrap() > 0);
            locked += u64::from(o["cause"] == "locked");
            retried += u64::from(o["attempts"].as_u64().unwrap() > 1);
            let expected: Vec<String> = (0..PER_BATCH).map(|m| uid(w, b, m)).collect();
            assert_eq!(o["uids"], json!(expected), "writer {w} batch {b}: {o}");
        }
    }
    println!(
        "{WRITERS} writers x {BATCHES} batches of {PER_BATCH}: {batches} batches, {diverted} diverted, \
         {locked} locked, {retried} retried, in {:.2} s",
        elapsed.as_secs_f64()
    );
    for (w, out) in outputs.iter().enumerate() {
        for (b, line) in String::from_utf8_lossy(&out.stdout).lines().enumerate() {
            let o: Value = serde_json::from_str(line).unwrap();
            assert_eq!(o["persisted"], true, "writer {w} batch {b}: {o}");
            assert!(
                o["cause"].is_null(),
                "writer {w} batch {b} waited on a lock that only changed hands: {o}"
            );
            assert_eq!(o["attempts"], 1, "writer {w} batch {b}: {o}");
            assert_eq!(
                (&o["committed"], &o["diverted"], &o["handed_back"]),
                (&json!(PER_BATCH), &json!(0), &json!(0)),
                "writer {w} batch {b}: {o}"
            );
            assert!(o["receipt"].is_null());
        }
    }
    assert_eq!((batches, diverted, locked), (WRITERS * BATCHES, 0, 0));

    // Recount from disk: every message once, in its writer's order.
    let db = rusqlite::Connection::open_with_flags(home.join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let total: i64 = db.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
    assert_eq!(total as usize, WRITERS * BATCHES * PER_BATCH);
    let mut rows = db
        .prepare("SELECT uid, seq FROM messages WHERE session_id = ?1 ORDER BY seq, id")
        .unwrap();
    for w in 0..WRITERS {
        let stored: Vec<(String, i64)> = rows
            .query_map([format!("s{w}")], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let expected: Vec<(String, i64)> = (0..BATCHES)
            .flat_map(|b| (0..PER_BATCH).map(move |m| (b, m)))
            .enumerate()
            .map(|(i, (b, m))| (uid(w, b, m), i as i64 + 1))
            .collect();
        assert_eq!(stored, expected, "session s{w}");
    }
    let diverts: Vec<_> = std::fs::read_dir(home.join("sessions"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(diverts.is_empty(), "nothing diverted: {diverts:?}");
}
