//! `PgServer::base_backup` and `restore_base_backup` against a real
//! server: rows written after the backup are gone once the backup is
//! started in the server's place, on the same port. The cluster reads as
//! the same one (`system_identifier` is copied by the backup); the
//! timeline stays with crash recovery from the backup alone, and moves
//! when the backup is restored by archive recovery (`recovery.signal`).
//!
//! What a run printed (PostgreSQL 15.18):
//!
//! | moment | `system_identifier` | checkpoint timeline / LSN | WAL timeline / insert LSN |
//! |---|---|---|---|
//! | after more writes | 7714015280101753097 | 1 / 0/4000190 | 1 / 0/4000230 |
//! | backup restored, crash recovery | same | 1 / 0/3000028 | 1 / 0/30000A0 |
//! | backup restored, archive recovery | same | 2 / 0/4000028 | 2 / 0/40000A0 |
//!
//! After crash recovery nothing but the WAL position going back tells the
//! older copy from the server it replaced: same cluster, same timeline.
mod common;
use common::*;
use pg::Recovery;

/// `X/Y` as a number, to compare WAL positions.
fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').expect("an LSN");
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

fn tags(server: &pg::PgServer, db: &str) -> Vec<String> {
    server
        .admin(db)
        .query("SELECT tag FROM t ORDER BY tag", &[])
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn rows_after_the_backup_are_gone_and_the_identity_stays() {
    let started = std::time::Instant::now();
    let mut server = pg_or_skip!();
    let db = server.create_db("restored");
    server
        .admin(&db)
        .batch_execute("CREATE TABLE t (tag text PRIMARY KEY); INSERT INTO t VALUES ('a-before')")
        .unwrap();
    let original = server.identity();
    println!("original:                 {original:?}");

    // Two backups of the same moment: each is moved into place once.
    let crash_copy = server.base_backup("backup-1").expect("base backup");
    let archive_copy = server.base_backup("backup-2").expect("base backup");
    server
        .admin(&db)
        .batch_execute("INSERT INTO t VALUES ('b-after'); CHECKPOINT")
        .unwrap();
    let before = server.identity();
    println!("after more writes:        {before:?}");
    let port = server.port();

    server
        .restore_base_backup(&crash_copy, Recovery::Crash)
        .expect("start the backup in place");
    assert_eq!(server.port(), port);
    assert_eq!(
        tags(&server, &db),
        ["a-before"],
        "the row written after the backup is gone"
    );
    let crash = server.identity();
    println!("restored, crash recovery: {crash:?}");
    assert_eq!(crash.system_identifier, before.system_identifier, "the same cluster");
    assert_eq!(crash.checkpoint_timeline, before.checkpoint_timeline);
    assert_eq!(
        crash.wal_timeline, before.wal_timeline,
        "crash recovery keeps the timeline"
    );
    assert!(
        lsn(crash.wal_lsn.as_deref().unwrap()) < lsn(before.wal_lsn.as_deref().unwrap()),
        "the WAL position went back"
    );

    server
        .admin(&db)
        .batch_execute("INSERT INTO t VALUES ('c-after-restore')")
        .unwrap();
    server
        .restore_base_backup(&archive_copy, Recovery::Archive)
        .expect("start the backup in place");
    assert_eq!(tags(&server, &db), ["a-before"]);
    let archive = server.identity();
    println!("restored, archive recovery: {archive:?}");
    assert_eq!(archive.system_identifier, before.system_identifier, "the same cluster");
    assert!(!archive.in_recovery);
    assert_eq!(
        archive.wal_timeline,
        before.wal_timeline.map(|t| t + 1),
        "archive recovery ends on a new timeline"
    );
    println!("{:?}", started.elapsed());
}
