//! Focused tests of the divert: session ids, the receipt against the
//! file's real bytes, modes, the symlink refusal, the lock, the receipt
//! check, and (on powerfs, the test filesystem that forgets what was not
//! fsynced) real EIO from fsync, folder fsync, write and ftruncate, with a
//! power cut after each. Fast enough for every mutant of
//! `scripts/mutants-host`.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::sync::{Arc, Mutex};

use powerfs::{CutMode, Fault, FaultOp, PathMatch, PowerFs};
use serde_json::Value;

use super::*;

fn messages(tag: &str, n: usize) -> Vec<Message> {
    (0..n).map(|i| Message::new("user", &format!("{tag} {i}"))).collect()
}

fn uids(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}

/// Divert `n` messages tagged `tag` (uids `<tag>-<i>`, seq from 1).
fn divert_n(dir: &Path, session: &str, tag: &str, n: usize) -> Result<Receipt, DivertError> {
    let (msgs, ids) = (messages(tag, n), uids(tag, n));
    let lines: Vec<DivertLine<'_>> = msgs
        .iter()
        .zip(&ids)
        .enumerate()
        .map(|(i, (message, uid))| DivertLine {
            uid,
            seq: Some(i as i64 + 1),
            message,
        })
        .collect();
    divert(dir, session, &format!("batch-{tag}"), Cause::Disk, &lines)
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

/// The receipt names exactly `file[offset..offset+length]`, its sha256
/// and its line count, and `verify_receipt` agrees.
fn assert_receipt_matches(r: &Receipt, file: &Path, count: u64) {
    assert!(Path::new(&r.path).is_absolute(), "{}", r.path);
    assert_eq!(Path::new(&r.path), std::path::absolute(file).unwrap());
    let data = std::fs::read(file).unwrap();
    assert_eq!((r.offset + r.length) as usize, data.len(), "the batch ends the file");
    let range = &data[r.offset as usize..];
    assert_eq!(r.sha256, sha(range));
    assert_eq!(r.count, count);
    assert_eq!(range.iter().filter(|b| **b == b'\n').count() as u64, count);
    assert!(
        r.offset == 0 || data[r.offset as usize - 1] == b'\n',
        "starts on a fresh line"
    );
    assert!(verify_receipt(r).unwrap());
}

#[test]
fn session_ids_are_checked_at_every_edge() {
    let ok = [
        "a".to_string(),
        "a".repeat(MAX_SESSION_ID),
        "s1.jsonl".into(),
        "a.b".into(),
        "end.".into(),
        "A-z_0:9".into(),
    ];
    for id in &ok {
        assert_eq!(validate_session_id(id), Ok(()), "{id:?}");
    }
    let refused = [
        String::new(),
        "a".repeat(MAX_SESSION_ID + 1),
        ".".into(),
        ".hidden".into(),
        "..".into(),
        "a..b".into(),
        "../etc".into(),
        "a/b".into(),
        "/abs".into(),
        "a\\b".into(),
        "a\0b".into(),
        "a b".into(),
        "a\nb".into(),
        "é".into(),
        "ä".repeat(MAX_SESSION_ID / 2),
    ];
    for id in &refused {
        assert!(validate_session_id(id).is_err(), "{id:?} accepted");
    }
    // Each rule says which one refused.
    assert!(validate_session_id("").unwrap_err().contains("1 to 128 bytes"));
    assert!(
        validate_session_id(&"a".repeat(129))
            .unwrap_err()
            .contains("1 to 128 bytes")
    );
    assert!(validate_session_id(".a").unwrap_err().contains("start with `.`"));
    assert!(validate_session_id("a/b").unwrap_err().contains("only ASCII"));

    // A refused id never reaches the file system.
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let e = divert_n(&sessions, "../escape", "x", 1).unwrap_err();
    assert_eq!((e.operation, e.errno), ("validate", Some(i64::from(libc::EINVAL))));
    assert!(e.path.is_none() && e.residue.is_none());
    assert!(!sessions.exists());
}

#[test]
fn the_first_divert_receipt_covers_exactly_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let r = divert_n(&sessions, "s1", "one", 3).unwrap();
    let file = sessions.join("s1.jsonl");
    assert_eq!(r.offset, 0);
    assert_eq!(r.length, std::fs::metadata(&file).unwrap().len());
    assert_receipt_matches(&r, &file, 3);
    assert_eq!(mode(&file), 0o600, "divert file mode");
    assert_eq!(mode(&sessions), 0o700, "sessions folder mode");

    // Each line is self-describing (docs/DIVERT.md).
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["v"], FORMAT_VERSION);
        assert_eq!(l["session"], "s1");
        assert_eq!(l["uid"], format!("one-{i}"));
        assert_eq!(l["seq"], i as i64 + 1);
        assert_eq!(l["batch"], "batch-one");
        assert_eq!(l["cause"], "disk");
        assert_eq!(
            l["message"],
            serde_json::json!({"role": "user", "content": format!("one {i}")})
        );
        assert!(humantime::parse_rfc3339(l["at"].as_str().unwrap()).is_ok());
    }
}

#[test]
fn an_appended_divert_starts_where_the_file_ended() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let file = sessions.join("s1.jsonl");
    let first = divert_n(&sessions, "s1", "one", 2).unwrap();
    let len1 = std::fs::metadata(&file).unwrap().len();
    let second = divert_n(&sessions, "s1", "two", 3).unwrap();
    assert_eq!(second.offset, len1, "no byte between the batches");
    assert_receipt_matches(&second, &file, 3);
    // The first receipt still vouches for its own range.
    assert!(verify_receipt(&first).unwrap());
    assert_eq!(first.offset + first.length, second.offset);
    // Another session has its own file.
    let other = divert_n(&sessions, "s2", "three", 1).unwrap();
    assert_eq!(other.offset, 0);
    assert_receipt_matches(&other, &sessions.join("s2.jsonl"), 1);
}

#[test]
fn after_a_torn_line_the_batch_starts_on_a_fresh_line() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let file = sessions.join("s1.jsonl");
    let torn = b"{\"v\":2,\"session\":\"s1\",\"uid\":\"cr";
    std::fs::write(&file, torn).unwrap();
    let r = divert_n(&sessions, "s1", "after", 2).unwrap();
    assert_eq!(r.offset, torn.len() as u64 + 1, "one newline closes the torn line");
    let data = std::fs::read(&file).unwrap();
    assert_eq!(&data[..torn.len()], torn, "the torn line is kept as it was");
    assert_eq!(data[torn.len()], b'\n');
    assert_eq!(r.length, data.len() as u64 - r.offset, "the newline is not the batch's");
    assert_receipt_matches(&r, &file, 2);
}

#[test]
fn an_existing_empty_file_gets_no_newline() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let file = sessions.join("s1.jsonl");
    std::fs::write(&file, b"").unwrap();
    let r = divert_n(&sessions, "s1", "x", 1).unwrap();
    assert_eq!(r.offset, 0);
    assert_eq!(std::fs::read(&file).unwrap()[0], b'{');
    assert_receipt_matches(&r, &file, 1);
}

#[test]
fn a_symlink_at_the_divert_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, b"keep\n").unwrap();
    symlink(&target, sessions.join("s1.jsonl")).unwrap();
    let e = divert_n(&sessions, "s1", "x", 1).unwrap_err();
    assert_eq!((e.operation, e.errno), ("open", Some(i64::from(libc::ELOOP))));
    assert_eq!(std::fs::read(&target).unwrap(), b"keep\n");
    // A dangling one is not followed either: nothing is created behind it.
    let dangling = dir.path().join("nowhere");
    symlink(&dangling, sessions.join("s2.jsonl")).unwrap();
    assert!(divert_n(&sessions, "s2", "x", 1).is_err());
    assert!(!dangling.exists());
}

#[test]
fn a_missing_parent_fails_at_mkdir_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("no-home/sessions");
    let e = divert_n(&sessions, "s1", "x", 1).unwrap_err();
    assert_eq!((e.operation, e.errno), ("mkdir", Some(i64::from(libc::ENOENT))));
    assert_eq!(e.path.as_deref(), Some(sessions.as_path()));
    assert!(!dir.path().join("no-home").exists());
}

#[test]
fn a_folder_that_refuses_new_files_reports_the_create_error() {
    // sysfs refuses to create a file (EACCES, or EROFS when mounted
    // read-only); the reopen without O_CREAT would only say ENOENT.
    let sys = Path::new("/sys");
    turnsafe_tests::require!(if sys.join("kernel").is_dir() {
        Ok(())
    } else {
        Err("/sys is not mounted".to_string())
    });
    let e = divert_n(sys, "turnsafe-probe", "x", 1).unwrap_err();
    assert_eq!(e.operation, "open");
    assert!(
        [libc::EACCES, libc::EROFS, libc::EPERM]
            .map(i64::from)
            .contains(&e.errno.unwrap()),
        "{e:?}"
    );
}

/// Where a hook tried to take the lock, and the errno it got.
type Attempt = (&'static str, Option<rustix::io::Errno>);

#[test]
fn the_file_is_locked_while_the_batch_is_written_and_synced() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let file = sessions.join("s1.jsonl");
    divert_n(&sessions, "s1", "first", 1).unwrap();
    let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let mut hooks = Vec::new();
    for point in ["divert.before_write", "divert.before_fsync"] {
        let (seen, file) = (seen.clone(), file.clone());
        hooks.push(crate::failpoint::on(point, move || {
            // Another open file description of the same file.
            let other = File::open(&file).unwrap();
            let got = rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive).err();
            seen.lock().unwrap().push((point, got));
        }));
    }
    divert_n(&sessions, "s1", "second", 2).unwrap();
    drop(hooks);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("divert.before_write", Some(rustix::io::Errno::WOULDBLOCK)),
            ("divert.before_fsync", Some(rustix::io::Errno::WOULDBLOCK)),
        ]
    );
    // Released once the divert returned.
    let other = File::open(&file).unwrap();
    rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
}

#[test]
fn verify_receipt_refuses_a_tampered_byte_a_wrong_count_and_a_range_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let file = sessions.join("s1.jsonl");
    divert_n(&sessions, "s1", "first", 2).unwrap();
    let r = divert_n(&sessions, "s1", "second", 3).unwrap();
    assert!(r.offset > 0);
    assert!(verify_receipt(&r).unwrap());

    let wrong_count = Receipt {
        count: r.count + 1,
        ..r.clone()
    };
    assert!(!verify_receipt(&wrong_count).unwrap(), "a wrong count");
    let fewer = Receipt {
        count: r.count - 1,
        ..r.clone()
    };
    assert!(!verify_receipt(&fewer).unwrap(), "a wrong count");
    let past_end = Receipt {
        length: r.length + 1,
        ..r.clone()
    };
    assert!(!verify_receipt(&past_end).unwrap(), "a range past the end");
    let moved = Receipt {
        offset: r.offset + 1,
        ..r.clone()
    };
    assert!(!verify_receipt(&moved).unwrap(), "a range past the end");
    let wrong_sha = Receipt {
        sha256: sha(b"other"),
        ..r.clone()
    };
    assert!(!verify_receipt(&wrong_sha).unwrap(), "another checksum");

    // One byte of the range changed in place (same length, same newlines).
    let mut data = std::fs::read(&file).unwrap();
    let at = r.offset as usize + 5;
    data[at] = if data[at] == b'x' { b'y' } else { b'x' };
    std::fs::write(&file, &data).unwrap();
    assert!(!verify_receipt(&r).unwrap(), "a tampered byte");

    // A missing file is an error, not a verdict.
    std::fs::remove_file(&file).unwrap();
    assert!(verify_receipt(&r).is_err());
}

#[test]
fn divert_step_numbers_the_lines_and_advances_seq_only_with_a_receipt() {
    use turnsafe_policy::machine::Event;
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let (msgs, ids) = (messages("m", 3), uids("m", 3));
    let mut next = Some(10);
    let (event, err) = divert_step(&sessions, "s1", &msgs, &ids, &mut next, Cause::Locked);
    assert!(err.is_none());
    let Event::Diverted(r) = event else { panic!("{event:?}") };
    assert_receipt_matches(&r, &sessions.join("s1.jsonl"), 3);
    assert_eq!(next, Some(13));
    let text = std::fs::read_to_string(sessions.join("s1.jsonl")).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seqs: Vec<_> = lines.iter().map(|l| l["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [10, 11, 12]);
    assert!(
        lines
            .iter()
            .all(|l| l["cause"] == "locked" && l["batch"] == lines[0]["batch"])
    );
    assert_eq!(
        lines.iter().map(|l| l["uid"].as_str().unwrap()).collect::<Vec<_>>(),
        ids
    );

    // Without a known seq the lines carry none, and none is invented.
    let mut none = None;
    let (event, _) = divert_step(&sessions, "s1", &msgs[..1], &ids[..1], &mut none, Cause::Disk);
    assert!(matches!(event, Event::Diverted(_)));
    assert_eq!(none, None);
    let last: Value = serde_json::from_str(
        std::fs::read_to_string(sessions.join("s1.jsonl"))
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["seq"], Value::Null);

    // A failed divert hands the batch back and leaves the seq alone.
    let (event, err) = divert_step(&sessions, "../s1", &msgs, &ids, &mut next, Cause::Disk);
    let err = err.expect("the host's error");
    assert_eq!(err.operation, "validate");
    assert_eq!(
        event,
        Event::DivertFailed {
            failure: turnsafe_policy::DivertFailure {
                operation: "validate".into(),
                errno: Some(i64::from(libc::EINVAL)),
            },
            message: err.message.clone(),
            residue: None,
        }
    );
    assert_eq!(next, Some(13));
}

#[test]
fn a_divert_error_says_its_operation_and_errno_and_never_its_path() {
    let e = DivertError::io(
        "fsync",
        Path::new("/home/x/sessions/s1.jsonl"),
        &io::Error::from_raw_os_error(libc::EIO),
    );
    assert_eq!(e.errno, Some(i64::from(libc::EIO)));
    assert_eq!(e.path.as_deref(), Some(Path::new("/home/x/sessions/s1.jsonl")));
    assert!(e.residue.is_none());
    assert_eq!(
        e.to_value(),
        json!({"operation": "fsync", "errno": libc::EIO, "error": turnsafe_policy::errno::human(i64::from(libc::EIO))})
    );
    assert!(!e.to_value().to_string().contains("s1.jsonl"));
    assert_eq!(
        e.to_failure(),
        turnsafe_policy::DivertFailure {
            operation: "fsync".into(),
            errno: Some(i64::from(libc::EIO)),
        }
    );
    assert!(e.to_string().contains("divert fsync failed"), "{e}");
    // Without an errno, the message stands in.
    let no_errno = DivertError {
        operation: "encode",
        errno: None,
        message: "bad".into(),
        path: None,
        residue: None,
    };
    assert_eq!(
        no_errno.to_value(),
        json!({"operation": "encode", "errno": null, "error": "bad"})
    );
}

/// A powerfs mount with `home/` on it, its entry durable.
struct Mounted {
    fs: PowerFs,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn new() -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).expect("mount powerfs");
        std::fs::create_dir(fs.path().join("home")).unwrap();
        sync_dir(fs.path()).unwrap();
        Mounted { fs, _dir: dir }
    }
    fn sessions(&self) -> PathBuf {
        self.fs.path().join("home/sessions")
    }
    fn file(&self) -> PathBuf {
        self.sessions().join("s1.jsonl")
    }
    fn cut(&mut self) {
        self.fs.cut(CutMode::DropPending).unwrap();
        self.fs.remount().unwrap();
    }
}

const FILE: &str = "home/sessions/s1.jsonl";

#[test]
fn a_receipt_survives_a_power_cut_new_file_new_folder_and_appended() {
    turnsafe_tests::require!(PowerFs::available());
    let mut m = Mounted::new();
    let first = divert_n(&m.sessions(), "s1", "one", 2).unwrap();
    m.cut();
    assert!(
        verify_receipt(&first).unwrap(),
        "the new folder, file and bytes survive"
    );
    let second = divert_n(&m.sessions(), "s1", "two", 3).unwrap();
    m.cut();
    assert!(verify_receipt(&first).unwrap());
    assert_receipt_matches(&second, &m.file(), 3);
}

#[test]
fn a_failed_fsync_is_cut_back_and_the_power_cut_keeps_the_old_bytes() {
    turnsafe_tests::require!(PowerFs::available());
    let mut m = Mounted::new();
    divert_n(&m.sessions(), "s1", "kept", 2).unwrap();
    let before = std::fs::read(m.file()).unwrap();
    let eio =
        m.fs.inject(Fault::new(FaultOp::FileSync, PathMatch::exact(FILE)).nth(1));
    let e = divert_n(&m.sessions(), "s1", "lost", 2).unwrap_err();
    assert_eq!(m.fs.fault_fired(eio), 1);
    assert_eq!((e.operation, e.errno), ("fsync", Some(i64::from(libc::EIO))));
    assert!(e.residue.is_none(), "the cut-back succeeded");
    assert_eq!(
        std::fs::read(m.file()).unwrap(),
        before,
        "cut back to where the batch began"
    );
    m.cut();
    assert_eq!(std::fs::read(m.file()).unwrap(), before);
}

#[test]
fn a_failed_write_leaves_the_file_as_it_was() {
    turnsafe_tests::require!(PowerFs::available());
    let m = Mounted::new();
    divert_n(&m.sessions(), "s1", "kept", 1).unwrap();
    let before = std::fs::read(m.file()).unwrap();
    let eio = m.fs.inject(Fault::new(FaultOp::Write, PathMatch::exact(FILE)));
    let e = divert_n(&m.sessions(), "s1", "lost", 2).unwrap_err();
    assert!(m.fs.fault_fired(eio) >= 1);
    assert_eq!((e.operation, e.errno), ("write", Some(i64::from(libc::EIO))));
    assert!(e.residue.is_none());
    assert_eq!(std::fs::read(m.file()).unwrap(), before);
}

#[test]
fn when_the_cut_back_fails_the_residue_says_where_the_batch_began() {
    turnsafe_tests::require!(PowerFs::available());
    let m = Mounted::new();
    std::fs::create_dir(m.sessions()).unwrap();
    let torn = b"{\"torn";
    std::fs::write(m.file(), torn).unwrap();
    // The fsync fails, then the ftruncate that would cut the batch away.
    m.fs.inject(Fault::new(FaultOp::FileSync, PathMatch::exact(FILE)).nth(1));
    let trunc = m.fs.inject(Fault::new(FaultOp::Truncate, PathMatch::exact(FILE)));
    let e = divert_n(&m.sessions(), "s1", "lost", 2).unwrap_err();
    assert_eq!(m.fs.fault_fired(trunc), 1);
    assert_eq!(e.operation, "fsync");
    let residue = e.residue.expect("a residue");
    assert_eq!(Path::new(&residue.path), m.file());
    assert_eq!(residue.offset, torn.len() as u64 + 1, "after the torn line's newline");
    let data = std::fs::read(m.file()).unwrap();
    assert_eq!(
        data.iter().filter(|b| **b == b'\n').count(),
        3,
        "the batch's lines remain"
    );
}

#[test]
fn when_the_cut_back_cannot_be_synced_the_residue_is_named_too() {
    turnsafe_tests::require!(PowerFs::available());
    let m = Mounted::new();
    divert_n(&m.sessions(), "s1", "kept", 1).unwrap();
    let size = std::fs::metadata(m.file()).unwrap().len();
    // Every fsync of the file fails: the divert's and the cut-back's.
    let eio = m.fs.inject(Fault::new(FaultOp::FileSync, PathMatch::exact(FILE)));
    let e = divert_n(&m.sessions(), "s1", "lost", 2).unwrap_err();
    assert_eq!(m.fs.fault_fired(eio), 2);
    let residue = e.residue.expect("a residue");
    assert_eq!((Path::new(&residue.path), residue.offset), (m.file().as_path(), size));
}

#[test]
fn a_failed_folder_fsync_fails_the_divert() {
    turnsafe_tests::require!(PowerFs::available());
    for folder in ["home/sessions", "home"] {
        let mut m = Mounted::new();
        let eio = m.fs.inject(Fault::new(FaultOp::DirSync, PathMatch::exact(folder)));
        let e = divert_n(&m.sessions(), "s1", "lost", 2).unwrap_err();
        assert_eq!(m.fs.fault_fired(eio), 1, "{folder}");
        assert_eq!(
            (e.operation, e.errno),
            ("fsync_dir", Some(i64::from(libc::EIO))),
            "{folder}"
        );
        assert_eq!(std::fs::metadata(m.file()).unwrap().len(), 0, "{folder}: cut back");
        m.fs.clear_faults();
        m.cut();
    }
}

#[test]
fn sync_dir_and_sync_path_entries_report_a_missing_folder() {
    let dir = tempfile::tempdir().unwrap();
    assert!(sync_dir(&dir.path().join("missing")).is_err());
    assert!(sync_path_entries(&dir.path().join("missing")).is_err());
    sync_path_entries(dir.path()).unwrap();
}

/// A divert file taken from its path (as replay and clear take it, by a
/// rename under the lock) between the writer's open and its lock: the
/// writer appends to the file now at the path, never to the taken one,
/// and its receipt names what it wrote.
#[test]
fn a_file_taken_between_open_and_lock_is_not_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    divert_n(&sessions, "s1", "first", 1).unwrap();
    let taken = dir.path().join("taken.jsonl");
    let before = std::fs::read(sessions.join("s1.jsonl")).unwrap();

    let (from, to) = (sessions.join("s1.jsonl"), taken.clone());
    let once = std::sync::atomic::AtomicBool::new(true);
    let _hook = crate::failpoint::on("divert.before_lock", move || {
        if once.swap(false, std::sync::atomic::Ordering::SeqCst) {
            // Taken as replay's `take` does: under the file's own lock.
            let f = std::fs::File::open(&from).unwrap();
            rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
            std::fs::rename(&from, &to).unwrap();
        }
    });
    let r = divert_n(&sessions, "s1", "second", 2).unwrap();

    assert_eq!(
        std::fs::read(&taken).unwrap(),
        before,
        "the taken file is not written to"
    );
    let now = std::fs::read(sessions.join("s1.jsonl")).unwrap();
    assert_eq!(r.offset, 0, "the receipt is of the new file at the path");
    assert_eq!(r.length, now.len() as u64);
    assert_eq!(r.sha256, sha(&now));
    assert_eq!(String::from_utf8_lossy(&now).lines().count(), 2);
}
