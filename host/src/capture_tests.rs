//! Focused tests of the capture of a retired generation, from a live
//! SQLite connection's held descriptors: the manifest's fields against the
//! captured bytes, the folder's name and modes, a folder never reused, a
//! read that never comes back short or hangs, and (on powerfs) real EIO
//! from a file's fsync, a write and a folder fsync, and a power cut after a
//! capture that returned.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::mpsc;
use std::time::Duration;

use powerfs::{CutMode, Fault, FaultOp, PathMatch, PowerFs};
use rusqlite::Connection;
use serde_json::Value;
use turnsafe_policy::{Cause, Evidence};

use super::*;

const GENERATION: i32 = 0x0bad_cafe;

/// `dir/state.db` in WAL mode with [`GENERATION`] in its header and rows
/// in its WAL, and the live connection holding its three files.
fn wal_db(dir: &Path) -> (PathBuf, Connection) {
    let db = dir.join("state.db");
    let conn = Connection::open(&db).unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(())).unwrap();
    conn.execute_batch(&format!(
        "PRAGMA application_id = {GENERATION}; CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(3000));"
    ))
    .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    conn.execute("INSERT INTO t VALUES (randomblob(5000))", []).unwrap();
    (db, conn)
}

fn why() -> Why {
    Why {
        trigger: "the WAL was deleted under the handle".into(),
        cause: Cause::DeletedWal,
        evidence: vec![Evidence::DeletedWalGeneration],
    }
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// `yyyymmddThhmmssZ`, within a minute of now.
fn assert_stamp_is_now(stamp: &str) {
    let b = stamp.as_bytes();
    assert_eq!(b.len(), 16, "{stamp}");
    assert!(b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit), "{stamp}");
    assert_eq!((b[8], b[15]), (b'T', b'Z'), "{stamp}");
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &stamp[..4],
        &stamp[4..6],
        &stamp[6..8],
        &stamp[9..11],
        &stamp[11..13],
        &stamp[13..15]
    );
    let then = humantime::parse_rfc3339(&rfc).unwrap();
    let now = std::time::SystemTime::now();
    let off = now.duration_since(then).unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_secs(60), "{stamp} is not now");
}

/// Runs `f` on a thread of its own and waits at most 5 s. A read that
/// never ends would hang this test and every other capture, and a run
/// that never ends is a timeout, not a failure: end the run as failed.
fn within_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            eprintln!("{what} did not finish in 5 s: ending the test run as failed");
            std::process::exit(101);
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// [`capture`], within the deadline.
fn capture_in_time(guard: &Guard, why: &Why) -> Result<Capture, CaptureError> {
    let (guard, why) = (guard.clone(), why.clone());
    within_deadline("a capture", move || capture(&guard, &why))
}

#[test]
fn a_capture_holds_the_held_files_and_a_manifest_that_describes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let guard = Guard::record(&db, &conn).unwrap();
    let originals: Vec<Vec<u8>> = Part::ALL
        .iter()
        .map(|p| std::fs::read(crate::guard::path_of(&db, *p)).unwrap())
        .collect();
    assert!(originals.iter().all(|d| !d.is_empty()));

    let c = capture_in_time(&guard, &why()).unwrap();
    let folder = PathBuf::from(&c.path);
    assert!(folder.is_absolute());
    assert_eq!(folder.parent().unwrap(), std::fs::canonicalize(dir.path()).unwrap());
    let name = folder.file_name().unwrap().to_str().unwrap();
    let pid = std::process::id();
    let stamp = name
        .strip_prefix("state.db.retired-")
        .and_then(|r| r.strip_suffix(&format!("-{pid}")))
        .unwrap_or_else(|| panic!("{name}"));
    assert_stamp_is_now(stamp);
    assert_eq!(mode(&folder), 0o700);
    assert_eq!(
        names_in(&folder),
        ["manifest.json", "state.db", "state.db-shm", "state.db-wal"],
        "no temporary left"
    );

    // The receipt: each file's name and size, and the manifest's sha256.
    let names = ["state.db", "state.db-wal", "state.db-shm"];
    assert_eq!(c.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), names);
    let manifest_bytes = std::fs::read(folder.join("manifest.json")).unwrap();
    assert_eq!(c.manifest_sha256, sha(&manifest_bytes));
    assert_eq!(mode(&folder.join("manifest.json")), 0o600);
    let m: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(m["format"], 1);
    assert_eq!(m["trigger"], "the WAL was deleted under the handle");
    assert_eq!(m["cause"], "deleted_wal");
    assert_eq!(
        m["evidence"],
        serde_json::json!([Evidence::DeletedWalGeneration.label()])
    );
    assert_eq!(m["source"], guard.db_path().to_str().unwrap());
    assert_eq!(m["generation"], GENERATION);
    assert_eq!(m["pid"], pid);
    assert_eq!(m["captured_by"], pid);
    assert_eq!(m["pid_start"], crate::holders::start_time(pid).unwrap());
    assert!(humantime::parse_rfc3339(m["captured_at"].as_str().unwrap()).is_ok());
    assert_eq!(m["versions"]["turnsafe"], env!("CARGO_PKG_VERSION"));

    let files = m["files"].as_array().unwrap();
    assert_eq!(files.len(), 3);
    for (i, part) in Part::ALL.into_iter().enumerate() {
        let held = guard.held(part).unwrap();
        let f = &files[i];
        let copy = std::fs::read(folder.join(names[i])).unwrap();
        assert_eq!(copy, originals[i], "{}: the held file's bytes", names[i]);
        assert_eq!(mode(&folder.join(names[i])), 0o600);
        assert_eq!(f["name"], names[i]);
        assert_eq!(
            (f["dev"].as_u64(), f["ino"].as_u64()),
            (Some(held.id.dev), Some(held.id.ino))
        );
        assert_eq!(f["fd"], held.fd.unwrap());
        assert_eq!(f["size"], copy.len());
        assert_eq!(c.files[i].size, copy.len() as u64);
        assert_eq!(f["sha256"], sha(&copy));
    }
}

#[test]
fn a_capture_reads_the_held_descriptor_not_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let guard = Guard::record(&db, &conn).unwrap();
    let wal = crate::guard::path_of(&db, Part::Wal);
    let held_wal = std::fs::read(&wal).unwrap();
    // The WAL is deleted and another file takes its name.
    std::fs::remove_file(&wal).unwrap();
    std::fs::write(&wal, b"not the held generation").unwrap();
    let c = capture_in_time(&guard, &why()).unwrap();
    assert_eq!(
        std::fs::read(Path::new(&c.path).join("state.db-wal")).unwrap(),
        held_wal
    );
    let m: Value = serde_json::from_slice(&std::fs::read(Path::new(&c.path).join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["files"][1]["ino"], guard.held(Part::Wal).unwrap().id.ino);
    assert_ne!(
        std::fs::metadata(&wal).unwrap().ino(),
        guard.held(Part::Wal).unwrap().id.ino
    );
}

#[test]
fn only_the_files_the_handle_holds_are_captured() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    {
        let c = Connection::open(&db).unwrap();
        c.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(())).unwrap();
        c.execute_batch("CREATE TABLE t(x);").unwrap();
    }
    let conn = Connection::open(&db).unwrap();
    let guard = Guard::record(&db, &conn).unwrap();
    let c = capture_in_time(&guard, &why()).unwrap();
    assert_eq!(
        c.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["state.db"]
    );
    assert_eq!(names_in(Path::new(&c.path)), ["manifest.json", "state.db"]);
    assert_eq!(c.files[0].size, std::fs::metadata(&db).unwrap().len());
}

#[test]
fn a_capture_folder_is_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let holder = 4242;
    for _ in 0..10 {
        let stamp = utc_stamp();
        assert_stamp_is_now(&stamp);
        let taken = dir.path().join(format!("state.db.retired-{stamp}-{holder}"));
        let _ = std::fs::create_dir(&taken);
        let _ = std::fs::write(taken.join("marker"), b"mine");
        for n in 2..=3 {
            let _ = std::fs::create_dir(dir.path().join(format!("state.db.retired-{stamp}.{n}-{holder}")));
        }
        let made = new_capture_dir(dir.path(), holder).unwrap();
        if utc_stamp() != stamp {
            continue; // The second turned meanwhile: try again.
        }
        assert_eq!(made, dir.path().join(format!("state.db.retired-{stamp}.4-{holder}")));
        assert_eq!(mode(&made), 0o700);
        assert!(names_in(&made).is_empty());
        assert_eq!(std::fs::read(taken.join("marker")).unwrap(), b"mine");
        return;
    }
    panic!("the clock turned a second on every try");
}

#[test]
fn sixty_four_folders_in_one_second_is_the_end() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..10 {
        let stamp = utc_stamp();
        for n in 1..=64 {
            let name = match n {
                1 => format!("state.db.retired-{stamp}-7"),
                n => format!("state.db.retired-{stamp}.{n}-7"),
            };
            let _ = std::fs::create_dir(dir.path().join(name));
        }
        let got = new_capture_dir(dir.path(), 7);
        if utc_stamp() != stamp {
            continue;
        }
        let e = got.unwrap_err();
        assert_eq!((e.operation, e.errno), ("mkdir", Some(i64::from(libc::EEXIST))));
        return;
    }
    panic!("the clock turned a second on every try");
}

#[test]
fn a_missing_parent_fails_at_mkdir() {
    let dir = tempfile::tempdir().unwrap();
    let e = new_capture_dir(&dir.path().join("gone"), 1).unwrap_err();
    assert_eq!((e.operation, e.errno), ("mkdir", Some(i64::from(libc::ENOENT))));
    assert_eq!(e.file, None);
}

#[test]
fn a_read_through_a_descriptor_returns_every_byte_and_never_hangs() {
    let dir = tempfile::tempdir().unwrap();
    for len in [0usize, 1, 4096, 3 * 4096 + 7] {
        let path = dir.path().join(format!("f{len}"));
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        let got = within_deadline("a read through a descriptor", move || {
            let got = read_through(f.as_raw_fd()).map_err(|e| e.to_string());
            drop(f);
            got
        });
        assert_eq!(got.unwrap(), data, "{len} bytes");
    }
}

#[test]
fn a_capture_error_says_its_step_file_and_errno() {
    let e = CaptureError::io("fsync", Some("state.db-wal"), &io::Error::from_raw_os_error(libc::EIO));
    assert_eq!(e.file.as_deref(), Some("state.db-wal"));
    assert_eq!(
        e.to_failure(),
        turnsafe_policy::CaptureFailure {
            operation: "fsync".into(),
            errno: Some(i64::from(libc::EIO)),
        }
    );
    let text = e.to_string();
    assert!(
        text.starts_with("capture of the retired generation failed at fsync state.db-wal: "),
        "{text}"
    );
    assert_eq!(
        e.to_value(),
        json!({"error": text, "operation": "fsync", "errno": libc::EIO})
    );
}

/// A powerfs mount with `home/state.db` (WAL, live connection) on it.
struct Mounted {
    fs: PowerFs,
    _dir: tempfile::TempDir,
}

fn mount_with_db() -> (Mounted, PathBuf, Connection, Guard) {
    let dir = tempfile::tempdir().unwrap();
    let fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).expect("mount powerfs");
    let home = fs.path().join("home");
    std::fs::create_dir(&home).unwrap();
    sync_dir(fs.path()).unwrap();
    let (db, conn) = wal_db(&home);
    let guard = Guard::record(&db, &conn).unwrap();
    (Mounted { fs, _dir: dir }, db, conn, guard)
}

#[test]
fn a_capture_that_returned_survives_a_power_cut() {
    turnsafe_tests::require!(PowerFs::available());
    let (mut m, _db, conn, guard) = mount_with_db();
    let c = capture_in_time(&guard, &why()).unwrap();
    drop(conn);
    m.fs.cut(CutMode::DropPending).unwrap();
    m.fs.remount().unwrap();
    let folder = Path::new(&c.path);
    let manifest = std::fs::read(folder.join("manifest.json")).expect("the manifest survives");
    assert_eq!(sha(&manifest), c.manifest_sha256);
    let m: Value = serde_json::from_slice(&manifest).unwrap();
    for (f, r) in m["files"].as_array().unwrap().iter().zip(&c.files) {
        let data = std::fs::read(folder.join(&r.name)).unwrap();
        assert_eq!(
            (data.len() as u64, sha(&data)),
            (r.size, f["sha256"].as_str().unwrap().to_string())
        );
    }
    assert_eq!(c.files.len(), 3);
}

#[test]
fn a_failed_fsync_write_or_folder_fsync_leaves_no_receipt() {
    turnsafe_tests::require!(PowerFs::available());
    let cases = [
        (
            FaultOp::FileSync,
            PathMatch::suffix("/.state.db-wal.tmp"),
            "fsync",
            Some("state.db-wal"),
        ),
        (
            FaultOp::FileSync,
            PathMatch::suffix("/.manifest.json.tmp"),
            "fsync",
            Some("manifest.json"),
        ),
        (
            FaultOp::Write,
            PathMatch::suffix("/.state.db.tmp"),
            "write",
            Some("state.db"),
        ),
        (
            FaultOp::DirSync,
            PathMatch::contains("home/state.db.retired-"),
            "fsync_dir",
            None,
        ),
        (FaultOp::DirSync, PathMatch::exact("home"), "fsync_dir", None),
    ];
    for (op, path, operation, file) in cases {
        let (m, _db, conn, guard) = mount_with_db();
        let id = m.fs.inject(Fault::new(op, path.clone()));
        let e = capture_in_time(&guard, &why()).unwrap_err();
        assert!(m.fs.fault_fired(id) >= 1, "{path:?}");
        assert_eq!(
            (e.operation, e.file.as_deref(), e.errno),
            (operation, file, Some(i64::from(libc::EIO))),
            "{path:?}"
        );
        drop(conn);
    }
}
