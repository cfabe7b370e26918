//! The sync-point counter: a flow is run once to count its syncs, then
//! once per sync point with the power cut right there.

mod common;

use std::fs;
use std::path::Path;

use powerfs::{CutMode, PowerFs, SyncKind};
use turnsafe_tests::require;

/// A flow that publishes a file correctly: write, fsync, rename into
/// place, fsync the folder. Returns whether it reported success.
fn publish(root: &Path, body: &[u8]) -> bool {
    common::write_synced(&root.join("out.tmp"), body).is_ok()
        && fs::rename(root.join("out.tmp"), root.join("out")).is_ok()
        && common::sync_dir(root).is_ok()
}

#[test]
fn every_sync_point_is_counted_logged_and_can_be_cut_at() {
    require!(PowerFs::available());
    let mut m = common::mount();
    assert!(publish(m.path(), b"v1"));
    let points = m.sync_points();
    assert_eq!(m.sync_count(), 2);
    assert_eq!(points[0].kind, SyncKind::Fsync);
    assert_eq!(points[0].path, Path::new("out.tmp"));
    assert_eq!(points[1].kind, SyncKind::DirSync);
    assert_eq!(points[1].path, Path::new(""));
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert_eq!(m.sync_count(), 0, "a remount starts the count again");

    for mode in [CutMode::DropPending, CutMode::KeepPending] {
        for n in 1..=points.len() as u64 {
            m.cut_at_sync(n);
            assert!(publish(m.path(), b"v2"), "the flow runs on, unknowing");
            let frozen = m.frozen_at().expect("the sync point was reached");
            eprintln!("{mode:?}: cut at {frozen}");
            let report = m.cut(mode).unwrap();
            assert_eq!(report.frozen_at.as_ref(), Some(&frozen));
            m.remount().unwrap();
            let out = fs::read(m.at("out")).unwrap();
            if mode == CutMode::DropPending {
                // The folder sync that would publish v2 froze or came later.
                assert_eq!(out, b"v1", "{mode:?}: cut at {frozen}");
                assert!(!m.at("out.tmp").exists(), "{mode:?}: cut at {frozen}");
            } else {
                // What was pending when the power failed may have landed:
                // the old or the new version, never a mix, never nothing.
                assert!(out == b"v1" || out == b"v2", "{mode:?}: cut at {frozen}: {out:?}");
            }
        }
    }
    // No cut: the new version.
    assert!(publish(m.path(), b"v2"));
    m.cut(CutMode::DropPending).unwrap();
    m.remount().unwrap();
    assert_eq!(fs::read(m.at("out")).unwrap(), b"v2");
}

#[test]
fn a_frozen_fs_serves_requests_but_makes_nothing_durable() {
    require!(PowerFs::available());
    let mut m = common::mount();
    m.cut_at_sync(1);
    common::write_synced(&m.at("a"), b"x").unwrap();
    common::sync_dir(m.path()).unwrap();
    common::write_synced(&m.at("b"), b"y").unwrap();
    common::sync_dir(m.path()).unwrap();
    assert_eq!(fs::read(m.at("b")).unwrap(), b"y");
    assert_eq!(m.frozen_at().unwrap().n, 1);
    // Even keeping everything pending, only what was pending when the
    // power failed may survive; the later syncs count for nothing.
    let report = m.cut(CutMode::DropPending).unwrap();
    assert_eq!(report.syncs, 4);
    m.remount().unwrap();
    assert!(!m.at("a").exists() && !m.at("b").exists());
}
