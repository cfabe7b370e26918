//! Focused tests of the WAL-generation guard against a real SQLite
//! connection in WAL mode: what it records (identities, the descriptors
//! SQLite holds, the header's generation) and its verdict when the main
//! file, the WAL or the shm is deleted, renamed, replaced or rewritten
//! under the live connection.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use super::*;

const GENERATION: i32 = 0x5475_726e;

/// A WAL database whose header carries [`GENERATION`], with a live
/// connection holding the main file, the WAL (with frames) and the shm.
fn wal_db(dir: &Path) -> (PathBuf, Connection) {
    let db = dir.join("state.db");
    let conn = Connection::open(&db).unwrap();
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch(&format!(
        "PRAGMA application_id = {GENERATION};
         CREATE TABLE t(x);
         INSERT INTO t VALUES (1);"
    ))
    .unwrap();
    // The header reaches the main file only with a checkpoint.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    conn.execute("INSERT INTO t VALUES (2)", []).unwrap();
    (db, conn)
}

fn id_of(path: &Path) -> FileId {
    let m = std::fs::metadata(path).unwrap();
    FileId {
        dev: m.dev(),
        ino: m.ino(),
    }
}

fn mismatch(v: Verdict) -> (Evidence, String) {
    match v {
        Verdict::Mismatch { evidence, detail } => (evidence, detail),
        Verdict::Intact => panic!("expected a mismatch, the guard says intact"),
    }
}

fn assert_verdict(v: Verdict, evidence: Evidence, detail: &str) {
    let (e, d) = mismatch(v);
    assert_eq!(e, evidence, "{d}");
    assert!(d.contains(detail), "detail {d:?} lacks {detail:?}");
}

/// A new file (other bytes, another inode) renamed over `path`.
fn replace_by_rename(path: &Path) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, std::fs::read(path).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn the_paths_of_the_three_files() {
    let db = Path::new("/h/state.db");
    assert_eq!(path_of(db, Part::Main), Path::new("/h/state.db"));
    assert_eq!(path_of(db, Part::Wal), Path::new("/h/state.db-wal"));
    assert_eq!(path_of(db, Part::Shm), Path::new("/h/state.db-shm"));
}

#[test]
fn record_holds_each_file_by_identity_and_by_the_descriptor_sqlite_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let g = Guard::record(&db, &conn).unwrap();
    assert_eq!(g.db_path(), std::fs::canonicalize(&db).unwrap());
    assert_eq!(g.generation(), GENERATION);
    let mut fds = Vec::new();
    for part in Part::ALL {
        let path = path_of(&db, part);
        let held = g.held(part).unwrap_or_else(|| panic!("{part:?} not recorded"));
        assert_eq!(held.id, id_of(&path), "{part:?}");
        let fd = held.fd.unwrap_or_else(|| panic!("{part:?} has no descriptor"));
        assert_eq!(
            std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap(),
            path,
            "{part:?}"
        );
        assert_eq!(fd_stat(fd).unwrap(), (held.id, 1), "{part:?}");
        fds.push(fd);
    }
    fds.dedup();
    assert_eq!(fds.len(), 3);
}

#[test]
fn a_missing_database_cannot_be_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open_in_memory().unwrap();
    let e = Guard::record(&dir.path().join("state.db"), &conn).unwrap_err();
    assert_eq!(e.probe, "canonicalize");
    assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
}

#[test]
fn an_untouched_database_stays_intact_through_commits_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let mut g = Guard::record(&db, &conn).unwrap();
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    conn.execute("INSERT INTO t VALUES (3)", []).unwrap();
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
}

#[test]
fn a_deleted_main_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let mut g = Guard::record(&db, &conn).unwrap();
    std::fs::remove_file(&db).unwrap();
    assert_verdict(g.check(&conn).unwrap(), Evidence::DbReplaced, "gone from its path");
}

#[test]
fn a_renamed_main_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let mut g = Guard::record(&db, &conn).unwrap();
    std::fs::rename(&db, dir.path().join("moved.db")).unwrap();
    assert_verdict(g.check(&conn).unwrap(), Evidence::DbReplaced, "gone from its path");
}

#[test]
fn a_main_file_replaced_at_its_path_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let mut g = Guard::record(&db, &conn).unwrap();
    let held = g.held(Part::Main).unwrap().id;
    // The held file keeps a name elsewhere, so only the path tells.
    std::fs::hard_link(&db, dir.path().join("kept.db")).unwrap();
    replace_by_rename(&db);
    let detail = format!("state.db at the path is inode {} not {}", id_of(&db).ino, held.ino);
    assert_verdict(g.check(&conn).unwrap(), Evidence::DbReplaced, &detail);
}

#[test]
fn a_header_overwritten_in_place_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn) = wal_db(dir.path());
    let mut g = Guard::record(&db, &conn).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    rustix::io::pwrite(&f, &(GENERATION + 1).to_be_bytes(), 68).unwrap();
    assert_verdict(g.check(&conn).unwrap(), Evidence::DbReplaced, "generation changed");
    // The generation recorded at open is kept, not re-read.
    assert_eq!(g.generation(), GENERATION);
}

/// Past a coarse clock's tick and the shortened racy window below.
fn age() {
    std::thread::sleep(std::time::Duration::from_millis(120));
}

/// A WAL database whose files are already old, and its guard, which
/// trusts a ctime once it is 50 ms old.
fn aged_guard(dir: &Path) -> (PathBuf, Connection, Guard) {
    let (db, conn) = wal_db(dir);
    age();
    let g = Guard::record(&db, &conn)
        .unwrap()
        .with_racy(std::time::Duration::from_millis(50));
    (db, conn, g)
}

#[test]
fn the_header_is_read_again_only_when_the_main_files_ctime_moved() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, conn, mut g) = aged_guard(dir.path());
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    assert_eq!(g.header_reads(), 1);
    // Commits write only the WAL: the header is not read again.
    for k in 0..5 {
        conn.execute("INSERT INTO t VALUES (?1)", [k]).unwrap();
        assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    }
    assert_eq!(g.header_reads(), 1);
    // A checkpoint writes the main file: read while its ctime is young,
    // then quiet again.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    assert_eq!(g.header_reads(), 3);
    age();
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    assert_eq!(g.header_reads(), 4);
}

#[test]
fn a_header_overwritten_in_place_after_quiet_checks_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (db, conn, mut g) = aged_guard(dir.path());
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    assert_eq!(g.header_reads(), 1, "the header is quiet");
    // Same inode, same size: only the ctime tells.
    let f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    rustix::io::pwrite(&f, &(GENERATION + 1).to_be_bytes(), 68).unwrap();
    assert_verdict(g.check(&conn).unwrap(), Evidence::DbReplaced, "generation changed");
}

#[test]
fn a_header_overwritten_right_after_an_intact_check_is_replaced() {
    // The real window: a ctime read just now proves nothing, however
    // coarse the filesystem's clock, so the next check reads the header.
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = wal_db(dir.path());
        let mut g = Guard::record(&db, &conn).unwrap();
        assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
        let f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
        rustix::io::pwrite(&f, &(GENERATION + 1).to_be_bytes(), 68).unwrap();
        assert_verdict(g.check(&conn).unwrap(), Evidence::DbReplaced, "generation changed");
    }
}

#[test]
fn a_descriptor_that_no_longer_holds_the_file_is_seen() {
    for part in [Part::Main, Part::Wal, Part::Shm] {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = wal_db(dir.path());
        let mut g = Guard::record(&db, &conn).unwrap();
        let fd = g.held(part).unwrap().fd.unwrap();
        // The number now holds another file (a close and a reuse).
        let other = File::create(dir.path().join("other")).unwrap();
        // SAFETY: both descriptors are open; SQLite's number is made to
        // hold `other` for the rest of the test.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), fd) }, fd);
        let v = g.check(&conn).unwrap();
        match part {
            Part::Main => assert_verdict(v, Evidence::DbReplaced, &format!("descriptor {fd} no longer holds")),
            _ => assert_verdict(v, Evidence::DeletedWalGeneration, "was unlinked"),
        }
    }
}

#[test]
fn a_deleted_wal_or_shm_is_a_deleted_generation() {
    for part in [Part::Wal, Part::Shm] {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = wal_db(dir.path());
        let mut g = Guard::record(&db, &conn).unwrap();
        std::fs::remove_file(path_of(&db, part)).unwrap();
        let detail = format!("state.db{} is gone from its path", part.suffix());
        assert_verdict(g.check(&conn).unwrap(), Evidence::DeletedWalGeneration, &detail);
    }
}

#[test]
fn a_renamed_or_replaced_wal_or_shm_is_a_deleted_generation() {
    for part in [Part::Wal, Part::Shm] {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = wal_db(dir.path());
        let mut g = Guard::record(&db, &conn).unwrap();
        let path = path_of(&db, part);
        std::fs::rename(&path, dir.path().join("aside")).unwrap();
        assert_verdict(
            g.check(&conn).unwrap(),
            Evidence::DeletedWalGeneration,
            "gone from its path",
        );

        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = wal_db(dir.path());
        let mut g = Guard::record(&db, &conn).unwrap();
        let path = path_of(&db, part);
        let held = g.held(part).unwrap().id;
        std::fs::hard_link(&path, dir.path().join("kept")).unwrap();
        replace_by_rename(&path);
        let detail = format!(
            "state.db{} at the path is inode {} not {}",
            part.suffix(),
            id_of(&path).ino,
            held.ino
        );
        assert_verdict(g.check(&conn).unwrap(), Evidence::DeletedWalGeneration, &detail);
    }
}

#[test]
fn a_wal_that_appears_after_the_open_is_recorded_then_watched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    {
        let c = Connection::open(&db).unwrap();
        c.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(())).unwrap();
        c.execute_batch("CREATE TABLE t(x);").unwrap();
    } // The last close checkpoints and removes the WAL and shm.
    assert!(!path_of(&db, Part::Wal).exists());
    let conn = Connection::open(&db).unwrap();
    let mut g = Guard::record(&db, &conn).unwrap();
    assert!(g.held(Part::Main).is_some());
    assert_eq!((g.held(Part::Wal), g.held(Part::Shm)), (None, None));
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);

    conn.execute("INSERT INTO t VALUES (1)", []).unwrap();
    assert_eq!(g.check(&conn).unwrap(), Verdict::Intact);
    for part in [Part::Wal, Part::Shm] {
        let held = g
            .held(part)
            .unwrap_or_else(|| panic!("{part:?} recorded when it appeared"));
        assert_eq!(held.id, id_of(&path_of(&db, part)));
        assert!(held.fd.is_some());
    }
    std::fs::remove_file(path_of(&db, Part::Wal)).unwrap();
    assert_verdict(g.check(&conn).unwrap(), Evidence::DeletedWalGeneration, "-wal is gone");
}

#[test]
fn a_stale_descriptor_of_an_older_file_at_the_path_is_never_taken() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    std::fs::write(&db, b"an older file").unwrap();
    // Opened first, so its number is lower than SQLite's; once the file
    // is replaced its link reads `<path> (deleted)`.
    let stale = File::open(&db).unwrap();
    let fresh = dir.path().join("fresh.db");
    {
        let c = Connection::open(&fresh).unwrap();
        c.execute_batch("CREATE TABLE t(x);").unwrap();
    }
    std::fs::rename(&fresh, &db).unwrap();
    let conn = Connection::open(&db).unwrap();
    conn.query_row("SELECT count(*) FROM t", [], |_| Ok(())).unwrap();
    let g = Guard::record(&db, &conn).unwrap();
    let held = g.held(Part::Main).unwrap();
    assert_eq!(held.id, id_of(&db));
    let fd = held.fd.expect("SQLite's descriptor");
    assert_ne!(fd, stale.as_raw_fd());
    assert_eq!(fd_stat(fd).unwrap().0, held.id);
    assert_eq!(
        find_fd(&std::fs::canonicalize(&db).unwrap(), held.id).unwrap(),
        Some(fd)
    );
}
