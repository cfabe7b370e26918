//! Replay: idempotent by (session, uid), keeps `seq` so a transcript that
//! went on after a divert reads in order, quarantines every bad line with a
//! reason, and refuses while a live lease is held.
mod common;
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::Backend;
use turnsafe_host::replay::{ReplayError, ReplayOptions, replay};
use turnsafe_host::store::StoreOptions;

fn ledger(home: &Home) -> Vec<Value> {
    std::fs::read_to_string(home.path().join("sessions/ledger.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn replay_after_the_conversation_went_on_keeps_the_order() {
    let home = Home::new();
    let mut a = home.store();
    assert!(a.append_batch(&sid("s1"), &batch("one", 2)).persisted);
    drop(a);
    // The store turns read-only for a while: the second batch is diverted.
    let mut ro = home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    });
    let out = ro.append_batch(&sid("s1"), &batch("two", 2));
    assert_eq!(out.diverted, 2);
    drop(ro);
    // Another handle carries on.
    let mut c = home.store();
    assert!(c.append_batch(&sid("s1"), &batch("three", 2)).persisted);
    drop(c);

    let reports = replay(home.path(), &ReplayOptions::default()).unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(
        (
            reports[0].lines,
            reports[0].replayed,
            reports[0].duplicate,
            reports[0].quarantined
        ),
        (2, 2, 0, 0)
    );
    let uids: Vec<String> = home.rows("s1").into_iter().map(|r| r.0).collect();
    assert_eq!(uids, ["one-0", "one-1", "two-0", "two-1", "three-0", "three-1"]);

    // A second run changes nothing.
    let before = home.rows("s1");
    let again = replay(home.path(), &ReplayOptions::default()).unwrap();
    assert!(again.is_empty());
    assert_eq!(home.rows("s1"), before);
    assert_eq!(ledger(&home).len(), 2);

    // The same lines offered again settle as duplicates.
    let settled = reports[0].settled_to.clone().unwrap();
    std::fs::copy(&settled, home.divert_file("s1")).unwrap();
    let dup = replay(home.path(), &ReplayOptions::default()).unwrap();
    assert_eq!((dup[0].replayed, dup[0].duplicate), (0, 2));
    assert_eq!(home.rows("s1"), before);
}

#[test]
fn every_bad_line_is_quarantined_with_a_reason_and_kept() {
    let home = Home::new();
    let mut s = home.store();
    assert!(s.append_batch(&sid("s1"), &batch("stored", 1)).persisted);
    drop(s);
    let good = |uid: &str, seq: Value| {
        json!({"v":1,"session":"s1","uid":uid,"seq":seq,"batch":"b","cause":"disk","at":"2026-11-30T00:00:00Z",
               "message":{"role":"user","content":format!("content of {uid}"),"uid":uid}})
        .to_string()
    };
    let lines = [
        good("fine-1", json!(5)),
        "{\"v\":1,\"session\":\"s1\",\"uid\":\"torn".to_string(),
        "[1,2,3]".to_string(),
        json!({"v":3,"session":"s1","uid":"v3","message":{"role":"user","content":"x"}}).to_string(),
        json!({"v":1,"session":"other","uid":"o1","message":{"role":"user","content":"x"}}).to_string(),
        json!({"v":1,"session":"s1","message":{"role":"user","content":"x"}}).to_string(),
        json!({"v":1,"session":"s1","uid":"norole","message":{"content":"x"}}).to_string(),
        json!({"v":2,"session":"s1","uid":"v2-any","seq":null,"message":{"type":"function_call","name":"f"}})
            .to_string(),
        json!({"v":2,"session":"s1","uid":"v2-not-object","message":"text"}).to_string(),
        json!({"v":1,"session":"s1","uid":"badseq","seq":"7","message":{"role":"user","content":"x"}}).to_string(),
        json!({"v":1,"session":"s1","uid":"stored-0","seq":1,"message":{"role":"user","content":"not what is stored"}})
            .to_string(),
        good("fine-2", Value::Null),
    ];
    std::fs::create_dir_all(home.path().join("sessions")).unwrap();
    std::fs::write(home.divert_file("s1"), lines.join("\n") + "\n").unwrap();

    let r = &replay(home.path(), &ReplayOptions::default()).unwrap()[0];
    assert_eq!((r.lines, r.replayed, r.duplicate, r.quarantined), (12, 3, 0, 9));
    let reasons: Vec<String> = ledger(&home)
        .iter()
        .filter(|l| l["state"] == "quarantined")
        .map(|l| l["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        reasons,
        [
            "torn or invalid JSON",
            "not a JSON object",
            "unsupported or missing format version `v`",
            "line belongs to another session",
            "missing or invalid `uid`",
            "`message` needs `role` and `content`",
            "missing `message` object",
            "`seq` is not an integer",
        ]
    );
    // The uid stored with other bytes is a conflict, set aside with both
    // digests: the line's and the stored row's.
    assert_eq!(r.conflict, 1);
    let entries = ledger(&home);
    let conflicts: Vec<&Value> = entries.iter().filter(|l| l["state"] == "conflict").collect();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0]["uid"], "stored-0");
    assert_eq!(
        conflicts[0]["reason"],
        "uid conflict: the stored message has different content"
    );
    let stored_item: String = home
        .other()
        .query_row("SELECT item FROM messages WHERE uid = 'stored-0'", [], |r| r.get(0))
        .unwrap();
    let line_item = json!({"role":"user","content":"not what is stored"});
    assert_eq!(conflicts[0]["digest"], common::canonical::digest(&line_item));
    assert_eq!(
        conflicts[0]["stored_digest"],
        common::canonical::digest(&serde_json::from_str::<Value>(&stored_item).unwrap())
    );
    assert_ne!(conflicts[0]["digest"], conflicts[0]["stored_digest"]);
    // Nothing dropped: the settled file still holds every line.
    let kept = std::fs::read_to_string(r.settled_to.as_ref().unwrap()).unwrap();
    assert_eq!(kept.lines().count(), 12);
    let uids: Vec<String> = home.rows("s1").into_iter().map(|r| r.0).collect();
    assert_eq!(uids, ["stored-0", "fine-1", "v2-any", "fine-2"]);
    // A version 1 line's message had the uid inside; it is stored without it.
    let stored: String = home
        .other()
        .query_row("SELECT item FROM messages WHERE uid = 'fine-1'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&stored).unwrap(),
        json!({"role":"user","content":"content of fine-1"})
    );
}

#[test]
fn a_live_lease_makes_replay_refuse_unless_forced() {
    let home = Home::new();
    let mut live = home.store();
    assert!(live.append_batch(&sid("s1"), &batch("a", 1)).persisted);
    std::fs::create_dir_all(home.path().join("sessions")).unwrap();
    let line = json!({"v":1,"session":"s1","uid":"d1","seq":null,"message":{"role":"user","content":"x"}});
    std::fs::write(home.divert_file("s1"), format!("{line}\n")).unwrap();
    let err = replay(home.path(), &ReplayOptions::default()).unwrap_err();
    assert!(matches!(err, ReplayError::LeaseLive { .. }), "{err}");
    assert!(home.divert_file("s1").exists(), "nothing was taken");
    let forced = replay(
        home.path(),
        &ReplayOptions {
            force: true,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert_eq!(forced[0].replayed, 1);
}

#[test]
fn a_dry_run_changes_nothing() {
    let home = Home::new();
    drop(home.store());
    std::fs::create_dir_all(home.path().join("sessions")).unwrap();
    let line = json!({"v":1,"session":"s1","uid":"d1","seq":1,"message":{"role":"user","content":"x"}});
    std::fs::write(home.divert_file("s1"), format!("{line}\n")).unwrap();
    let r = replay(
        home.path(),
        &ReplayOptions {
            dry_run: true,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert_eq!((r[0].replayed, r[0].settled_to.clone()), (1, None));
    assert!(home.divert_file("s1").exists());
    assert!(home.rows("s1").is_empty());
    assert!(!home.path().join("sessions/ledger.jsonl").exists());
}
