//! A folder entry that was never made durable by its folder's fsync is gone
//! after a cut, even when the file's own data was fsynced.

mod common;

use std::fs;

use powerfs::{CutMode, PowerFs};
use turnsafe_tests::require;

#[test]
fn synced_file_without_folder_sync_vanishes() {
    require!(PowerFs::available());
    let mut m = common::mount();
    // The planted bug: create, write, fsync the file, but not its folder.
    common::write_synced(&m.at("receipt"), b"kept?").unwrap();
    let report = m.cut(CutMode::DropPending).unwrap();
    assert_eq!(report.dir_changes_dropped, 1, "{report:?}");
    m.remount().unwrap();
    assert!(!m.at("receipt").exists(), "the file survived without a folder fsync");
}

#[test]
fn new_folder_needs_its_own_sync_and_its_parents() {
    require!(PowerFs::available());
    let mut m = common::mount();
    fs::create_dir(m.at("d")).unwrap();
    common::write_synced(&m.at("d/f"), b"data").unwrap();
    common::sync_dir(&m.at("d")).unwrap();
    // The parent's fsync is missing: the folder itself is not durable.
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert!(!m.at("d").exists());

    // With the parent synced but not the folder: the folder, empty.
    fs::create_dir(m.at("d")).unwrap();
    common::write_synced(&m.at("d/f"), b"data").unwrap();
    common::sync_dir(m.path()).unwrap();
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert!(m.at("d").is_dir());
    assert!(!m.at("d/f").exists());

    // Both synced: all there.
    common::write_synced(&m.at("d/f"), b"data").unwrap();
    common::sync_dir(&m.at("d")).unwrap();
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("d/f")).unwrap(), b"data");
}

#[test]
fn unsynced_rename_and_unlink_are_undone() {
    require!(PowerFs::available());
    let mut m = common::mount();
    common::write_synced(&m.at("old"), b"one").unwrap();
    common::write_synced(&m.at("gone"), b"two").unwrap();
    common::sync_dir(m.path()).unwrap();
    fs::rename(m.at("old"), m.at("new")).unwrap();
    fs::remove_file(m.at("gone")).unwrap();
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("old")).unwrap(), b"one");
    assert!(!m.at("new").exists());
    assert_eq!(fs::read(m.at("gone")).unwrap(), b"two");
}

#[test]
fn atomic_replace_needs_the_folder_sync() {
    require!(PowerFs::available());
    let mut m = common::mount();
    common::write_synced(&m.at("cfg"), b"v1").unwrap();
    common::sync_dir(m.path()).unwrap();
    // write tmp + fsync + rename over, without the folder fsync: v1 stays
    // (no auto_da_alloc leniency).
    common::write_synced(&m.at("cfg.tmp"), b"v2").unwrap();
    fs::rename(m.at("cfg.tmp"), m.at("cfg")).unwrap();
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("cfg")).unwrap(), b"v1");
    assert!(!m.at("cfg.tmp").exists());
    // With it: v2.
    common::write_synced(&m.at("cfg.tmp"), b"v2").unwrap();
    fs::rename(m.at("cfg.tmp"), m.at("cfg")).unwrap();
    common::sync_dir(m.path()).unwrap();
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("cfg")).unwrap(), b"v2");
}

#[test]
fn a_rename_across_folders_never_loses_its_file() {
    require!(PowerFs::available());
    let mut m = common::mount();
    for seed in 0..40u64 {
        for dir in ["from", "to"] {
            fs::create_dir_all(m.at(dir)).unwrap();
        }
        common::write_synced(&m.at("from/f"), b"f").unwrap();
        for dir in ["from", "to", ""] {
            common::sync_dir(&m.at(dir)).unwrap();
        }
        // Unsynced on both sides: the file may end at either name (or
        // both), never at neither.
        fs::rename(m.at("from/f"), m.at("to/f")).unwrap();
        let mode = if seed % 2 == 0 {
            CutMode::TornPrefix { seed }
        } else {
            CutMode::Reorder { seed }
        };
        m.cut(mode).unwrap();
        m.remount().unwrap();
        assert!(
            m.at("from/f").exists() || m.at("to/f").exists(),
            "{mode:?}: the renamed file is gone"
        );
        for dir in ["from", "to"] {
            fs::remove_dir_all(m.at(dir)).unwrap();
        }
        common::sync_dir(m.path()).unwrap();
    }
}
