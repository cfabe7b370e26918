//! A writer that died does not fence its sessions: its turn lease ends on
//! evidence that its holder is gone (the same boot and pid namespace, and
//! its pid runs no process or another one; or, on PostgreSQL, its server
//! backend is gone), and stands without it. Driven through `turnsafe
//! append` processes that are SIGKILLed for real, on SQLite and on a real
//! PostgreSQL server, with the default 30 s lease.
mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

/// A `turnsafe append` streaming into one session, answered batch by batch.
struct Writer {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
}

impl Writer {
    fn spawn(home: &Path, db: Option<&str>) -> Writer {
        let mut cmd = Command::cargo_bin("turnsafe").expect("the turnsafe binary");
        cmd.args(["append", "--session", "s1", "--home"]).arg(home);
        if let Some(url) = db {
            cmd.args(["--db", url]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("turnsafe append starts");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Writer { child, stdin, out }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send one batch of two messages and read its outcome.
    fn send(&mut self, tag: &str) -> Value {
        let line = format!(
            "[{{\"uid\":\"{tag}-1\",\"role\":\"user\",\"content\":\"a\"}},{{\"uid\":\"{tag}-2\",\"role\":\"assistant\",\"content\":\"b\"}}]\n"
        );
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).expect("write a batch");
        stdin.flush().expect("flush");
        let mut answer = String::new();
        self.out.read_line(&mut answer).expect("read an outcome");
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
    }

    /// SIGKILL, and reap: the process is gone, as after an OOM kill.
    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// End of input: the writer releases its leases and exits.
    fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("exits");
        assert!(status.code().is_some(), "{status}");
    }
}

fn sqlite_uids(home: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
    let mut s = c.prepare("SELECT uid FROM messages ORDER BY seq").unwrap();
    s.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

fn sqlite_holder(home: &Path) -> Value {
    let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
    let text: String = c
        .query_row("SELECT lease_holder FROM sessions WHERE id = 's1'", [], |r| r.get(0))
        .unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("lease_holder {text:?}: {e}"))
}

/// Rewrite the recorded holder of s1's lease (as another machine, another
/// process, or an older writer would have written it).
fn sqlite_set_holder(home: &Path, holder: &str) {
    let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    let n = c
        .execute("UPDATE sessions SET lease_holder = ?1 WHERE id = 's1'", [holder])
        .unwrap();
    assert_eq!(n, 1);
}

fn assert_fenced_by(v: &Value, place: &str) {
    assert_eq!(v["persisted"], false, "{v}");
    assert_eq!(v["cause"], "turn_lease", "{v}");
    assert_eq!((&v["diverted"], &v["handed_back"]), (&0.into(), &2.into()), "{v}");
    assert_eq!(v["copy"]["code"], "turn_lease.handed_back", "{v}");
    assert_eq!(v["copy"]["details"]["lease_place"], place, "{v}");
    let body = v["copy"]["body"].as_str().unwrap();
    assert!(body.contains("is held by") && body.contains(" UTC"), "{body}");
    assert!(!v.to_string().contains("finish"), "{v}");
}

#[test]
fn a_writer_killed_mid_stream_and_restarted_at_once_commits_its_next_batch() {
    let home = Home::new();
    let mut first = Writer::spawn(home.path(), None);
    assert_eq!(first.send("a1")["persisted"], true);
    let dead = first.pid();
    assert_eq!(sqlite_holder(home.path())["pid"], dead);
    first.kill9();

    // At once, with the default 30 s lease still running.
    let mut second = Writer::spawn(home.path(), None);
    let v = second.send("b1");
    assert_eq!(
        v["persisted"], true,
        "the dead writer's lease fenced its successor: {v}"
    );
    assert_eq!(sqlite_holder(home.path())["pid"], second.pid());
    assert_eq!(second.send("b2")["persisted"], true);
    second.finish();
    assert_eq!(
        sqlite_uids(home.path()),
        ["a1-1", "a1-2", "b1-1", "b1-2", "b2-1", "b2-2"]
    );
    assert!(!home.divert_file("s1").exists(), "a takeover diverts nothing");
}

#[test]
fn a_live_holder_in_another_process_still_fences_and_is_named() {
    let home = Home::new();
    let mut holder = Writer::spawn(home.path(), None);
    assert_eq!(holder.send("a1")["persisted"], true);
    let mut other = Writer::spawn(home.path(), None);
    let v = other.send("b1");
    assert_fenced_by(&v, "this_machine");
    assert_eq!(v["copy"]["details"]["lease_pid"], holder.pid().to_string(), "{v}");
    let body = v["copy"]["body"].as_str().unwrap();
    assert!(
        body.contains(&format!("pid {} on this machine", holder.pid())),
        "{body}"
    );
    // Once the holder ends its input it gives the lease back.
    holder.finish();
    assert_eq!(other.send("b2")["persisted"], true);
    other.finish();
    assert_eq!(sqlite_uids(home.path()), ["a1-1", "a1-2", "b2-1", "b2-2"]);
}

#[test]
fn a_dead_holder_on_another_machine_still_fences() {
    let home = Home::new();
    let mut first = Writer::spawn(home.path(), None);
    assert_eq!(first.send("a1")["persisted"], true);
    first.kill9();
    // The same record, but from another boot: its pid means nothing here.
    let mut proof = sqlite_holder(home.path());
    proof["boot"] = "00000000-0000-4000-8000-000000000000".into();
    sqlite_set_holder(home.path(), &proof.to_string());
    let mut second = Writer::spawn(home.path(), None);
    assert_fenced_by(&second.send("b1"), "other_machine");
    second.finish();
    assert_eq!(sqlite_uids(home.path()), ["a1-1", "a1-2"]);
}

#[test]
fn an_older_writers_lease_with_nothing_to_check_still_fences() {
    let home = Home::new();
    let mut first = Writer::spawn(home.path(), None);
    assert_eq!(first.send("a1")["persisted"], true);
    first.kill9();
    sqlite_set_holder(home.path(), "pid-1234");
    let mut second = Writer::spawn(home.path(), None);
    let v = second.send("b1");
    assert_fenced_by(&v, "unknown");
    assert_eq!(v["copy"]["details"]["lease_holder"], "pid-1234", "{v}");
    second.finish();
}

#[test]
fn a_lease_naming_a_pid_now_used_by_an_unrelated_process_is_taken_over() {
    let home = Home::new();
    let mut first = Writer::spawn(home.path(), None);
    assert_eq!(first.send("a1")["persisted"], true);
    first.kill9();
    // An unrelated live process, whose start time is not the one recorded.
    let mut unrelated = Command::new("sleep").arg("600").spawn().expect("sleep starts");
    let mut proof = sqlite_holder(home.path());
    proof["pid"] = unrelated.id().into();
    sqlite_set_holder(home.path(), &proof.to_string());
    let mut second = Writer::spawn(home.path(), None);
    let v = second.send("b1");
    unrelated.kill().ok();
    unrelated.wait().ok();
    assert_eq!(v["persisted"], true, "{v}");
    second.finish();
    assert_eq!(sqlite_uids(home.path()), ["a1-1", "a1-2", "b1-1", "b1-2"]);
}

/// Wait until the server no longer lists `pid`: its exit is asynchronous.
fn wait_backend_gone(server: &pg::PgServer, pid: i32) {
    let mut admin = server.admin("postgres");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = admin
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
            .get(0);
        if n == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "backend {pid} still listed after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pg_holder(server: &pg::PgServer, db: &str) -> Value {
    let text: String = server
        .admin(db)
        .query_one("SELECT lease_holder FROM sessions WHERE id = 's1'", &[])
        .unwrap()
        .get(0);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("lease_holder {text:?}: {e}"))
}

fn pg_set_holder(server: &pg::PgServer, db: &str, holder: &Value) {
    let n = server
        .admin(db)
        .execute(
            "UPDATE sessions SET lease_holder = $1 WHERE id = 's1'",
            &[&holder.to_string()],
        )
        .unwrap();
    assert_eq!(n, 1);
}

fn pg_uids(server: &pg::PgServer, db: &str) -> Vec<String> {
    pg::rows(server, db, "s1").into_iter().map(|r| r.0).collect()
}

#[test]
fn pg_a_writer_killed_mid_stream_and_restarted_at_once_commits_its_next_batch() {
    let server = pg_or_skip!();
    let url = server.url(&server.create_db("killed"));
    let home = Home::new();
    let mut first = Writer::spawn(home.path(), Some(&url));
    assert_eq!(first.send("a1")["persisted"], true);
    let proof = pg_holder(&server, "killed");
    assert_eq!(proof["pid"], first.pid());
    assert!(
        proof["backend_pid"].is_i64() && proof["backend_start"].is_i64(),
        "{proof}"
    );
    first.kill9();

    // At once: the server may still list the dead writer's backend, but
    // its process is gone from this machine.
    let mut second = Writer::spawn(home.path(), Some(&url));
    let v = second.send("b1");
    assert_eq!(
        v["persisted"], true,
        "the dead writer's lease fenced its successor: {v}"
    );
    second.finish();
    assert_eq!(pg_uids(&server, "killed"), ["a1-1", "a1-2", "b1-1", "b1-2"]);
}

#[test]
fn pg_a_holder_whose_connection_is_alive_but_idle_still_fences_and_a_gone_backend_ends_its_lease() {
    let server = pg_or_skip!();
    let url = server.url(&server.create_db("idle"));
    let home = Home::new();
    let mut holder = Writer::spawn(home.path(), Some(&url));
    assert_eq!(holder.send("a1")["persisted"], true);
    // Seen as a writer on another machine: only its backend can be checked.
    let mut proof = pg_holder(&server, "idle");
    proof["boot"] = "00000000-0000-4000-8000-000000000000".into();
    pg_set_holder(&server, "idle", &proof);

    let mut other = Writer::spawn(home.path(), Some(&url));
    let v = other.send("b1");
    assert_fenced_by(&v, "other_machine");
    let backend = proof["backend_pid"].as_i64().unwrap();
    assert_eq!(v["copy"]["details"]["lease_backend_pid"], backend.to_string(), "{v}");

    // The holder's connection is cut by the server: its backend is gone.
    let backend = i32::try_from(backend).unwrap();
    let killed: bool = server
        .admin("postgres")
        .query_one("SELECT pg_terminate_backend($1)", &[&backend])
        .unwrap()
        .get(0);
    assert!(killed);
    wait_backend_gone(&server, backend);
    let v = other.send("b2");
    assert_eq!(v["persisted"], true, "a gone backend's lease fenced: {v}");
    other.finish();
    holder.kill9();
    assert_eq!(pg_uids(&server, "idle"), ["a1-1", "a1-2", "b2-1", "b2-2"]);
}
