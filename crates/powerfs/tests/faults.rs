//! Every fault kind is seen by a real system call returning its errno,
//! and a failed sync never makes the pending data durable.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;

use powerfs::{CutMode, Fault, FaultOp, PathMatch, PowerFs};
use turnsafe_tests::require;

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().expect("an OS error")
}

#[test]
fn fsync_fails_with_eio_and_the_data_never_becomes_durable() {
    require!(PowerFs::available());
    let mut m = common::mount();
    common::write_synced(&m.at("log"), b"old").unwrap();
    common::sync_dir(m.path()).unwrap();
    let id = m.inject(Fault::new(FaultOp::Fsync, PathMatch::suffix("log")).nth(1));
    let mut f = OpenOptions::new().append(true).open(m.at("log")).unwrap();
    f.write_all(b" lost").unwrap();
    assert_eq!(errno(f.sync_all().unwrap_err()), libc::EIO);
    assert_eq!(m.fault_fired(id), 1);
    // The live view still shows the data; a later fsync succeeds but
    // does not bring it back (the pages were marked clean).
    assert_eq!(fs::read(m.at("log")).unwrap(), b"old lost");
    f.write_all(b" kept").unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.cut(CutMode::KeepPending).unwrap();
    m.remount().unwrap();
    let got = fs::read(m.at("log")).unwrap();
    assert_eq!(
        got, b"old\0\0\0\0\0 kept",
        "the failed sync's bytes must not be durable"
    );
}

#[test]
fn fdatasync_fault_matches_fdatasync_only() {
    require!(PowerFs::available());
    let m = common::mount();
    let f = File::create(m.at("wal")).unwrap();
    m.inject(Fault::new(FaultOp::Fdatasync, PathMatch::Any).errno(libc::EIO));
    f.sync_all().unwrap();
    assert_eq!(errno(f.sync_data().unwrap_err()), libc::EIO);
}

#[test]
fn folder_fsync_fails_and_its_entries_stay_pending_for_good() {
    require!(PowerFs::available());
    let mut m = common::mount();
    m.inject(Fault::new(FaultOp::DirSync, PathMatch::exact("")).nth(1));
    common::write_synced(&m.at("receipt"), b"r").unwrap();
    assert_eq!(errno(common::sync_dir(m.path()).unwrap_err()), libc::EIO);
    // The second folder sync succeeds, but the failed one's entry is lost.
    common::sync_dir(m.path()).unwrap();
    m.cut(CutMode::KeepPending).unwrap();
    m.remount().unwrap();
    assert!(!m.at("receipt").exists());
}

#[test]
fn write_fails_with_enospc_and_with_eio() {
    require!(PowerFs::available());
    let m = common::mount();
    let mut f = File::create(m.at("data")).unwrap();
    m.inject(
        Fault::new(FaultOp::Write, PathMatch::suffix("data"))
            .nth(2)
            .errno(libc::ENOSPC),
    );
    m.inject(Fault::new(FaultOp::Write, PathMatch::contains("ata")).nth(3));
    f.write_all(b"first").unwrap();
    // write(2) reaches the FS before it returns (no writeback cache), so
    // the errno comes back from this very call.
    assert_eq!(errno(f.write_all(b"second").unwrap_err()), libc::ENOSPC);
    assert_eq!(errno(f.write_all(b"third").unwrap_err()), libc::EIO);
    f.write_all(b" fourth").unwrap();
    assert_eq!(fs::read(m.at("data")).unwrap(), b"first fourth");
}

#[test]
fn ftruncate_fails() {
    require!(PowerFs::available());
    let m = common::mount();
    fs::write(m.at("db"), [1u8; 100]).unwrap();
    let f = OpenOptions::new().write(true).open(m.at("db")).unwrap();
    let id = m.inject(
        Fault::new(FaultOp::Truncate, PathMatch::suffix("db"))
            .from_nth(1)
            .errno(libc::EIO),
    );
    assert_eq!(errno(f.set_len(10).unwrap_err()), libc::EIO);
    assert_eq!(fs::metadata(m.at("db")).unwrap().len(), 100);
    m.clear_faults();
    f.set_len(10).unwrap();
    assert_eq!(m.fault_fired(id), 0, "cleared faults report nothing");
}
