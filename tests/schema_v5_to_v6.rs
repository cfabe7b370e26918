//! A `state.db` written by the schema v5 code (`tests/fixtures/state-v5.db`,
//! with archived rows and imported sessions' records) gains LangGraph's
//! `checkpoints` and `checkpoint_writes` (v6) when a store opens it: every
//! message, archived row and `session_meta` row stays exactly as it was,
//! and a checkpoint and its writes can then be stored and read back. Every
//! older fixture reaches the current version with the same tables.
mod common;
use common::*;
use rusqlite::Connection;
use rusqlite::types::Value as Sql;
use turnsafe_host::store::SCHEMA_VERSION;

const FIXTURE: &[u8] = include_bytes!("fixtures/state-v5.db");

/// The LangGraph objects: both tables (`WITHOUT ROWID`, so their keys
/// are the tables themselves) and `checkpoints_by_run`.
const GRAPH_OBJECTS: &str = "SELECT type, name, tbl_name, sql FROM sqlite_master \
     WHERE tbl_name IN ('checkpoints', 'checkpoint_writes') ORDER BY type, name";

fn home_with(bytes: &[u8]) -> Home {
    let home = Home::new();
    std::fs::write(home.db(), bytes).unwrap();
    home
}

/// Every column of every row `sql` selects, as SQLite stores it.
fn dump(c: &Connection, sql: &str) -> Vec<Vec<Sql>> {
    let mut s = c.prepare(sql).unwrap();
    let n = s.column_count();
    s.query_map([], |r| (0..n).map(|i| r.get::<_, Sql>(i)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Messages, archive and imported sessions' records, every column.
type Stored = (Vec<Vec<Sql>>, Vec<Vec<Sql>>, Vec<Vec<Sql>>);

fn stored(home: &Home) -> Stored {
    let c = home.other();
    (
        dump(&c, "SELECT * FROM messages ORDER BY id"),
        dump(&c, "SELECT * FROM archive ORDER BY id"),
        dump(&c, "SELECT * FROM session_meta ORDER BY session_id"),
    )
}

fn version(home: &Home) -> i64 {
    home.other().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

fn meta(home: &Home, key: &str) -> Option<String> {
    home.other()
        .query_row("SELECT value FROM state_meta WHERE key = ?1", [key], |r| r.get(0))
        .ok()
}

fn count(home: &Home, table: &str) -> i64 {
    home.other()
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

fn graph_objects(home: &Home) -> Vec<Vec<Sql>> {
    dump(&home.other(), GRAPH_OBJECTS)
}

/// The LangGraph objects of a database this turnsafe creates.
fn new_graph_objects() -> Vec<Vec<Sql>> {
    let home = Home::new();
    let store = home.store();
    assert!(store.is_open());
    assert_eq!(version(&home), SCHEMA_VERSION);
    drop(store);
    graph_objects(&home)
}

/// Store a checkpoint and one write through the flush machine, and read
/// them back as LangGraph asks for a thread.
fn put_and_read_back(home: &Home, thread: &str) {
    common::graph::put_and_read_back(&mut home.store(), thread);
    assert_eq!(count(home, "checkpoints"), 1);
    assert_eq!(count(home, "checkpoint_writes"), 1);
    // Nothing was diverted: both went to the database.
    assert!(!home.divert_file(&turnsafe_host::ids::thread_session(thread)).exists());
}

#[test]
fn opening_migrates_to_v6_and_keeps_every_row_archived_row_and_record() {
    let home = home_with(FIXTURE);
    assert_eq!(version(&home), 5);
    assert!(graph_objects(&home).is_empty());
    let before = stored(&home);
    let sessions_before = dump(&home.other(), "SELECT * FROM sessions ORDER BY id");
    assert_eq!((before.0.len(), before.1.len(), before.2.len()), (9, 7, 2));
    let reasons: Vec<(String, String)> = home
        .other()
        .prepare("SELECT uid, reason FROM archive ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        reasons
            .iter()
            .map(|(u, r)| (u.as_str(), r.as_str()))
            .collect::<Vec<_>>(),
        [
            ("u5", "pop"),
            ("v1", "pop"),
            ("hermes:1", "compaction"),
            ("hermes:2", "compaction"),
            ("hermes:3", "compaction"),
            ("hermes:6", "rewind"),
            ("hermes:7", "rewind"),
        ]
    );
    let origins: Vec<(String, String)> = home
        .other()
        .prepare("SELECT origin, origin_id FROM session_meta ORDER BY session_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        origins,
        [
            ("hermes".to_string(), "20260101_090000_a1b2c3".to_string()),
            ("hermes".to_string(), "user 42/ü".to_string()),
        ]
    );
    let watermark = meta(&home, "fts_watermark");

    let store = home.store();
    assert!(store.is_open());
    const { assert!(SCHEMA_VERSION >= 6) };
    assert_eq!(version(&home), SCHEMA_VERSION);
    assert_eq!(meta(&home, "schema_version"), Some(SCHEMA_VERSION.to_string()));
    assert_eq!(stored(&home), before);
    assert_eq!(
        dump(&home.other(), "SELECT * FROM sessions ORDER BY id"),
        sessions_before
    );
    assert_eq!(meta(&home, "fts_watermark"), watermark);
    // The tables a new database gets, empty.
    let objects = graph_objects(&home);
    assert_eq!(objects, new_graph_objects());
    let names: Vec<&Sql> = objects.iter().map(|o| &o[1]).collect();
    for name in ["checkpoints", "checkpoint_writes", "checkpoints_by_run"] {
        assert!(names.contains(&&Sql::Text(name.into())), "{name} in {objects:?}");
    }
    assert_eq!(count(&home, "checkpoints"), 0);
    assert_eq!(count(&home, "checkpoint_writes"), 0);
    drop(store);

    // LangGraph's state is stored beside the migrated rows, which stay.
    put_and_read_back(&home, "thread 1");
    assert_eq!(stored(&home), before);
    assert_eq!(version(&home), SCHEMA_VERSION);
}

#[test]
fn every_earlier_fixture_migrates_to_the_current_version_with_the_langgraph_tables() {
    let new = new_graph_objects();
    assert_eq!(new.len(), 3, "two tables and checkpoints_by_run: {new:?}");
    let fixtures: [(&str, &[u8], i64, i64); 5] = [
        (
            "v1-index-complete.db",
            include_bytes!("fixtures/v1-index-complete.db"),
            1,
            14,
        ),
        (
            "v1-index-degraded.db",
            include_bytes!("fixtures/v1-index-degraded.db"),
            1,
            12,
        ),
        ("state-v2.db", include_bytes!("fixtures/state-v2.db"), 2, 6),
        ("state-v3.db", include_bytes!("fixtures/state-v3.db"), 3, 6),
        ("state-v4.db", include_bytes!("fixtures/state-v4.db"), 4, 4),
    ];
    for (name, bytes, was, messages) in fixtures {
        let home = home_with(bytes);
        assert_eq!(version(&home), was, "{name}");
        assert!(graph_objects(&home).is_empty(), "{name}");
        assert_eq!(count(&home, "messages"), messages, "{name}");
        let store = home.store();
        assert!(store.is_open(), "{name}");
        drop(store);
        assert_eq!(version(&home), SCHEMA_VERSION, "{name}");
        assert_eq!(
            meta(&home, "schema_version"),
            Some(SCHEMA_VERSION.to_string()),
            "{name}"
        );
        assert_eq!(graph_objects(&home), new, "{name}");
        assert_eq!(count(&home, "messages"), messages, "{name}");
        // Every table of the versions in between is there too.
        assert_eq!(count(&home, "session_meta"), 0, "{name}");
        let archived = if was == 4 { 2 } else { 0 };
        assert_eq!(count(&home, "archive"), archived, "{name}");
        put_and_read_back(&home, "t");
    }
}
