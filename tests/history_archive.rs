//! History rewrites lose nothing (SQLite): pop and clear archive what they
//! take out, with the reason, the time and the lease holder; restore
//! brings it back at its seqs, skipping a uid active again; a clear
//! archives the session's pending divert lines too, and restore brings
//! them back; a fork copies a prefix with derived uids and its lineage,
//! and a retried fork stores nothing twice; a compaction's replace is one
//! transaction that archives what it replaced and refuses a changed
//! suffix; and an edit that fails for real (an abort trigger the test
//! installs in `state.db`) changes nothing at all.
mod common;
use common::*;
use serde_json::json;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::history::{ForkRefused, Reason, Selector};
use turnsafe_host::message::Message;
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::Cause;

fn uids(home: &Home, session: &str) -> Vec<String> {
    home.rows(session).into_iter().map(|r| r.0).collect()
}

fn archive(home: &Home, session: &str) -> Vec<(String, i64, String, String)> {
    let c = home.other();
    let mut stmt = c
        .prepare("SELECT uid, seq, reason, COALESCE(holder, '') FROM archive WHERE session_id = ?1 ORDER BY id")
        .unwrap();
    stmt.query_map([session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn pop_archives_and_restore_brings_it_back_in_place() {
    let home = Home::new();
    let mut store = home.store_with(StoreOptions {
        holder: "agent-7".into(),
        ..StoreOptions::default()
    });
    assert!(store.append_batch(&sid("s1"), &batch("a", 3)).persisted);
    let popped = store.pop_last(&sid("s1")).unwrap().expect("a message");
    assert_eq!((popped.uid.as_str(), popped.seq), ("a-2", 3));
    assert_eq!(uids(&home, "s1"), ["a-0", "a-1"]);
    assert_eq!(
        archive(&home, "s1"),
        [("a-2".to_string(), 3, "pop".to_string(), "agent-7".to_string())]
    );
    let shown = store.archived("s1", None).unwrap();
    assert_eq!(shown.len(), 1);
    let v = shown[0].to_value();
    assert_eq!(v["reason"], "pop");
    assert!(v["message"]["content"].as_str().unwrap().starts_with("a message 2"));
    assert!(v["archived_at"].as_str().unwrap().ends_with('Z'), "{v}");

    // New messages after the pop; the popped one comes back at its seq.
    assert!(store.append_batch(&sid("s1"), &batch("b", 1)).persisted);
    let report = store
        .restore(&sid("s1"), &Selector::Uids(vec!["a-2".into(), "zz".into()]))
        .unwrap();
    assert_eq!(report.restored, [("a-2".to_string(), 3)]);
    assert_eq!(report.not_archived, ["zz"]);
    assert_eq!(uids(&home, "s1"), ["a-0", "a-1", "a-2", "b-0"]);
    assert!(archive(&home, "s1").is_empty(), "a restored row leaves the archive");
}

#[test]
fn a_uid_active_again_is_skipped_by_restore() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    store.pop_last(&sid("s1")).unwrap();
    // The same uid sent again: it is active once more, and sits in the archive too.
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    assert_eq!(uids(&home, "s1"), ["a-0", "a-1"]);
    assert_eq!(archive(&home, "s1").len(), 1);
    let report = store
        .restore(
            &sid("s1"),
            &Selector::Reason {
                reason: Reason::Pop,
                since_ms: None,
            },
        )
        .unwrap();
    assert!(report.restored.is_empty());
    assert_eq!(report.skipped_active, ["a-1"]);
    assert_eq!(home.rows("s1").len(), 2, "the active row was not overwritten");
    assert_eq!(archive(&home, "s1").len(), 1, "the skipped row stays archived");
}

#[test]
fn clear_archives_rows_and_pending_divert_lines_and_restore_brings_all_back() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    // A batch diverted for real: the database is made read-only under the
    // writer (a trigger that aborts every insert), so it goes to sessions/s1.jsonl.
    home.other()
        .execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON messages BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
        )
        .unwrap();
    let out = store.append_batch(&sid("s1"), &batch("d", 2));
    assert!(!out.persisted && out.receipt.is_some(), "{}", out.to_value());
    home.other().execute_batch("DROP TRIGGER refuse").unwrap();

    let report = turnsafe_host::clear::clear(&mut store, home.path(), &sid("s1")).unwrap();
    let cleared = report.cleared;
    assert_eq!(cleared.rows.len(), 2);
    assert_eq!(
        cleared.pending.iter().map(|m| m.uid.as_str()).collect::<Vec<_>>(),
        ["d-0", "d-1"]
    );
    assert_eq!(report.settled.settled, 2);
    assert!(home.rows("s1").is_empty());
    let reasons: Vec<String> = archive(&home, "s1").into_iter().map(|a| a.2).collect();
    assert_eq!(reasons, ["clear"; 4]);

    // Replay does not bring the cleared lines back into the cleared session.
    let run = turnsafe_host::replay::replay_run(home.path(), &Default::default()).unwrap();
    assert_eq!(run.summary(false)["replayed"], 0, "{}", run.summary(false));
    assert!(home.rows("s1").is_empty());

    let report = store
        .restore(
            &sid("s1"),
            &Selector::Reason {
                reason: Reason::Clear,
                since_ms: None,
            },
        )
        .unwrap();
    assert_eq!(report.restored.len(), 4, "{report:?}");
    assert_eq!(uids(&home, "s1"), ["a-0", "a-1", "d-0", "d-1"]);
    let contents: Vec<String> = home.rows("s1").into_iter().map(|r| r.2).collect();
    assert!(contents[3].starts_with("d message 1"));
}

#[test]
fn fork_copies_the_prefix_with_derived_uids_and_lineage() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 4)).persisted);
    let r = store.fork(&sid("s1"), 2, &sid("s2")).unwrap().unwrap();
    assert_eq!((r.copied, r.already), (2, 0));
    let forked = home.rows("s2");
    assert_eq!(forked.iter().map(|r| r.1).collect::<Vec<_>>(), [1, 2]);
    assert!(forked[1].2.starts_with("a message 1"));
    assert_eq!(forked[0].0, turnsafe_host::history::fork_uid("s2", "a-0"));
    assert_ne!(forked[0].0, "a-0");
    let lineage = store.lineage("s2").expect("a fork");
    assert_eq!((lineage.session.as_str(), lineage.seq), ("s1", 2));
    assert!(store.lineage("s1").is_none());

    // Retried: nothing twice.
    let again = store.fork(&sid("s1"), 2, &sid("s2")).unwrap().unwrap();
    assert_eq!((again.copied, again.already), (0, 2));
    assert_eq!(home.rows("s2").len(), 2);
    // Another fork into it, or into a session of its own, is refused.
    assert!(matches!(
        store.fork(&sid("s1"), 3, &sid("s2")).unwrap(),
        Err(ForkRefused::Exists { .. })
    ));
    assert!(store.append_batch(&sid("s3"), &batch("c", 1)).persisted);
    assert!(matches!(
        store.fork(&sid("s1"), 2, &sid("s3")).unwrap(),
        Err(ForkRefused::Exists { .. })
    ));
    assert!(matches!(
        store.fork(&sid("s1"), 2, &sid("s1")).unwrap(),
        Err(ForkRefused::Same)
    ));
    // A resend of a source message into the fork is a new message, never a duplicate of the copy.
    assert!(store.append_batch(&sid("s2"), &batch("a", 1)).persisted);
    assert_eq!(home.rows("s2").len(), 3);
}

#[test]
fn replace_suffix_archives_what_it_replaced_and_refuses_a_changed_suffix() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 5)).persisted);
    let summary = vec![Message::from_item(
        json!({"role": "user", "content": "summary of a-2..a-4"})
            .as_object()
            .unwrap()
            .clone(),
    )];
    // The suffix changed since it was read: nothing happens.
    let stale = vec!["a-2".to_string(), "a-3".to_string()];
    assert!(
        !store
            .replace_suffix(&sid("s1"), 3, &summary, Some(&stale), None)
            .unwrap()
    );
    assert_eq!(home.rows("s1").len(), 5);
    assert!(archive(&home, "s1").is_empty());

    let expected = vec!["a-2".to_string(), "a-3".to_string(), "a-4".to_string()];
    assert!(
        store
            .replace_suffix(&sid("s1"), 3, &summary, Some(&expected), Some(2))
            .unwrap()
    );
    let rows = home.rows("s1");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].0, "a-1", "the prefix before seq 2 was pruned");
    assert_eq!(rows[1].2, "summary of a-2..a-4");
    assert_eq!(rows[1].1, 3);
    let archived: Vec<(String, String)> = archive(&home, "s1").into_iter().map(|a| (a.0, a.2)).collect();
    assert_eq!(archived.len(), 4);
    assert!(archived.iter().all(|a| a.1 == "compaction"));
    // Restoring the compaction brings the originals back beside the summary.
    let report = store
        .restore(
            &sid("s1"),
            &Selector::Reason {
                reason: Reason::Compaction,
                since_ms: None,
            },
        )
        .unwrap();
    assert_eq!(report.restored.len(), 4);
    assert_eq!(home.rows("s1").len(), 6);
}

#[test]
fn an_edit_that_fails_for_real_changes_nothing() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 3)).persisted);
    home.other()
        .execute_batch("CREATE TRIGGER refuse BEFORE INSERT ON archive BEGIN SELECT RAISE(ABORT, 'archive full'); END;")
        .unwrap();
    let before = home.rows("s1");
    let e = store.pop_last(&sid("s1")).unwrap_err();
    assert_ne!(e.cause, Cause::Locked);
    assert!(e.message.contains("archive full"), "{e}");
    let e = store.clear_session(&sid("s1")).unwrap_err();
    assert_eq!(e.edit, "clear");
    let summary = batch("sum", 1);
    assert!(store.replace_suffix(&sid("s1"), 2, &summary, None, None).is_err());
    assert_eq!(home.rows("s1"), before, "no edit was half applied");
    assert!(archive(&home, "s1").is_empty());
}
