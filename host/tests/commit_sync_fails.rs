//! A COMMIT whose WAL sync fails after its frames reached the file.
//!
//! SQLite leaves the frames out of the WAL index, so no connection reads
//! them: the batch is not visible now. But they are in the WAL file, with
//! a valid commit frame, and the WAL recovery of the next process that
//! opens the database brings them back. So the outcome says "possibly
//! written", not "not saved"; the divert keeps the batch, and replay's byte
//! comparison settles each kept line: `duplicate` when its row came back,
//! `replayed` when it did not. Every message ends in exactly one place.
//!
//! The writer is a child `turnsafe append` whose hidden
//! `--fault-wal-sync-after N` fails the WAL's next sync once, through the
//! fault-injecting VFS, after N batches; it is killed (SIGKILL) or ends
//! normally, and new processes read the database. An edit (`pop`) whose
//! COMMIT sync fails runs in a child too: this test binary, run again on
//! one test with `COMMIT_SYNC_CHILD` set, which prints the edit's copy and
//! waits to be killed. No power cut: powerfs drops a failed sync's pending
//! data, so only a killed process shows this.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;
use turnsafe_host::backend::History;

fn turnsafe() -> PathBuf {
    assert_cmd::cargo::cargo_bin("turnsafe")
}

/// A child `turnsafe append` on session `s1`, answering batch by batch.
struct Writer {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
}

impl Writer {
    /// The WAL's sync fails once, after `sync_fails_after` batches. Its
    /// turn lease lasts a second: replay waits for a killed writer's.
    fn spawn(home: &Path, sync_fails_after: u64) -> Writer {
        let mut child = Command::new(turnsafe())
            .args([
                "append",
                "--session",
                "s1",
                "--lease-ttl",
                "1",
                "--fault-wal-sync-after",
            ])
            .arg(sync_fails_after.to_string())
            .arg("--home")
            .arg(home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn turnsafe append");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Writer { child, stdin, out }
    }

    /// Send one batch (messages `<tag>-0`, `<tag>-1`) and read its outcome.
    fn send(&mut self, tag: &str) -> Value {
        let line = format!("{}\n", batch(tag));
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).expect("write a batch");
        stdin.flush().expect("flush");
        let mut answer = String::new();
        self.out.read_line(&mut answer).expect("read an outcome");
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
    }

    /// SIGKILL: no close, no checkpoint, the WAL and its index as they are.
    fn kill(mut self) {
        self.child.kill().expect("kill");
        let status = self.child.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
    }

    /// End of input: the writer closes its store and exits.
    fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait");
        assert_eq!(status.code(), Some(3), "a batch was not persisted");
    }
}

fn batch(tag: &str) -> Value {
    serde_json::json!([
        {"role": "user", "content": format!("{tag} question"), "uid": format!("{tag}-0")},
        {"role": "assistant", "content": format!("{tag} answer"), "uid": format!("{tag}-1")},
    ])
}

/// `turnsafe show --json` in a new process: the uids of session `s1`, in order.
fn shown(home: &Path) -> Vec<String> {
    let out = Command::new(turnsafe())
        .args(["show", "--session", "s1", "--json", "--home"])
        .arg(home)
        .output()
        .expect("run turnsafe show");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|v| v["type"] == "message")
        .map(|v| v["data"]["uid"].as_str().expect("uid").to_string())
        .collect()
}

/// `turnsafe replay --json` in a new process: its per-file reports.
fn replay(home: &Path) -> Vec<Value> {
    let out = Command::new(turnsafe())
        .args(["replay", "--json", "--home"])
        .arg(home)
        .output()
        .expect("run turnsafe replay");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|v| v["type"] == "replay_file")
        .map(|v| v["data"].clone())
        .collect()
}

/// The settlement ledger's state for each uid it names, in order.
fn settled(home: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(home.join("sessions").join("ledger.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a ledger line"))
        .map(|v| {
            (
                v["uid"].as_str().unwrap_or_default().to_string(),
                v["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Divert files still waiting for replay.
fn pending_divert_files(home: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(home.join("sessions"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "jsonl") && p.file_name() != Some("ledger.jsonl".as_ref())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The outcome of the batch whose COMMIT sync failed: diverted with a
/// receipt, and its copy says possibly written, never "not saved".
fn assert_possibly_written(out: &Value) {
    assert_eq!(out["persisted"], false, "{out}");
    assert_eq!(out["operation"], "append_batch", "{out}");
    assert_eq!(out["cause"], "disk", "{out}");
    assert_eq!(out["action"], "divert", "{out}");
    assert_eq!(
        (&out["committed"], &out["diverted"]),
        (&Value::from(0), &Value::from(2)),
        "{out}"
    );
    assert!(out["receipt"]["path"].is_string(), "{out}");
    let copy = &out["copy"];
    assert_eq!(copy["title"], "Messages possibly not saved; a copy was kept", "{out}");
    let body = copy["body"].as_str().expect("body");
    assert!(
        body.contains("COMMIT failed after writing this turn's messages"),
        "{body}"
    );
    assert!(
        body.contains("not in the session database now, but its next open may bring them back"),
        "{body}"
    );
    assert_eq!(copy["details"]["commit"], "possibly written", "{out}");
    assert!(!body.contains("were not saved"), "{body}");
}

/// Every message in exactly one place after replay: each uid stored once,
/// each diverted line settled once, no divert file left pending.
fn assert_each_once(home: &Path, diverted: &[&str]) {
    let stored = shown(home);
    let mut unique = stored.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), stored.len(), "a message stored twice: {stored:?}");
    for uid in ["a-0", "a-1", "b-0", "b-1", "c-0", "c-1"] {
        assert_eq!(stored.iter().filter(|u| *u == uid).count(), 1, "{uid} in {stored:?}");
    }
    let ledger = settled(home);
    for uid in diverted {
        assert_eq!(
            ledger.iter().filter(|(u, _)| u == uid).count(),
            1,
            "{uid} in {ledger:?}"
        );
    }
    assert!(
        pending_divert_files(home).is_empty(),
        "{:?}",
        pending_divert_files(home)
    );
}

/// Killed after the failed COMMIT: the next process's WAL recovery brings
/// the batch back, and replay settles its kept lines as `duplicate`.
#[test]
fn killed_after_a_failed_commit_sync_the_batch_comes_back_and_replay_finds_it_stored() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let mut w = Writer::spawn(home, 1);
    assert_eq!(w.send("a")["persisted"], true);
    let failed = w.send("b");
    assert_possibly_written(&failed);
    // Not visible now: another process reads the database as the writer's
    // WAL index says, without the batch.
    assert_eq!(shown(home), ["a-0", "a-1"]);
    w.kill();

    // Possibly written, and here written: the next open recovers it.
    assert_eq!(
        shown(home),
        ["a-0", "a-1", "b-0", "b-1"],
        "the failed COMMIT's rows came back"
    );
    // The killed writer's turn lease runs out before replay takes the session.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let reports = replay(home);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(
        (&reports[0]["replayed"], &reports[0]["duplicate"]),
        (&Value::from(0), &Value::from(2)),
        "{reports:?}"
    );
    assert_eq!(
        settled(home),
        [("b-0".into(), "duplicate".into()), ("b-1".into(), "duplicate".into())]
    );

    // The conversation goes on in a new writer, after what came back.
    let mut w = Writer::spawn(home, 99);
    assert_eq!(w.send("c")["persisted"], true);
    drop(w.stdin.take());
    w.child.wait().unwrap();
    assert_eq!(shown(home), ["a-0", "a-1", "b-0", "b-1", "c-0", "c-1"]);
    assert_each_once(home, &["b-0", "b-1"]);
}

/// The writer goes on and ends normally: its close checkpoints what its
/// WAL index holds, without the failed frames, so the batch does not come
/// back; replay stores its kept lines (`replayed`), once.
#[test]
fn closed_after_a_failed_commit_sync_the_batch_stays_out_and_replay_stores_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let mut w = Writer::spawn(home, 1);
    assert_eq!(w.send("a")["persisted"], true);
    assert_possibly_written(&w.send("b"));
    w.finish();

    assert_eq!(
        shown(home),
        ["a-0", "a-1"],
        "the failed COMMIT's rows did not come back"
    );
    let reports = replay(home);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(
        (&reports[0]["replayed"], &reports[0]["duplicate"]),
        (&Value::from(2), &Value::from(0)),
        "{reports:?}"
    );
    assert_eq!(
        settled(home),
        [("b-0".into(), "replayed".into()), ("b-1".into(), "replayed".into())]
    );
    let mut w = Writer::spawn(home, 99);
    assert_eq!(w.send("c")["persisted"], true);
    drop(w.stdin.take());
    w.child.wait().unwrap();
    assert_each_once(home, &["b-0", "b-1"]);
}

/// The name of the child test below, as libtest runs it.
const POP_CHILD: &str = "pop_whose_commit_sync_fails_in_a_child";

/// The child's half: a `pop` through the fault-injecting VFS whose COMMIT
/// sync fails; prints the edit's error and copy as one JSON line, then
/// waits to be killed. Does nothing unless `COMMIT_SYNC_CHILD` names a home.
#[test]
fn pop_whose_commit_sync_fails_in_a_child() {
    use turnsafe_host::backend::Backend;
    use turnsafe_host::faultvfs::{self, Fault, FileKind, Op};
    use turnsafe_host::store::{SessionId, SessionStore, StoreOptions};
    let Some(home) = std::env::var_os("COMMIT_SYNC_CHILD").map(PathBuf::from) else {
        return;
    };
    faultvfs::register().expect("the fault VFS");
    let mut store = SessionStore::new(
        &home,
        StoreOptions {
            vfs: Some(faultvfs::VFS_NAME.into()),
            ..StoreOptions::default()
        },
    );
    let s1 = SessionId::new("s1").expect("session id");
    let messages = turnsafe_host::message::Message::batch_from_json(&batch("a").to_string()).expect("a batch");
    assert!(store.append_batch(&s1, &messages).persisted);
    let tag = std::path::absolute(&home)
        .expect("absolute")
        .to_string_lossy()
        .into_owned();
    let fault = faultvfs::arm(Fault::new(&tag, Op::Sync, FileKind::Wal, 1)).expect("arm");
    let err = store.pop_last(&s1).expect_err("the pop's COMMIT fails");
    assert_eq!(fault.fired(), 1);
    // The same handle reads the session as it was.
    let rows: Vec<String> = store
        .rows("s1", None)
        .expect("rows")
        .into_iter()
        .map(|r| r.uid)
        .collect();
    let copy = err.copy();
    let line = serde_json::json!({
        "cause": err.cause.label(),
        "possibly_written": err.possibly_written,
        "rows": rows,
        "title": copy.title,
        "body": copy.body,
        "remediation": copy.remediation,
    });
    println!("CHILD {line}");
    std::io::stdout().flush().expect("flush");
    // Wait to be killed, the store still open; a parent that failed before
    // killing it leaves no process behind for long.
    std::thread::sleep(std::time::Duration::from_secs(120));
    std::process::exit(1);
}

/// A child process killed (SIGKILL) when this is dropped, as a failing
/// test unwinds too.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pop whose COMMIT sync fails: its copy says it may or may not have
/// happened, the session reads as before, and once the process is killed
/// the next open may bring the pop back (here it does: the message is
/// gone from the transcript and in the archive, once).
#[test]
fn a_pop_whose_commit_sync_fails_says_it_may_come_back_and_does() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--exact", POP_CHILD, "--nocapture", "--test-threads", "1"])
            .env("COMMIT_SYNC_CHILD", home)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child"),
    );
    let mut out = BufReader::new(child.0.stdout.take().expect("stdout"));
    let reported = loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).expect("read the child");
        assert!(n > 0, "the child ended without reporting");
        // libtest prints the test's name on the same line first.
        if let Some((_, json)) = line.split_once("CHILD ") {
            break serde_json::from_str::<Value>(json).expect("the child's report");
        }
    };
    assert_eq!(reported["cause"], "disk", "{reported}");
    assert_eq!(reported["possibly_written"], true, "{reported}");
    assert_eq!(
        reported["rows"],
        serde_json::json!(["a-0", "a-1"]),
        "not in effect now: {reported}"
    );
    assert_eq!(reported["title"], "The pop may or may not have happened", "{reported}");
    let body = reported["body"].as_str().expect("body");
    assert!(
        body.contains("COMMIT failed after writing the pop of session s1"),
        "{body}"
    );
    assert!(!body.contains("Nothing was removed"), "{body}");
    let steps = reported["remediation"].to_string();
    assert!(steps.contains("before you run the pop again"), "{steps}");
    assert!(!steps.contains("Then run the pop again"), "{steps}");
    assert_eq!(shown(home), ["a-0", "a-1"], "not visible to another process either");

    // SIGKILL: the pop's frames stay in the WAL as the failed sync left them.
    drop(child);
    assert_eq!(shown(home), ["a-0"], "the pop came back whole with the next open");
    let archived = Command::new(turnsafe())
        .args(["show", "--session", "s1", "--json", "--archived", "--home"])
        .arg(home)
        .output()
        .expect("show --archived");
    let archived = String::from_utf8_lossy(&archived.stdout);
    assert_eq!(archived.matches("\"a-1\"").count(), 1, "{archived}");
}
