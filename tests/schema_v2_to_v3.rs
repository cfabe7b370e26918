//! A `state.db` written by the schema v2 code (`tests/fixtures/state-v2.db`)
//! is migrated to messages of any shape (v3) when a store opens it: every
//! row's object is rebuilt exactly, with its uid, seq and time; the index
//! is rebuilt where the text projection changed what it holds, and search
//! finds both indexed rows and rows that were past the watermark; resends
//! of migrated messages are duplicates; readers that cannot migrate (show,
//! recover) read the old layout as it is.
mod common;
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;
use turnsafe_host::transcript::stored_messages;

const FIXTURE: &[u8] = include_bytes!("fixtures/state-v2.db");

fn v2_home() -> Home {
    let home = Home::new();
    std::fs::write(home.db(), FIXTURE).unwrap();
    home
}

fn expected_s1() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "hello zebra"}),
        json!({"role": "assistant", "content": [{"type": "output_text", "text": "hi giraffe", "annotations": []}],
               "status": "completed", "id": "msg_1"}),
        json!({"role": "tool", "content": {"k": [1, 2.5, null]}, "name": "calc"}),
        json!({"role": "user", "content": "minted uid here"}),
        json!({"role": "user", "content": "a late penguin"}),
    ]
}

fn read(home: &Home, session: &str) -> Vec<(String, i64, Value)> {
    let conn = turnsafe_host::store::open_read_only(&home.db()).unwrap();
    stored_messages(&conn, session, None)
        .unwrap()
        .into_iter()
        .map(|m| (m.uid, m.seq, Value::Object(m.message)))
        .collect()
}

fn meta(home: &Home, key: &str) -> String {
    home.other()
        .query_row("SELECT value FROM state_meta WHERE key = ?1", [key], |r| r.get(0))
        .unwrap()
}

#[test]
fn the_fixture_is_schema_v2_and_readable_as_it_is() {
    let home = v2_home();
    let v: i64 = home.other().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, 2);
    assert_eq!(meta(&home, "fts_watermark"), "5");
    // Readers that never migrate read the old layout as it is.
    let before = read(&home, "s1");
    assert_eq!(before.iter().map(|r| r.2.clone()).collect::<Vec<_>>(), expected_s1());
}

#[test]
fn opening_migrates_every_row_exactly() {
    let home = v2_home();
    let before_s1 = read(&home, "s1");
    let before_s2 = read(&home, "s2");
    let store = home.store();
    assert!(store.is_open());
    let c = home.other();
    let v: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    // Through version 3 to the current one.
    assert_eq!(v, turnsafe_host::store::SCHEMA_VERSION);
    assert_eq!(
        meta(&home, "schema_version"),
        turnsafe_host::store::SCHEMA_VERSION.to_string()
    );
    assert_eq!(read(&home, "s1"), before_s1);
    assert_eq!(read(&home, "s2"), before_s2);
    assert_eq!(
        before_s1.iter().map(|r| r.0.as_str()).take(3).collect::<Vec<_>>(),
        ["u1", "u2", "u3"]
    );
    assert_eq!(before_s1.iter().map(|r| r.1).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    assert_eq!(
        before_s2[0].2,
        json!({"role": "user", "content": "unicode żółć 🦀", "meta": {"a": 1, "b": [true, false]}})
    );
    // The projection: text of the parts, JSON text of other content.
    let projected: Vec<(Option<String>, Option<String>)> = c
        .prepare("SELECT role, content FROM messages WHERE session_id = 's1' ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(projected[1], (Some("assistant".into()), Some("hi giraffe".into())));
    assert_eq!(projected[2].1.as_deref(), Some(r#"{"k":[1,2.5,null]}"#));
    // The projection changed what the index held (u2's parts): rebuilt,
    // so the watermark now covers every row, the late one included.
    assert_eq!(meta(&home, "fts_enabled"), "1");
    assert_eq!(meta(&home, "fts_watermark"), "6");
    let hits = |w: &str| -> i64 {
        c.query_row(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1",
            [w],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(
        (hits("zebra"), hits("giraffe"), hits("annotations"), hits("penguin")),
        (1, 1, 0, 1)
    );
    c.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')", [])
        .unwrap();
    drop(store);
}

#[test]
fn search_finds_every_message_after_the_migration() {
    let home = v2_home();
    drop(home.store());
    let found = |q: &str| {
        turnsafe_host::search::search(home.path(), q, &Default::default())
            .unwrap()
            .hits
            .into_iter()
            .map(|h| h.uid)
            .collect::<Vec<_>>()
    };
    assert_eq!(found("giraffe"), ["u2"]);
    assert_eq!(found("penguin"), ["u5"]);
    assert_eq!(found("żółć"), ["v1"]);
}

#[test]
fn after_migration_resends_are_duplicates_and_any_shape_is_stored() {
    let home = v2_home();
    let mut store = home.store();
    let resend: Vec<Message> = expected_s1()
        .into_iter()
        .zip(["u1", "u2", "u3"])
        .map(|(v, uid)| Message::from_item(v.as_object().unwrap().clone()).with_uid(uid))
        .collect();
    let out = store.append_batch(&sid("s1"), &resend);
    assert!(out.persisted && out.committed == 3, "{}", out.to_value());
    assert_eq!(home.rows("s1").len(), 5, "no new rows");
    let call = json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
    let out = store.append_batch(
        &sid("s1"),
        &[Message::from_item(call.as_object().unwrap().clone()).with_uid("c1")],
    );
    assert!(out.persisted);
    let rows = read(&home, "s1");
    assert_eq!(rows.last().unwrap(), &("c1".to_string(), 6, call));
    // A message without content is stored, and never matches a search.
    drop(store);
    let r = turnsafe_host::search::search(home.path(), "function_call", &Default::default()).unwrap();
    assert!(r.hits.is_empty());
}

#[test]
fn recover_reads_a_v2_database_as_it_is() {
    let home = v2_home();
    let out = home.path().join("rebuilt.db");
    let report = turnsafe_host::recover::rebuild(&home.db(), &out).unwrap();
    assert_eq!(report["messages"], 6, "{report}");
    let rebuilt = Home::new();
    std::fs::copy(&out, rebuilt.db()).unwrap();
    assert_eq!(
        read(&rebuilt, "s1").into_iter().map(|r| r.2).collect::<Vec<_>>(),
        expected_s1()
    );
}
