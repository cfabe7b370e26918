//! Two `turnsafe append` processes on the same session of one home. The
//! one holding the session's turn lease makes progress; every batch of the
//! other is answered `turn_lease`, handed back and never diverted (fencing:
//! a second writer interleaving its turns would corrupt the transcript).
//! When the holder's lease expires (`--lease-ttl`), because it went quiet,
//! or at once when it was killed (its process is gone), the other takes
//! the session over and the batches it got
//! back are resent with their uids; the old holder is then fenced in turn.
//! Recounted from disk: every message once, none lost, none duplicated.
use serde_json::{Value, json};

mod live;
use live::Live;

fn line(tag: &str, n: usize) -> String {
    let msgs: Vec<Value> = (0..n)
        .map(|m| json!({"role": "user", "content": format!("{tag} message {m}"), "uid": format!("{tag}-{m}")}))
        .collect();
    Value::Array(msgs).to_string()
}

fn persisted(o: &Value, n: u64) {
    assert_eq!(o["persisted"], true, "{o}");
    assert_eq!(o["committed"], n, "{o}");
}

/// Fenced: handed back, not diverted, and told so.
fn fenced(o: &Value, n: u64) {
    assert_eq!(o["persisted"], false, "{o}");
    assert_eq!(o["cause"], "turn_lease", "{o}");
    assert_eq!(o["action"], "fail_closed", "{o}");
    assert_eq!(
        (&o["committed"], &o["diverted"], &o["handed_back"]),
        (&json!(0), &json!(0), &json!(n)),
        "{o}"
    );
    assert!(o["receipt"].is_null(), "{o}");
    assert_eq!(o["copy"]["code"], "turn_lease.handed_back", "{o}");
    assert_eq!(o["error"], "session_persistence_failed:turn_lease");
}

/// The stored uids of `session`, in transcript order, with their seqs.
fn stored(home: &std::path::Path, session: &str) -> Vec<(String, i64)> {
    let db = rusqlite::Connection::open_with_flags(home.join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let mut s = db
        .prepare("SELECT uid, seq FROM messages WHERE session_id = ?1 ORDER BY seq, id")
        .unwrap();
    s.query_map([session], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn no_divert_file(home: &std::path::Path) {
    let files: Vec<_> = std::fs::read_dir(home.join("sessions"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "fencing never diverts: {files:?}");
}

fn expected(tags: &[&str], n: usize) -> Vec<(String, i64)> {
    tags.iter()
        .flat_map(|t| (0..n).map(move |m| format!("{t}-{m}")))
        .enumerate()
        .map(|(i, u)| (u, i as i64 + 1))
        .collect()
}

#[test]
fn the_lease_holder_progresses_the_other_is_fenced_and_takes_over_after_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut a = Live::start_with(&home, "s1", &["--holder", "a", "--lease-ttl", "1"]);
    let mut b = Live::start_with(&home, "s1", &["--holder", "b", "--lease-ttl", "1"]);

    // Both live at once: A took the lease with its first batch, and keeps
    // it by writing; each of B's batches comes back.
    persisted(&a.send(&line("a1", 3)), 3);
    let mut handed_back = Vec::new();
    for i in 0..4 {
        let b_line = line(&format!("b{i}"), 2);
        let o = b.send(&b_line);
        fenced(&o, 2);
        assert_eq!(o["uids"], json!([format!("b{i}-0"), format!("b{i}-1")]));
        handed_back.push(b_line);
        persisted(&a.send(&line(&format!("a{}", i + 2), 3)), 3);
    }
    no_divert_file(&home);

    // A goes quiet, without giving the lease back. Once its lease has
    // expired, B's resent batches take the session over.
    std::thread::sleep(std::time::Duration::from_millis(1300));
    for l in &handed_back {
        persisted(&b.send(l), 2);
    }
    persisted(&b.send(&line("b4", 2)), 2);

    // A is fenced now, though its own clock says nothing of it.
    let a_late = line("a6", 3);
    fenced(&a.send(&a_late), 3);
    assert_eq!(a.finish(), 3, "a batch was not persisted");
    assert_eq!(b.finish(), 3, "batches were handed back");

    // B gave the lease back at the end of its input: A's handed-back batch,
    // resent by a new process, goes in at once.
    let mut a2 = Live::start_with(&home, "s1", &["--holder", "a"]);
    persisted(&a2.send(&a_late), 3);
    assert_eq!(a2.finish(), 0);

    no_divert_file(&home);
    let mut want = expected(&["a1", "a2", "a3", "a4", "a5"], 3);
    let b_part = expected(&["b0", "b1", "b2", "b3", "b4"], 2);
    let a_tail = expected(&["a6"], 3);
    let base = want.len() as i64;
    want.extend(b_part.into_iter().map(|(u, s)| (u, s + base)));
    let base = want.len() as i64;
    want.extend(a_tail.into_iter().map(|(u, s)| (u, s + base)));
    assert_eq!(stored(&home, "s1"), want, "every message once, in turn order");
}

#[test]
fn a_killed_lease_holder_is_taken_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // A lease far longer than the test: only the evidence can end it.
    let long = ["--lease-ttl", "600"];
    let mut a = Live::start_with(&home, "s1", &long);
    let mut b = Live::start_with(&home, "s1", &long);
    persisted(&a.send(&line("a1", 2)), 2);
    let b1 = line("b1", 2);
    fenced(&b.send(&b1), 2);
    // SIGKILL: no release. Its process is gone, so its lease ends: B's
    // very next resend takes the session over.
    a.kill();
    persisted(&b.send(&b1), 2);
    // Resending what is already stored changes nothing.
    persisted(&b.send(&b1), 2);
    assert_eq!(b.finish(), 3);
    no_divert_file(&home);
    assert_eq!(stored(&home, "s1"), expected(&["a1", "b1"], 2));
}
