//! The main file renamed, replaced by another file, or overwritten in
//! place (`cp`, same inode, another generation): `replaced`, diverted,
//! sticky, captured.
#[path = "../../tests/common/mod.rs"]
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause};

fn expect_replaced(out: &turnsafe_host::outcome::FlushOutcome) {
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Replaced), "{}", out.to_value());
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert!(out.receipt.is_some());
    assert!(matches!(out.capture, Some(Ok(_))), "{:?}", out.capture);
}

#[test]
fn a_renamed_db_is_replaced() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    std::fs::rename(home.db(), home.path().join("moved.db")).unwrap();
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    expect_replaced(&out);
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    assert!(!home.db().exists(), "nothing was created at the path");
}

#[test]
fn a_db_replaced_by_another_file_is_replaced() {
    let home = Home::new();
    let other_home = Home::new();
    drop(other_home.store());
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    std::fs::rename(home.db(), home.path().join("old.db")).unwrap();
    std::fs::copy(other_home.db(), home.db()).unwrap();
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    expect_replaced(&out);
}

#[test]
fn cp_over_the_db_keeps_the_inode_and_is_still_caught() {
    let home = Home::new();
    let other_home = Home::new();
    drop(other_home.store());
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let ino = |p: &std::path::Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = ino(&home.db());
    let status = std::process::Command::new("cp")
        .arg(other_home.db())
        .arg(home.db())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(ino(&home.db()), before, "cp wrote in place");
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    expect_replaced(&out);
}
