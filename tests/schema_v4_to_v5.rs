//! A `state.db` written by the schema v4 code (`tests/fixtures/state-v4.db`,
//! with archived rows) gains `session_meta` (v5) when a store opens it:
//! every message and every archived row stays exactly as it was, and an
//! import then records its sessions there.
mod common;
use common::*;
use turnsafe_host::store::import::{ImportRow, ImportSession};
use turnsafe_host::transcript::stored_messages;

const FIXTURE: &[u8] = include_bytes!("fixtures/state-v4.db");

fn v4_home() -> Home {
    let home = Home::new();
    std::fs::write(home.db(), FIXTURE).unwrap();
    home
}

type Rows = Vec<(String, i64, serde_json::Value)>;

fn read(home: &Home, session: &str) -> Rows {
    let conn = turnsafe_host::store::open_read_only(&home.db()).unwrap();
    stored_messages(&conn, session, None)
        .unwrap()
        .into_iter()
        .map(|m| (m.uid, m.seq, serde_json::Value::Object(m.message)))
        .collect()
}

fn archive(home: &Home) -> Vec<(String, String, i64, String, String)> {
    let c = home.other();
    let mut s = c
        .prepare("SELECT session_id, uid, seq, item, reason FROM archive ORDER BY id")
        .unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn version(home: &Home) -> i64 {
    home.other().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

fn has_session_meta(home: &Home) -> bool {
    home.other()
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'session_meta')",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn opening_migrates_to_v5_and_keeps_every_row_and_archived_row() {
    let home = v4_home();
    assert_eq!(version(&home), 4);
    assert!(!has_session_meta(&home));
    let before = (read(&home, "s1"), read(&home, "s2"), archive(&home));
    assert_eq!(before.0.len(), 4);
    assert_eq!(before.2.len(), 2);
    assert_eq!(
        before
            .2
            .iter()
            .map(|a| (a.1.as_str(), a.4.as_str()))
            .collect::<Vec<_>>(),
        [("u5", "pop"), ("v1", "pop")]
    );

    let mut store = home.store();
    assert!(store.is_open());
    // Through version 5 to the current one.
    assert_eq!(version(&home), turnsafe_host::store::SCHEMA_VERSION);
    assert!(has_session_meta(&home));
    assert_eq!((read(&home, "s1"), read(&home, "s2"), archive(&home)), before);

    // An import records its session; the migrated rows are untouched.
    let part = ImportSession {
        session: sid("imported"),
        created_ms: 1,
        meta: Some(("hermes".into(), "imported".into(), r#"{"hermes":{"title":"t"}}"#.into())),
        rows: vec![ImportRow {
            uid: "hermes:1".into(),
            seq: 0,
            message: turnsafe_host::message::Message::new("user", "hi"),
            created_ms: 1,
            archive: None,
        }],
    };
    let counts = store.import_group(std::slice::from_ref(&part)).unwrap();
    assert_eq!(counts[0].imported, 1);
    let again = store.import_group(&[part]).unwrap();
    assert_eq!((again[0].imported, again[0].duplicate), (0, 1));
    let (origin, meta): (String, String) = home
        .other()
        .query_row(
            "SELECT origin, meta FROM session_meta WHERE session_id = 'imported'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (origin.as_str(), meta.as_str()),
        ("hermes", r#"{"hermes":{"title":"t"},"seq_base":0}"#)
    );
    assert_eq!((read(&home, "s1"), read(&home, "s2"), archive(&home)), before);
}
