//! SQLITE_FULL for real: from `PRAGMA max_page_count`, and from a small
//! tmpfs that runs out of space (where mounting works). The divert on a
//! full filesystem fails too, and says so.
mod common;
use common::privileged::{Tmpfs, fill};
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn max_page_count_gives_disk_full_and_a_divert() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);
    let c = store.connection().unwrap();
    let pages: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    c.pragma_update(None, "max_page_count", pages).unwrap();
    let big: Vec<_> = (0..8)
        .map(|i| turnsafe_host::message::Message::new("user", &"z".repeat(5000)).with_uid(&format!("big-{i}")))
        .collect();
    let out = store.append_batch(&sid("s1"), &big);
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::DiskFull));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!(out.diverted, 8);
    assert_eq!(out.copy.as_ref().unwrap().code, "disk_full.diverted");
    assert_eq!(home.rows("s1").len(), 1, "FULL rolled the batch back");
    assert_eq!(store.counters().connections_opened, 1);
}

#[test]
fn a_full_tmpfs_gives_disk_full_and_a_failed_divert() {
    let outer = Home::new();
    let mnt = skip_unless!(Tmpfs::new(&outer.path().join("mnt"), "2m"));
    let home = mnt.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let mut store = turnsafe_host::store::SessionStore::new(&home, Default::default());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    fill(mnt.path());
    let big: Vec<_> = (0..40)
        .map(|i| turnsafe_host::message::Message::new("user", &"q".repeat(8000)).with_uid(&format!("big-{i}")))
        .collect();
    let out = store.append_batch(&sid("s1"), &big);
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::DiskFull), "{:?}", out.to_value());
    // The divert has no space either: it fails, and the copy says so.
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 0, 40));
    let e = out.divert_error.as_ref().expect("divert failed");
    assert_eq!(e.errno, Some(libc::ENOSPC as i64), "{e:?}");
    let copy = out.report.copy.unwrap();
    assert_eq!(copy.code, "disk_full.divert_failed");
    assert!(!copy.body.to_lowercase().contains("a copy was kept"));
    drop(store);
}
