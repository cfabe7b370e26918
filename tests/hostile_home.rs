//! A hostile home: what another user, another program or an accident can
//! put where turnsafe keeps its files. Each scenario asserts a clear
//! answer (the exit code `turnsafe --help` lists, and a message naming
//! what was wrong) and that nothing is lost: every message acknowledged is
//! stored, or in a divert file with its receipt, and a batch that is
//! neither is handed back, with nothing acknowledged that is not.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("turnsafe")
}

const USAGE: i32 = 2;
const NOT_PERSISTED: i32 = 3;

/// Run `cmd` with `stdin`, under `timeout` so that a hang is a failure
/// (exit 124) and never a test that waits for ever.
fn run_cmd(mut cmd: Command, stdin: &[u8]) -> Output {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut input = child.stdin.take().unwrap();
    // A process that stops reading early closes its end: that is its answer.
    let _ = input.write_all(stdin);
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(124), "the command hung: {}", text(&out.stderr));
    out
}

/// `turnsafe args` with `stdin`, killed after 120 s.
fn turnsafe(args: &[&str], home: &Path, stdin: &[u8]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("120").arg(bin()).args(args).arg("--home").arg(home);
    run_cmd(cmd, stdin)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn outcomes(out: &Output) -> Vec<Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A home whose state.db cannot be opened (a folder in its place): every
/// batch goes to the divert, or is handed back.
fn home_that_diverts() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("state.db")).unwrap();
    dir
}

/// A batch line of one message with `content`.
fn batch(content: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!([{"role": "user", "content": content}])).unwrap();
    line.push(b'\n');
    line
}

/// A divert line (docs/DIVERT.md, version 2) for `session`.
fn divert_line(session: &str, uid: &str, content: &str) -> String {
    json!({
        "v": 2, "session": session, "uid": uid, "seq": null, "batch": "b1", "cause": "disk",
        "at": "2026-01-01T00:00:00.000Z", "message": {"role": "user", "content": content},
    })
    .to_string()
}

/// The stored contents of `session`, in order, read with a connection of our own.
fn stored(home: &Path, session: &str) -> Vec<String> {
    let c = rusqlite::Connection::open(home.join("state.db")).unwrap();
    let mut s = c
        .prepare("SELECT item FROM messages WHERE session_id = ?1 ORDER BY seq, id")
        .unwrap();
    s.query_map([session], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|t| {
            serde_json::from_str::<Value>(&t.unwrap()).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Every file under `dir`, recursively, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(files_under(&e.path()));
        } else if t.is_file() {
            out.push((e.path(), std::fs::read(e.path()).unwrap()));
        }
    }
    out
}

/// The batch was neither stored nor copied, and the answer says so.
fn handed_back(v: &Value, n: u64) {
    assert_eq!(v["persisted"], false, "{v}");
    assert_eq!(v["handed_back"], n, "{v}");
    assert_eq!(v["diverted"], 0, "{v}");
    assert!(v["receipt"].is_null(), "{v}");
    assert_eq!(v["copy"]["code"], "disk.divert_failed", "{v}");
}

#[test]
fn a_sessions_folder_that_is_a_symlink_is_neither_written_nor_read() {
    let home = home_that_diverts();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), home.path().join("sessions")).unwrap();

    let out = turnsafe(&["append", "--session", "s1"], home.path(), &batch("hello"));
    assert_eq!(out.status.code(), Some(NOT_PERSISTED), "{}", text(&out.stderr));
    let v = &outcomes(&out)[0];
    handed_back(v, 1);
    assert_eq!(v["divert_error"]["errno"], libc::ELOOP, "{v}");
    assert!(
        text(&out.stderr).contains("is a symbolic link"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        files_under(elsewhere.path()).is_empty(),
        "a copy was written through the link"
    );

    // A divert file planted where the link points is not replayed.
    std::fs::write(
        elsewhere.path().join("s1.jsonl"),
        divert_line("s1", "u1", "planted") + "\n",
    )
    .unwrap();
    std::fs::remove_dir(home.path().join("state.db")).unwrap();
    let out = turnsafe(&["replay"], home.path(), b"");
    assert_eq!(out.status.code(), Some(USAGE), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("sessions is a symbolic link"), "{err}");
    assert!(
        elsewhere.path().join("s1.jsonl").is_file(),
        "the planted file was moved"
    );
    assert!(!home.path().join("state.db").exists() || stored(home.path(), "s1").is_empty());
}

fn c_path(path: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn mkfifo(path: &Path) {
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c_path(path).as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}: {}", path.display(), std::io::Error::last_os_error());
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

#[test]
fn a_divert_file_that_is_a_fifo_hangs_nothing_and_holds_nothing() {
    let home = home_that_diverts();
    let sessions = home.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let fifo = sessions.join("s1.jsonl");
    mkfifo(&fifo);
    // Larger than a pipe's buffer (64 KiB): a write into the FIFO would
    // block for ever.
    let big = "x".repeat(200_000);
    let mut input = batch("small");
    input.extend(batch(&big));
    let out = turnsafe(&["append", "--session", "s1"], home.path(), &input);
    assert_eq!(out.status.code(), Some(NOT_PERSISTED), "{}", text(&out.stderr));
    for v in outcomes(&out) {
        handed_back(&v, 1);
        assert_eq!(v["divert_error"]["operation"], "open", "{v}");
        assert!(
            v["divert_error"]["error"]
                .as_str()
                .unwrap()
                .contains("a FIFO, not a regular file"),
            "{v}"
        );
    }

    // Replay and doctor neither wait on it nor take it; a FIFO in
    // settling/ (where a cut replay leaves files) neither.
    std::fs::remove_dir(home.path().join("state.db")).unwrap();
    std::fs::create_dir(sessions.join("settling")).unwrap();
    mkfifo(&sessions.join("settling").join("s2@1-1.jsonl"));
    let out = turnsafe(&["replay", "--json"], home.path(), b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = outcomes(&out).pop().unwrap();
    assert_eq!(summary["data"]["files"], 0, "{summary}");
    assert_eq!(summary["data"]["foreign_files"], json!(["s1.jsonl"]), "{summary}");
    let out = turnsafe(&["doctor", "--json"], home.path(), b"");
    assert!(matches!(out.status.code(), Some(0 | 6)), "{}", text(&out.stderr));
    assert!(fifo.exists() && !fifo.is_file());
}

#[test]
fn a_divert_file_that_is_a_folder_hands_the_batch_back() {
    let home = home_that_diverts();
    std::fs::create_dir_all(home.path().join("sessions").join("s1.jsonl")).unwrap();
    let out = turnsafe(&["append", "--session", "s1"], home.path(), &batch("hello"));
    assert_eq!(out.status.code(), Some(NOT_PERSISTED));
    let v = &outcomes(&out)[0];
    handed_back(v, 1);
    assert_eq!(v["divert_error"]["errno"], libc::EISDIR, "{v}");

    std::fs::remove_dir(home.path().join("state.db")).unwrap();
    let out = turnsafe(&["replay", "--json"], home.path(), b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(home.path().join("sessions").join("s1.jsonl").is_dir());
}

/// Run `turnsafe args` in a child whose address space is capped at
/// `limit` bytes (RLIMIT_AS): reading a file whole past that fails.
fn turnsafe_capped(args: &[&str], home: &Path, limit: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin());
    cmd.args(args).arg("--home").arg(home);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run_cmd(cmd, b"")
}

/// Whether `dir`'s filesystem keeps holes (a sparse file of `size` takes
/// almost no blocks): the scenario must not fill the disk.
fn sparse(path: &Path, size: u64) -> Result<(), String> {
    let f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.set_len(size).unwrap();
    let used = std::fs::metadata(path).unwrap().blocks() * 512;
    if used > 64 << 20 {
        return Err(format!("{} does not keep holes ({used} bytes used)", path.display()));
    }
    Ok(())
}

const GIB: u64 = 1 << 30;

#[test]
fn a_divert_file_of_several_gigabytes_is_streamed_in_bounded_memory() {
    let home = tempfile::tempdir().unwrap();
    let sessions = home.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let path = sessions.join("s1.jsonl");
    std::fs::write(&path, divert_line("s1", "u1", "before") + "\n").unwrap();
    // 3 GiB of zeros (a hole) with no newline: one line larger than the
    // memory the reader may use; then a good line after it.
    turnsafe_tests::require!(sparse(&path, 3 * GIB));
    let tail = format!("\n{}\n", divert_line("s1", "u2", "after"));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(tail.as_bytes())
        .unwrap();
    let size = std::fs::metadata(&path).unwrap().len();

    // Doctor counts the file's lines, and replay settles them, each in a
    // process that cannot hold the long line (1 GiB of address space).
    let out = turnsafe_capped(&["doctor", "--json"], home.path(), GIB);
    assert!(matches!(out.status.code(), Some(0 | 6)), "{}", text(&out.stderr));
    let facts = outcomes(&out)
        .into_iter()
        .find(|r| r["type"] == "facts")
        .expect("facts");
    assert_eq!(facts["data"]["pending_divert_lines"]["message"], 2, "{facts}");

    let out = turnsafe_capped(&["replay", "--json"], home.path(), GIB);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = outcomes(&out).pop().unwrap();
    assert_eq!(summary["data"]["replayed"], 2, "{summary}");
    assert_eq!(summary["data"]["quarantined"], 1, "{summary}");
    assert_eq!(stored(home.path(), "s1"), ["before", "after"]);
    // The long line is quarantined with its reason, its bytes kept.
    let ledger = std::fs::read_to_string(sessions.join("ledger.jsonl")).unwrap();
    let q: Vec<Value> = ledger
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["state"] == "quarantined")
        .collect();
    assert_eq!(q.len(), 1, "{ledger}");
    let reason = q[0]["reason"].as_str().unwrap();
    assert!(reason.contains("longer than the limit of 33619968 bytes"), "{reason}");
    let settled: Vec<PathBuf> = std::fs::read_dir(sessions.join("settled"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(settled.len(), 1);
    assert_eq!(std::fs::metadata(&settled[0]).unwrap().len(), size);
}

/// `setpriv` to run as nobody, and root to use it: as root, modes stop
/// nothing, so an unreadable file needs another user.
fn as_nobody() -> Result<(), String> {
    let is_root = euid() == 0;
    let have = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if is_root && have {
        Ok(())
    } else {
        Err(format!("needs root and setpriv (root: {is_root}, setpriv: {have})"))
    }
}

fn turnsafe_as_nobody(args: &[&str], home: &Path) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("120")
        .args(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"])
        .arg(bin())
        .args(args)
        .arg("--home")
        .arg(home);
    run_cmd(cmd, b"")
}

fn chown_nobody(path: &Path) {
    let st = Command::new("chown")
        .args(["-R", "nobody:nogroup"])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn a_file_unreadable_halfway_through_a_replay_stops_it_and_loses_nothing() {
    turnsafe_tests::require!(as_nobody());
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = top.path().join("home");
    let sessions = home.join("sessions");
    let settling = sessions.join("settling");
    std::fs::create_dir_all(&settling).unwrap();
    // Pending: s1's divert file, and s2's file a cut replay left in
    // settling/. The second one turns unreadable before its turn comes.
    std::fs::write(sessions.join("s1.jsonl"), divert_line("s1", "a1", "first") + "\n").unwrap();
    let s2 = settling.join("s2@1-1.jsonl");
    std::fs::write(&s2, divert_line("s2", "b1", "second") + "\n").unwrap();
    chown_nobody(&home);
    std::fs::set_permissions(&s2, std::fs::Permissions::from_mode(0o000)).unwrap();

    let out = turnsafe_as_nobody(&["replay", "--json"], &home);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(USAGE), "{err}");
    assert!(
        err.contains("s2@1-1.jsonl") && err.contains("Permission denied"),
        "{err}"
    );
    // What was read before it is stored and settled; the unreadable file
    // stays where it was, whole.
    assert_eq!(stored(&home, "s1"), ["first"]);
    assert!(stored(&home, "s2").is_empty());
    assert!(s2.is_file());
    let settled = std::fs::read_dir(sessions.join("settled")).unwrap().count();
    assert_eq!(settled, 1);

    // Readable again: the next run settles it.
    std::fs::set_permissions(&s2, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = turnsafe_as_nobody(&["replay", "--json"], &home);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(stored(&home, "s2"), ["second"]);
    assert_eq!(stored(&home, "s1"), ["first"]);
}

/// Session ids that could leave `sessions/` or are too long, refused by
/// every command that takes one, and by `append`'s lines naming one.
#[test]
fn a_hostile_session_id_is_refused_everywhere_in_the_cli() {
    let home = tempfile::tempdir().unwrap();
    let out = turnsafe(&["append", "--session", "s0"], home.path(), &batch("kept"));
    assert_eq!(out.status.code(), Some(0));
    let long = "a".repeat(300);
    for bad in ["../x", "..", "a/b", &long] {
        for args in [
            vec!["append", "--session", bad],
            vec!["show", "--session", bad],
            vec!["pop", "--session", bad],
            vec!["clear", "--session", bad],
            vec!["replay", "--session", bad],
        ] {
            let out = turnsafe(&args, home.path(), &batch("hi"));
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {err}");
            assert!(err.contains("session"), "{args:?}: {err}");
        }
    }
    // Lines naming their own session (no --session): NUL included, which
    // no argument can carry. Each is refused on its own, nothing stored.
    let mut input = Vec::new();
    for bad in ["../x", "a\u{0}b", long.as_str(), "/etc/passwd"] {
        let line = json!({"session": bad, "messages": [{"role": "user", "content": "hi"}]});
        input.extend(serde_json::to_vec(&line).unwrap());
        input.push(b'\n');
    }
    let out = turnsafe(&["append"], home.path(), &input);
    assert_eq!(out.status.code(), Some(NOT_PERSISTED), "{}", text(&out.stderr));
    let answers = outcomes(&out);
    assert_eq!(answers.len(), 4);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a["line"], i as u64 + 1, "{a}");
        assert!(a["error"].as_str().unwrap().contains("session"), "{a}");
    }
    assert!(!home.path().join("sessions").exists());
    assert!(!home.path().parent().unwrap().join("x.jsonl").exists());
    let c = rusqlite::Connection::open(home.path().join("state.db")).unwrap();
    let sessions: Vec<String> = c
        .prepare("SELECT DISTINCT session_id FROM messages")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(sessions, ["s0"]);
}

#[test]
fn a_state_db_that_is_a_symlink_is_written_through_and_doctor_says_so() {
    let home = tempfile::tempdir().unwrap();
    let real = tempfile::tempdir().unwrap();
    let out = turnsafe(&["append", "--session", "s1"], real.path(), &batch("one"));
    assert_eq!(out.status.code(), Some(0));
    std::os::unix::fs::symlink(real.path().join("state.db"), home.path().join("state.db")).unwrap();

    let out = turnsafe(&["append", "--session", "s1"], home.path(), &batch("two"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(outcomes(&out)[0]["persisted"], true);
    // Acknowledged means stored, in the file the link names.
    assert_eq!(stored(real.path(), "s1"), ["one", "two"]);
    let out = turnsafe(&["doctor"], home.path(), b"");
    let report = text(&out.stdout);
    assert!(
        report.contains("state.db is a symbolic link to") && report.contains(real.path().to_str().unwrap()),
        "{report}"
    );

    // The link pointed elsewhere under a live writer: what it acknowledges
    // is in the file it opened, none of it lost, none of it in the other.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(real.path().join("state.db"), other.path().join("state.db")).unwrap();
    let mut child = Command::new(bin())
        .args(["append", "--session", "s1", "--home"])
        .arg(home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut send = |content: &str| {
        use std::io::BufRead;
        input.write_all(&batch(content)).unwrap();
        input.flush().unwrap();
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    assert_eq!(send("three")["persisted"], true);
    std::fs::remove_file(home.path().join("state.db")).unwrap();
    std::os::unix::fs::symlink(other.path().join("state.db"), home.path().join("state.db")).unwrap();
    let after = send("four");
    drop(input);
    assert!(child.wait().unwrap().code().is_some());
    let acknowledged = after["persisted"] == true || !after["receipt"].is_null();
    assert!(acknowledged || after["handed_back"] == 1, "{after}");
    if after["persisted"] == true {
        assert_eq!(stored(real.path(), "s1"), ["one", "two", "three", "four"]);
    } else {
        assert_eq!(stored(real.path(), "s1"), ["one", "two", "three"]);
    }
    assert_eq!(stored(other.path(), "s1"), ["one", "two"]);
}

#[test]
fn another_users_divert_file_is_neither_appended_to_nor_replayed() {
    let home = home_that_diverts();
    let sessions = home.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o700)).unwrap();
    let planted = sessions.join("s1.jsonl");
    let planted_line = divert_line("s1", "evil", "words put in the user's mouth") + "\n";
    std::fs::write(&planted, &planted_line).unwrap();
    // Owned by someone else than this process's user and the folder's owner.
    let other = if euid() == 65534 { 65533 } else { 65534 };
    // SAFETY: a valid NUL-terminated path; -1 keeps the group.
    let rc = unsafe { libc::chown(c_path(&planted).as_ptr(), other, u32::MAX) };
    let chowned = if rc == 0 {
        Ok(())
    } else {
        Err(format!("chown to uid {other}: {}", std::io::Error::last_os_error()))
    };
    turnsafe_tests::require!(chowned);

    let out = turnsafe(&["append", "--session", "s1"], home.path(), &batch("mine"));
    assert_eq!(out.status.code(), Some(NOT_PERSISTED));
    let v = &outcomes(&out)[0];
    handed_back(v, 1);
    assert_eq!(v["divert_error"]["errno"], libc::EPERM, "{v}");
    assert!(
        text(&out.stderr).contains(&format!("belongs to uid {other}")),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), planted_line);

    std::fs::remove_dir(home.path().join("state.db")).unwrap();
    let out = turnsafe(&["replay", "--json"], home.path(), b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = outcomes(&out).pop().unwrap();
    assert_eq!(summary["data"]["replayed"], 0, "{summary}");
    assert_eq!(summary["data"]["foreign_files"], json!(["s1.jsonl"]), "{summary}");
    assert!(!home.path().join("state.db").exists() || stored(home.path(), "s1").is_empty());
    let out = turnsafe(&["doctor"], home.path(), b"");
    let report = text(&out.stdout);
    assert!(report.contains(&format!("s1.jsonl (uid {other})")), "{report}");
}

#[test]
fn a_postgres_password_is_never_printed_on_an_error_path() {
    let home = tempfile::tempdir().unwrap();
    let secret = "S3cretPw0rd";
    // Nothing listens on port 1; each URL fails somewhere else: the
    // connection, the port, the brackets, an option, the query string.
    for url in [
        format!("postgres://alice:{secret}@127.0.0.1:1/db"),
        format!("postgres://alice:{secret}@127.0.0.1:notaport/db"),
        format!("postgres://alice:{secret}@[::1/db"),
        format!("postgres://alice:{secret}@127.0.0.1:1/db?sslmode=bogus"),
        format!("postgres://alice:{secret}%21@127.0.0.1:1/db?connect_timeout=zz"),
        format!("postgres://127.0.0.1:1/db?user=alice&password={secret}"),
        format!("host=127.0.0.1 port=1 user=alice password={secret}"),
    ] {
        for args in [
            vec!["append", "--session", "s1"],
            vec!["append"],
            vec!["replay"],
            vec!["replay", "--json"],
            vec!["doctor", "--json"],
            vec!["show", "--session", "s1"],
            vec!["search", "hi"],
        ] {
            let mut cmd = Command::new("timeout");
            cmd.arg("120")
                .arg(bin())
                .args(&args)
                .arg("--home")
                .arg(home.path())
                .env("TURNSAFE_DB", &url)
                .env("TURNSAFE_LOG", "trace");
            let out = run_cmd(cmd, &batch("hi"));
            let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
            assert_ne!(out.status.code(), Some(0), "{url} {args:?}: {all}");
            assert!(!all.contains(secret), "{url} {args:?} printed the password: {all}");
            assert!(!all.is_empty(), "{url} {args:?}: no message at all");
        }
    }
}

#[test]
fn a_receipt_naming_a_huge_file_or_a_fifo_is_checked_without_reading_it_whole_or_waiting() {
    let dir = tempfile::tempdir().unwrap();
    // The receipt's range sits after 3 GiB of hole: only the range is read.
    let big = dir.path().join("big.jsonl");
    std::fs::write(&big, b"").unwrap();
    turnsafe_tests::require!(sparse(&big, 3 * GIB));
    let line = divert_line("s1", "u1", "far") + "\n";
    std::fs::OpenOptions::new()
        .append(true)
        .open(&big)
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(line.as_bytes()))
    };
    let receipt = |path: &Path| {
        let p = dir
            .path()
            .join(format!("{}.receipt.json", path.file_name().unwrap().to_str().unwrap()));
        let r = json!({"path": path, "offset": 3 * GIB, "length": line.len(), "count": 1, "sha256": sha});
        std::fs::write(&p, r.to_string()).unwrap();
        p
    };
    let explain = |r: &Path| {
        let mut cmd = Command::new(bin());
        cmd.args(["explain", "--cause", "disk", "--outcome", "diverted", "--receipt-json"])
            .arg(r);
        cmd
    };
    use std::os::unix::process::CommandExt;
    let mut capped = explain(&receipt(&big));
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        capped.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: GIB,
                rlim_max: GIB,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = run_cmd(capped, b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("A copy was kept at"),
        "{}",
        text(&out.stdout)
    );

    let fifo = dir.path().join("fifo.jsonl");
    mkfifo(&fifo);
    let r = receipt(&fifo);
    let mut cmd = Command::new("timeout");
    cmd.arg("120")
        .arg(bin())
        .args(["explain", "--cause", "disk", "--outcome", "diverted", "--receipt-json"])
        .arg(&r);
    let out = run_cmd(cmd, b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(USAGE), "{err}");
    assert!(err.contains("not a regular file (a FIFO)"), "{err}");
}
