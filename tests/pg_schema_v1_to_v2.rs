//! A PostgreSQL database written by the version 1 code (`pg_dump` of it in
//! `tests/fixtures/pg-v1.sql`) is migrated to messages of any shape
//! (version 2) when a writer opens it: every row's object rebuilt exactly
//! with its uid and seq, the old columns gone, the search entries of rows
//! whose text projection changed dropped and made again, resends of
//! migrated messages duplicates, and a message without role stored.
mod common;
use common::pg;
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;

const FIXTURE: &str = include_str!("fixtures/pg-v1.sql");

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

#[test]
fn a_version_1_database_is_migrated_exactly() {
    let server = pg_or_skip!();
    let db = server.create_db("pgv1");
    server.admin(&db).batch_execute(FIXTURE).unwrap();
    let version = |server: &pg::PgServer| -> String {
        server
            .admin(&db)
            .query_one("SELECT value FROM state_meta WHERE key = 'schema_version'", &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(version(&server), "1");
    let home = Home::new();
    let mut w = pg::store(&server.url(&db), home.path());
    let out = w.append_batch(
        &sid("s1"),
        &[Message::from_item(json!({"type": "reasoning", "summary": []}).as_object().unwrap().clone()).with_uid("r1")],
    );
    assert!(out.persisted, "{}", out.to_value());
    assert_eq!(version(&server), turnsafe_host::pg::schema::VERSION.to_string());
    let b = w.backend();
    let transcript = b.transcript("s1").unwrap();
    let mut want = expected_s1();
    want.push(json!({"type": "reasoning", "summary": []}));
    assert_eq!(
        transcript.iter().map(|m| m["message"].clone()).collect::<Vec<_>>(),
        want
    );
    assert_eq!(
        transcript
            .iter()
            .map(|m| m["seq"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(transcript[0]["uid"], "u1");
    assert_eq!(
        b.transcript("s2").unwrap()[0]["message"],
        json!({"role": "user", "content": "unicode żółć 🦀", "meta": {"a": 1, "b": [true, false]}})
    );
    // The old columns are gone; the projection replaced JSON content.
    let admin = &mut server.admin(&db);
    let cols: Vec<String> = admin
        .query(
            "SELECT column_name::text FROM information_schema.columns WHERE table_name = 'messages' ORDER BY ordinal_position",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        cols,
        [
            "id",
            "session_id",
            "uid",
            "seq",
            "role",
            "content",
            "created_ms",
            "item"
        ]
    );
    let content: Option<String> = admin
        .query_one("SELECT content FROM messages WHERE uid = 'u2'", &[])
        .unwrap()
        .get(0);
    assert_eq!(content.as_deref(), Some("hi giraffe"));
    // Search: the changed rows are indexed again; nothing is missed.
    let found = |b: &mut turnsafe_host::pg::Postgres, q: &str| -> Vec<String> {
        b.search(q, None, 10, false)
            .unwrap()
            .hits
            .into_iter()
            .map(|h| h.uid)
            .collect()
    };
    assert_eq!(found(b, "giraffe"), ["u2"]);
    assert_eq!(found(b, "annotations"), Vec::<String>::new());
    assert_eq!(found(b, "penguin"), ["u5"]);
    // Resending migrated messages with their uids stores nothing twice.
    let resend: Vec<Message> = expected_s1()
        .into_iter()
        .zip(["u1", "u2", "u3"])
        .map(|(v, uid)| Message::from_item(v.as_object().unwrap().clone()).with_uid(uid))
        .collect();
    let out = w.append_batch(&sid("s1"), &resend);
    assert!(out.persisted && out.committed == 3, "{}", out.to_value());
    assert_eq!(pg::rows(&server, &db, "s1").len(), 6);
}
