//! Recovery from a live-copied database, and the publish refusal: nothing
//! is installed at a state.db path while any process holds the old file.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::recover::{self, RecoverError};

#[test]
fn recover_from_a_live_db_then_install_only_once_nobody_holds_it() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 3)).persisted);
    assert!(store.append_batch(&sid("s2"), &batch("b", 2)).persisted);

    // Copy first, never open in place: the live WAL comes along.
    let work = tempfile::tempdir().unwrap();
    let copied = recover::copy_source(&home.db(), work.path()).unwrap();
    assert!(copied.iter().any(|c| c["file"] == "state.db-wal"), "{copied:?}");
    let readable = recover::inspect(&work.path().join("state.db")).unwrap();
    assert_eq!(readable["messages"], 5);
    assert_eq!(readable["quick_check"][0], "ok");

    let out_dir = tempfile::tempdir().unwrap();
    let output = out_dir.path().join("recovered.db");
    let result = recover::rebuild(&work.path().join("state.db"), &output).unwrap();
    assert_eq!(
        (result["sessions"].as_u64(), result["messages"].as_u64()),
        (Some(2), Some(5))
    );

    // This process holds state.db: installing is refused, naming the pid.
    let err = recover::install(&output, home.path()).unwrap_err();
    match &err {
        RecoverError::Refused(why) => assert!(why.contains(&std::process::id().to_string()), "{why}"),
        other => panic!("expected a refusal, got {other}"),
    }
    assert!(output.exists(), "nothing was moved");

    drop(store);
    let installed = recover::install(&output, home.path()).unwrap();
    let aside = &installed.set_aside;
    assert!(
        !aside.is_empty() && std::path::Path::new(&aside[0]).exists(),
        "old file set aside, not deleted"
    );
    // The old state.db holds nothing the recovered one lacks.
    assert_eq!(installed.carried_over, 0);
    assert_eq!(home.rows("s1").len(), 3);
    assert_eq!(home.rows("s2").len(), 2);
    // The recovered database has its search index.
    let n: i64 = home
        .other()
        .query_row(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'lorem'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 5);
}

#[test]
fn a_missing_source_and_an_existing_output_are_refused() {
    let home = Home::new();
    let work = tempfile::tempdir().unwrap();
    assert!(matches!(
        recover::copy_source(&home.db(), work.path()),
        Err(RecoverError::NoSource(_))
    ));
    drop(home.store());
    recover::copy_source(&home.db(), work.path()).unwrap();
    let exists = work.path().join("exists.db");
    std::fs::write(&exists, b"x").unwrap();
    assert!(matches!(
        recover::rebuild(&work.path().join("state.db"), &exists),
        Err(RecoverError::Refused(_))
    ));
}

#[test]
fn install_carries_over_what_the_rebuilt_database_lacks_in_seq_order() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 3)).persisted);
    // An older copy of the database is what gets rebuilt...
    let work = tempfile::tempdir().unwrap();
    recover::copy_source(&home.db(), work.path()).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let output = out_dir.path().join("recovered.db");
    recover::rebuild(&work.path().join("state.db"), &output).unwrap();
    // ...while the current one went on, in s1 and in a new session.
    assert!(store.append_batch(&sid("s1"), &batch("b", 2)).persisted);
    assert!(store.append_batch(&sid("s2"), &batch("c", 1)).persisted);
    drop(store);
    // The same uid with other content: the rebuilt row stays.
    let original = home.rows("s1")[1].2.clone();
    home.other()
        .execute(
            "UPDATE messages SET content = 'edited later', item = json_set(item, '$.content', 'edited later') \
             WHERE uid = 'a-1'",
            [],
        )
        .unwrap();

    let installed = recover::install(&output, home.path()).unwrap();
    assert_eq!(installed.carried_over, 3);
    assert_eq!(
        installed.carried_over_by_session.into_iter().collect::<Vec<_>>(),
        [("s1".to_string(), 2), ("s2".to_string(), 1)]
    );
    assert_eq!(installed.carry_conflicts, 1);
    assert_eq!(installed.carry_unreadable, 0);
    let s1: Vec<(String, i64)> = home.rows("s1").into_iter().map(|(u, s, _)| (u, s)).collect();
    assert_eq!(
        s1,
        [("a-0", 1), ("a-1", 2), ("a-2", 3), ("b-0", 4), ("b-1", 5)].map(|(u, s)| (u.to_string(), s))
    );
    assert_eq!(home.rows("s1")[1].2, original);
    assert_eq!(home.rows("s2").len(), 1);
    // No WAL was left behind at the output path: everything is in the file installed.
    let mut wal = output.as_os_str().to_owned();
    wal.push("-wal");
    assert!(!std::path::Path::new(&wal).exists());
}

#[test]
fn an_unreadable_old_database_stops_the_install() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    drop(store);
    let work = tempfile::tempdir().unwrap();
    recover::copy_source(&home.db(), work.path()).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let output = out_dir.path().join("recovered.db");
    recover::rebuild(&work.path().join("state.db"), &output).unwrap();
    // Garbage over the header: its rows cannot be read to carry them over.
    let mut bytes = std::fs::read(home.db()).unwrap();
    bytes[..100].fill(0x5A);
    std::fs::write(home.db(), &bytes).unwrap();

    let err = recover::install(&output, home.path()).unwrap_err();
    assert!(matches!(err, RecoverError::CarryOver { .. }), "{err}");
    assert!(err.to_string().contains("nothing was installed"), "{err}");
    assert_eq!(std::fs::read(home.db()).unwrap(), bytes, "the old file is where it was");
    assert!(output.exists());
}
