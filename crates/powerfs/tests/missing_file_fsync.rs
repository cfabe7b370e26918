//! A write that was never fsynced is gone after a cut; a synced one stays.

mod common;

use std::fs;

use powerfs::{CutMode, PowerFs};
use turnsafe_tests::require;

#[test]
fn unsynced_write_is_lost_at_the_cut() {
    require!(PowerFs::available());
    let mut m = common::mount();
    // The file and its folder entry are made durable first.
    common::write_synced(&m.at("a"), b"durable").unwrap();
    common::sync_dir(m.path()).unwrap();
    // The planted bug: a write with no fsync after it.
    fs::OpenOptions::new()
        .append(true)
        .open(m.at("a"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b" and more"))
        .unwrap();
    assert_eq!(
        fs::read(m.at("a")).unwrap(),
        b"durable and more",
        "the live view shows it"
    );
    let report = m.cut(CutMode::DropPending).unwrap();
    assert_eq!(report.file_ops_dropped, 1, "{report:?}");
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("a")).unwrap(), b"durable");
}

#[test]
fn unsynced_truncate_is_lost_at_the_cut() {
    require!(PowerFs::available());
    let mut m = common::mount();
    common::write_synced(&m.at("t"), &[7u8; 3000]).unwrap();
    common::sync_dir(m.path()).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(m.at("t"))
        .unwrap()
        .set_len(10)
        .unwrap();
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("t")).unwrap(), vec![7u8; 3000]);
}

#[test]
fn keep_pending_keeps_it() {
    require!(PowerFs::available());
    let mut m = common::mount();
    common::write_synced(&m.at("a"), b"one").unwrap();
    common::sync_dir(m.path()).unwrap();
    fs::write(m.at("a"), b"two, longer").unwrap();
    m.cut(CutMode::KeepPending).unwrap();
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("a")).unwrap(), b"two, longer");
}
