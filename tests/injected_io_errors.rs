//! I/O errors injected by the fault VFS at write, fsync, shm and open,
//! under a live WAL handle. Each must divert with a receipt, say so, and
//! never reopen; `locked`, a damaged index and `turn_lease` are the negative
//! controls that must not divert.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::faultvfs::{self, Fault, FileKind, Op};
use turnsafe_host::store::{SessionStore, StoreOptions};
use turnsafe_policy::{ActionKind, Cause};

fn fault_store(home: &Home) -> SessionStore {
    faultvfs::register().unwrap();
    home.store_with(StoreOptions {
        vfs: Some(faultvfs::VFS_NAME.into()),
        ..StoreOptions::default()
    })
}

struct Case {
    name: &'static str,
    fault: fn(&str) -> Fault,
    cause: Cause,
    extended_code: i64,
}

const CASES: &[Case] = &[
    Case {
        name: "wal write",
        fault: |p| Fault::new(p, Op::Write, FileKind::Wal, 1),
        cause: Cause::Disk,
        extended_code: 778,
    },
    Case {
        name: "wal fsync",
        fault: |p| Fault::new(p, Op::Sync, FileKind::Wal, 1).persistent(),
        cause: Cause::Disk,
        extended_code: 1034,
    },
    Case {
        name: "shm",
        fault: |p| Fault::new(p, Op::Shm, FileKind::Main, 1).persistent(),
        cause: Cause::Disk,
        extended_code: 5386,
    },
    Case {
        name: "wal write ENOSPC",
        fault: |p| Fault::new(p, Op::Write, FileKind::Wal, 1).errno(libc::ENOSPC),
        cause: Cause::DiskFull,
        extended_code: 778,
    },
    Case {
        name: "wal write FULL",
        fault: |p| Fault::new(p, Op::Write, FileKind::Wal, 1).code(rusqlite::ffi::SQLITE_FULL),
        cause: Cause::DiskFull,
        extended_code: 13,
    },
];

#[test]
fn every_injected_disk_class_fault_diverts_with_a_receipt() {
    for case in CASES {
        let home = Home::new();
        let tag = home.path().to_string_lossy().into_owned();
        let mut store = fault_store(&home);
        let id = store.handle_identity();
        assert!(
            store.append_batch(&sid("s1"), &batch("before", 2)).persisted,
            "{}",
            case.name
        );
        let watch = watch_opens(&home);
        let guard = faultvfs::arm((case.fault)(&tag)).unwrap();
        let out = store.append_batch(&sid("s1"), &batch("hit", 3));
        let during = watch.counts();
        // Seen from below, not from the store's counters: no open or close
        // of state.db or its WAL while the flush met its fault.
        assert_eq!(
            (
                during.main.opens,
                during.main.closes,
                during.wal.opens,
                during.wal.closes
            ),
            (0, 0, 0, 0),
            "{}: the flush reopened: {during:?}",
            case.name
        );
        assert!(guard.fired() >= 1, "{}: the fault never fired", case.name);
        drop(guard);
        assert!(!out.persisted, "{}", case.name);
        assert_eq!(out.cause, Some(case.cause), "{}", case.name);
        assert_eq!(out.action, Some(ActionKind::Divert), "{}", case.name);
        assert_eq!(
            (out.committed, out.diverted, out.handed_back),
            (0, 3, 0),
            "{}",
            case.name
        );
        let lines = receipt_lines(out.receipt.as_ref().expect("receipt"));
        assert_eq!(
            lines.iter().map(|l| l["uid"].as_str().unwrap()).collect::<Vec<_>>(),
            ["hit-0", "hit-1", "hit-2"]
        );
        let copy = out.copy.as_ref().unwrap();
        assert_eq!(copy.code, format!("{}.diverted", case.cause.label()));
        assert!(copy.body.contains(&out.receipt.as_ref().unwrap().path));
        let c = store.counters();
        assert_eq!(
            (c.connections_opened, c.open_attempts, c.append_attempts),
            (1, 1, 2),
            "{}: one attempt, no reopen",
            case.name
        );
        assert_eq!(store.handle_identity(), id);
        // Disk-class causes are not sticky: with the fault gone the handle writes again.
        assert!(
            store.append_batch(&sid("s1"), &batch("after", 1)).persisted,
            "{}",
            case.name
        );
        let uids: Vec<String> = home.rows("s1").into_iter().map(|r| r.0).collect();
        assert_eq!(uids, ["before-0", "before-1", "after-0"], "{}", case.name);
        println!(
            "{:<18} -> extended code expected {}, cause {}",
            case.name,
            case.extended_code,
            case.cause.label()
        );
    }
}

#[test]
fn the_policy_sees_the_codes_sqlite_really_gave() {
    // Drive one injected write fault through SQLite directly and record the code.
    let home = Home::new();
    let tag = home.path().to_string_lossy().into_owned();
    drop(fault_store(&home));
    faultvfs::register().unwrap();
    let c =
        rusqlite::Connection::open_with_flags_and_vfs(home.db(), rusqlite::OpenFlags::default(), faultvfs::VFS_NAME)
            .unwrap();
    for case in CASES {
        let guard = faultvfs::arm((case.fault)(&tag)).unwrap();
        let err = c
            .execute("INSERT INTO state_meta(key, value) VALUES (?1, 'x')", [case.name])
            .unwrap_err();
        drop(guard);
        let (_, ext, _) = turnsafe_host::observe::sqlite_parts(&err);
        assert_eq!(ext, Some(case.extended_code), "{}: {err}", case.name);
        if !c.is_autocommit() {
            c.execute_batch("ROLLBACK").ok();
        }
    }
}

#[test]
fn an_injected_open_failure_diverts_as_disk() {
    let home = Home::new();
    let tag = home.path().to_string_lossy().into_owned();
    faultvfs::register().unwrap();
    let guard = faultvfs::arm(
        Fault::new(&tag, Op::Open, FileKind::Main, 1)
            .persistent()
            .errno(libc::EMFILE),
    )
    .unwrap();
    let mut store = fault_store(&home);
    let out = store.append_batch(&sid("s1"), &batch("x", 2));
    // The first batch observes the failed open of the handle's creation;
    // it does not open the file a second time.
    assert_eq!(guard.fired(), 1, "one open, at creation");
    drop(guard);
    assert_eq!(out.cause, Some(Cause::Disk));
    assert_eq!(out.diverted, 2);
    let copy = out.report.copy.unwrap();
    assert_eq!(copy.code, "disk.diverted");
    assert!(
        copy.details.iter().any(|(k, v)| k == "errno" && v.contains("EMFILE")),
        "{:?}",
        copy.details
    );
    assert_eq!(store.counters().connections_opened, 0);
    // The open is retried at the next batch, and now succeeds.
    assert!(store.append_batch(&sid("s1"), &batch("y", 1)).persisted);
    assert_eq!(store.counters().connections_opened, 1);
}

#[test]
fn negative_controls_do_not_divert() {
    // locked, briefly (past the stall window, under which a lock is waited
    // out below the policy): retried and persisted.
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);
    let stall = StoreOptions::default().lock_stall;
    let t = hold_write_lock(&home, stall + std::time::Duration::from_millis(300));
    let out = store.append_batch(&sid("s1"), &batch("b", 1));
    t.join().unwrap();
    assert_eq!((out.persisted, out.cause), (true, Some(Cause::Locked)));
    assert!(!home.divert_file("s1").exists());

    // A damaged full-text index: not on the commit path, so persisted as is.
    home.other()
        .execute("UPDATE messages_fts_data SET block = X'FFFFFFFF' WHERE id = 10", [])
        .unwrap();
    let out = store.append_batch(&sid("s1"), &batch("c", 1));
    assert_eq!((out.persisted, out.cause, out.attempts), (true, None, 1));
    assert!(!home.divert_file("s1").exists());

    // turn_lease: fenced, handed back, not diverted.
    let mut other = home.store_with(StoreOptions {
        holder: "other".into(),
        ..StoreOptions::default()
    });
    let out = other.append_batch(&sid("s1"), &batch("d", 2));
    assert_eq!(
        (out.persisted, out.cause, out.handed_back),
        (false, Some(Cause::TurnLease), 2)
    );
    assert!(!home.divert_file("s1").exists());
}

#[test]
fn a_disarmed_fault_leaves_no_errno_for_a_later_real_failure() {
    // The fault VFS hands SQLite the injected errno. Once the fault is
    // disarmed, a real failure on the same thread and connection must
    // report its own errno, not the injected one.
    let home = Home::new();
    faultvfs::register().unwrap();
    let conn = rusqlite::Connection::open_with_flags_and_vfs(
        home.db(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_CREATE,
        faultvfs::VFS_NAME,
    )
    .unwrap();
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).unwrap();
    conn.execute_batch("CREATE TABLE t(x)").unwrap();
    let tag = home.path().to_string_lossy().into_owned();
    let fault = faultvfs::arm(Fault::new(&tag, Op::Write, FileKind::Wal, 1).errno(libc::ENOSPC)).unwrap();
    let injected = conn.execute("INSERT INTO t VALUES (1)", []).unwrap_err();
    assert_eq!(injected.sqlite_error_code(), Some(rusqlite::ErrorCode::SystemIoFailure));
    assert_eq!(fault.fired(), 1);
    assert_eq!(
        turnsafe_host::observe::system_errno(&conn),
        Some(i64::from(libc::ENOSPC))
    );
    drop(fault);

    // A real CANTOPEN, through the same VFS: a file in a folder that does not exist.
    let missing = home.path().join("no-such-folder").join("other.db");
    let real = conn
        .execute("ATTACH DATABASE ?1 AS other", [missing.to_str().unwrap()])
        .unwrap_err();
    assert_eq!(
        real.sqlite_error_code(),
        Some(rusqlite::ErrorCode::CannotOpen),
        "{real}"
    );
    assert_eq!(
        turnsafe_host::observe::system_errno(&conn),
        Some(i64::from(libc::ENOENT)),
        "the errno of the real failure, not the disarmed fault's"
    );
}
