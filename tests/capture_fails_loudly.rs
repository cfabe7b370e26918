//! When the capture of a retired generation cannot be written (here the
//! home folder is immutable), the outcome says the capture failed; the
//! batch is still diverted and the handle still refuses the database.
#[macro_use]
mod common;
use common::privileged::Immutable;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::Cause;

#[test]
fn a_failed_capture_is_reported_not_hidden() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    std::fs::create_dir(home.path().join("sessions")).unwrap();
    for s in ["state.db-wal", "state.db-shm"] {
        std::fs::remove_file(home.path().join(s)).unwrap();
    }
    let _frozen = skip_unless!(Immutable::new(home.path()));
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    assert_eq!(out.cause, Some(Cause::DeletedWal));
    match &out.capture {
        Some(Err(e)) => {
            assert!(
                e.to_string()
                    .contains("capture of the retired generation failed at mkdir"),
                "{e}"
            );
            assert_eq!((e.operation, e.errno), ("mkdir", Some(i64::from(libc::EPERM))));
        }
        other => panic!("the capture cannot have succeeded: {other:?}"),
    }
    assert_eq!(
        out.to_value()["capture"]["error"]
            .as_str()
            .map(|e| e.contains("failed")),
        Some(true)
    );
    assert_eq!(out.diverted, 2, "the divert folder was writable");
    // The copy tells the failed capture, and claims none.
    let copy = out.to_value()["copy"].to_string();
    assert!(!copy.contains("was captured"), "{copy}");
    assert!(
        copy.contains("Capturing the retired database generation failed (mkdir"),
        "{copy}"
    );
    assert_eq!(store.sticky(), Some(Cause::DeletedWal));
    drop(store);
}

/// The retired frames live only in the handle's descriptors: before the
/// close lets them go, the handle tries its capture once more.
#[test]
fn a_failed_capture_is_tried_again_before_the_close() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 3)).persisted);
    std::fs::create_dir(home.path().join("sessions")).unwrap();
    for s in ["state.db-wal", "state.db-shm"] {
        std::fs::remove_file(home.path().join(s)).unwrap();
    }
    let frozen = skip_unless!(Immutable::new(home.path()));
    let out = store.append_batch(&sid("s1"), &batch("b", 1));
    assert!(matches!(out.capture, Some(Err(_))), "{:?}", out.capture);
    // The home is writable again (an operator freed space, say).
    drop(frozen);
    let capture = store
        .close()
        .expect("the close tried the capture again")
        .expect("and it succeeded");
    let dir = std::path::PathBuf::from(&capture.path);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["cause"], "deleted_wal", "{manifest}");
    assert_eq!(manifest["missing_rows"], serde_json::json!({"s1": 3}), "{manifest}");
}
