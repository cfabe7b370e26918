//! The one step that keeps a close from checkpointing a retired generation
//! over the file now at the path (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`)
//! cannot be skipped quietly: when it fails, the handle never closes its
//! connection, and the main file is not written.
//!
//! Nothing real makes that call fail, so the test-only failpoint
//! `store.no_ckpt_on_close` fails it.
mod common;
use common::*;
use turnsafe_host::backend::Backend;

/// The descriptors this process holds on files that were deleted.
fn held_deleted(name: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t.ends_with(" (deleted)") && t.contains(name)
        })
        .count()
}

#[test]
fn a_close_that_cannot_forbid_its_checkpoint_never_closes() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("only", 4)).persisted);
    let before = std::fs::read(home.db()).unwrap();
    for s in ["state.db-wal", "state.db-shm"] {
        std::fs::remove_file(home.path().join(s)).unwrap();
    }
    let wal_name = format!("{}-wal", home.db().display());
    assert_eq!(held_deleted(&wal_name), 1, "the live connection holds the retired WAL");
    let _fault = turnsafe_host::failpoint::fail_on(&["store.no_ckpt_on_close"], libc::EIO);
    let capture = store.close().expect("close captured").expect("capture succeeded");
    assert!(std::path::Path::new(&capture.path).is_dir());
    // No checkpoint wrote the retired frames into the file at the path...
    assert_eq!(
        std::fs::read(home.db()).unwrap(),
        before,
        "state.db was written at close"
    );
    // ...because the connection was never closed: it still holds the WAL.
    assert_eq!(held_deleted(&wal_name), 1, "the connection was closed");
}

#[test]
fn with_the_step_done_the_close_closes() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("only", 2)).persisted);
    let before = std::fs::read(home.db()).unwrap();
    for s in ["state.db-wal", "state.db-shm"] {
        std::fs::remove_file(home.path().join(s)).unwrap();
    }
    let wal_name = format!("{}-wal", home.db().display());
    store.close().expect("close captured").expect("capture succeeded");
    assert_eq!(std::fs::read(home.db()).unwrap(), before);
    assert_eq!(held_deleted(&wal_name), 0, "a normal close lets the descriptors go");
}
