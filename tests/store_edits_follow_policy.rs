//! `pop_last` and `clear_session` are writes outside the flush: they
//! follow the policy (a held lock is retried on its plan, another writer's
//! live lease fences them, read-only storage fails them as `disk`), the
//! deleted rows leave the search index, and clearing settles the
//! session's pending divert lines as `cleared`.
mod common;
use std::time::Duration;

use common::privileged::Immutable;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::{ActionKind, Cause};

fn fts_hits(home: &Home, word: &str) -> i64 {
    home.other()
        .query_row(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1",
            [word],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn pop_removes_the_newest_and_its_index_entry() {
    let home = Home::new();
    let mut store = home.store();
    let mut b = batch("a", 3);
    b.push(turnsafe_host::message::Message::new("user", "zebra crossing").with_uid("z"));
    assert!(store.append_batch(&sid("s1"), &b).persisted);
    store.catch_up_index(None).unwrap();
    assert_eq!(fts_hits(&home, "zebra"), 1);
    let popped = store.pop_last(&sid("s1")).unwrap().unwrap();
    assert_eq!((popped.uid.as_str(), popped.seq), ("z", 4));
    assert_eq!(popped.message["content"], "zebra crossing");
    assert_eq!(fts_hits(&home, "zebra"), 0, "the deleted row left the index");
    let found = turnsafe_host::search::search(home.path(), "zebra", &Default::default()).unwrap();
    assert!(found.hits.is_empty() && found.unindexed == 0);
    assert_eq!(home.rows("s1").len(), 3);
    // The index is still consistent with the table.
    home.other()
        .execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')", [])
        .unwrap();
    assert_eq!(store.clear_session(&sid("s1")).unwrap(), 3);
    assert!(store.pop_last(&sid("s1")).unwrap().is_none());
    assert_eq!(fts_hits(&home, "lorem"), 0);
    let found = turnsafe_host::search::search(home.path(), "lorem", &Default::default()).unwrap();
    assert!(found.hits.is_empty());
    // Seqs are never reused: a message after the edits follows every
    // seq this handle gave out (diverted lines may hold the others).
    assert!(store.append_batch(&sid("s1"), &batch("n", 1)).persisted);
    assert_eq!(home.rows("s1")[0].1, 5);
}

#[test]
fn a_held_lock_is_waited_out() {
    let home = Home::new();
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let holder = hold_write_lock(&home, Duration::from_millis(800));
    let popped = store.pop_last(&sid("s1")).unwrap();
    holder.join().unwrap();
    assert_eq!(popped.unwrap().uid, "a-1");
}

#[test]
fn another_writers_live_lease_fences_the_edit() {
    let home = Home::new();
    let mut writer = home.store_with(StoreOptions {
        holder: "other".into(),
        ..StoreOptions::default()
    });
    assert!(writer.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let mut store = home.store();
    let e = store.clear_session(&sid("s1")).unwrap_err();
    assert_eq!(
        (e.cause, e.action, e.edit),
        (Cause::TurnLease, ActionKind::FailClosed, "clear")
    );
    assert!(e.to_string().contains("session_persistence_failed:turn_lease"));
    assert_eq!(home.rows("s1").len(), 2, "nothing removed");
    // The lease holder itself may edit.
    assert_eq!(writer.pop_last(&sid("s1")).unwrap().unwrap().uid, "a-1");
    writer.release_lease(&sid("s1"));
    assert_eq!(store.clear_session(&sid("s1")).unwrap(), 1);
}

#[test]
fn read_only_storage_fails_the_edit_as_disk() {
    let home = Home::new();
    let mut first = home.store();
    assert!(first.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    drop(first);
    let _imm = skip_unless!(Immutable::new(&home.db()));
    let mut store = home.store();
    let e = store.pop_last(&sid("s1")).unwrap_err();
    assert_eq!(e.cause, Cause::Disk);
    assert_eq!(e.action, ActionKind::FailClosed);
    let e = store.clear_session(&sid("s1")).unwrap_err();
    assert_eq!(e.cause, Cause::Disk);
    assert_eq!(home.rows("s1").len(), 2);
}

#[test]
fn clearing_settles_pending_divert_lines_as_cleared() {
    let home = Home::new();
    drop(home.store());
    {
        let _imm = skip_unless!(Immutable::new(&home.db()));
        let mut store = home.store();
        assert_eq!(store.append_batch(&sid("s1"), &batch("d", 3)).diverted, 3);
        assert_eq!(store.append_batch(&sid("s2"), &batch("e", 1)).diverted, 1);
    }
    let n = turnsafe_host::clear::clear(&mut home.store(), home.path(), &sid("s1")).unwrap();
    assert_eq!(n.settled.settled, 3);
    let ledger = std::fs::read_to_string(home.path().join("sessions/ledger.jsonl")).unwrap();
    let entries: Vec<serde_json::Value> = ledger.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(entries.len(), 3);
    assert!(entries.iter().all(|e| e["state"] == "cleared" && e["session"] == "s1"));
    assert_eq!(
        entries.iter().map(|e| e["uid"].as_str().unwrap()).collect::<Vec<_>>(),
        ["d-0", "d-1", "d-2"]
    );
    assert!(!home.divert_file("s1").exists());
    assert!(home.divert_file("s2").exists(), "other sessions' lines stay pending");
    // Replay then has only s2's line to import; nothing of s1 comes back.
    let run = turnsafe_host::replay::replay_run(home.path(), &Default::default()).unwrap();
    assert_eq!(run.summary(false)["replayed"], 1);
    assert!(home.rows("s1").is_empty());
    let again = turnsafe_host::clear::clear(&mut home.store(), home.path(), &sid("s1")).unwrap();
    assert_eq!(again.settled.settled, 0);
}
