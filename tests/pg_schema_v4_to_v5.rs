//! A PostgreSQL database written by the schema v4 code
//! (`tests/fixtures/pg-v4.sql`: messages, archived rows, a searched
//! index, and a LangGraph thread's checkpoints and writes) gains
//! `session_meta` (v5) at the first open, every other row as it was; the
//! v1, v2 and v3 fixtures reach the current version with the same table.
mod common;
use common::*;
use pg::{dump, schema_version as version};
use turnsafe_host::backend::Backend;
use turnsafe_host::pg::schema::VERSION;

const FIXTURE: &str = include_str!("fixtures/pg-v4.sql");

/// Every table this schema version keeps rows in, dumped.
fn dump_all(server: &pg::PgServer, db: &str) -> Vec<Vec<String>> {
    [
        ("messages", "id"),
        ("archive", "id"),
        ("sessions", "id"),
        ("messages_search", "message_id"),
        ("checkpoints", "thread_id, checkpoint_ns, checkpoint_id"),
        (
            "checkpoint_writes",
            "thread_id, checkpoint_ns, checkpoint_id, task_id, idx",
        ),
    ]
    .into_iter()
    .map(|(t, o)| dump(server, db, t, o))
    .collect()
}

/// `session_meta`'s columns (name, type, nullability) and indexes, as the
/// catalog has them; empty when there is no such table.
fn meta_schema(server: &pg::PgServer, db: &str) -> Vec<String> {
    let mut c = server.admin(db);
    let mut out: Vec<String> = c
        .query(
            "SELECT column_name || ' ' || data_type || ' ' || is_nullable FROM information_schema.columns \
              WHERE table_schema = current_schema() AND table_name = 'session_meta' ORDER BY ordinal_position",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    out.extend(
        c.query(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'session_meta' \
              ORDER BY indexname",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| r.get::<_, String>(0)),
    );
    out
}

/// `session_meta` as this turnsafe creates it.
fn new_meta_schema(server: &pg::PgServer) -> Vec<String> {
    let db = server.create_db("pgnewmeta");
    let home = Home::new();
    let store = pg::store(&server.url(&db), home.path());
    assert!(store.is_open());
    drop(store);
    assert_eq!(version(server, &db), VERSION.to_string());
    meta_schema(server, &db)
}

#[test]
fn a_version_4_database_gains_session_meta_and_keeps_every_row() {
    let server = pg_or_skip!();
    let db = server.create_db("pgv4");
    server.admin(&db).batch_execute(FIXTURE).unwrap();
    assert_eq!(version(&server, &db), "4");
    assert!(meta_schema(&server, &db).is_empty());
    let before = dump_all(&server, &db);
    assert_eq!(
        before.iter().map(Vec::len).collect::<Vec<_>>(),
        [4, 2, 2, 4, 3, 3],
        "the fixture's rows"
    );

    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.is_open());
    const { assert!(VERSION >= 5) };
    assert_eq!(version(&server, &db), VERSION.to_string());
    assert_eq!(dump_all(&server, &db), before);
    let schema = meta_schema(&server, &db);
    assert!(
        schema.iter().any(|c| c == "meta text NO") && schema.iter().any(|c| c.contains("session_meta_pkey")),
        "{schema:#?}"
    );
    assert_eq!(schema, new_meta_schema(&server));

    // The history reads and writes on as before.
    let archived = store.archived("s1", None).unwrap();
    assert_eq!(
        archived
            .iter()
            .map(|a| (a.uid.as_str(), a.reason.as_str()))
            .collect::<Vec<_>>(),
        [("u5", "pop")]
    );
    assert!(store.append_batch(&sid("s1"), &batch("new", 1)).persisted);
    assert_eq!(pg::rows(&server, &db, "s1").last().unwrap().0, "new-0");
    common::graph::put_and_read_back(&mut store, "another thread");
    assert_eq!(dump(&server, &db, "archive", "id"), before[1]);
}

#[test]
fn version_1_to_3_databases_reach_the_current_version_with_session_meta() {
    let server = pg_or_skip!();
    let new = new_meta_schema(&server);
    for (name, sql, was) in [
        ("pgv1", include_str!("fixtures/pg-v1.sql"), "1"),
        ("pgv2", include_str!("fixtures/pg-v2.sql"), "2"),
        ("pgv3", include_str!("fixtures/pg-v3.sql"), "3"),
    ] {
        let db = server.create_db(name);
        server.admin(&db).batch_execute(sql).unwrap();
        assert_eq!(version(&server, &db), was, "{name}");
        assert!(meta_schema(&server, &db).is_empty(), "{name}");
        let home = Home::new();
        let store = pg::store(&server.url(&db), home.path());
        assert!(store.is_open(), "{name}");
        assert_eq!(version(&server, &db), VERSION.to_string(), "{name}");
        assert_eq!(meta_schema(&server, &db), new, "{name}");
    }
}
