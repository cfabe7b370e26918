//! A PostgreSQL database written by the schema v3 code
//! (`tests/fixtures/pg-v3.sql`, with archived rows) gains LangGraph's
//! `checkpoints` and `checkpoint_writes` (v4) at the first open: every row
//! and every archived row stays as it was, and a checkpoint and its writes
//! can then be stored and read back. The v1 and v2 fixtures reach the
//! current version with the same tables.
mod common;
use common::*;
use pg::{dump, schema_version as version};
use turnsafe_host::backend::Backend;
use turnsafe_host::pg::schema::VERSION;

const FIXTURE: &str = include_str!("fixtures/pg-v3.sql");

fn count(server: &pg::PgServer, db: &str, table: &str) -> i64 {
    server
        .admin(db)
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .unwrap()
        .get(0)
}

/// The LangGraph tables' columns (name, type, nullability, default) and
/// indexes, as the catalog has them; empty when there are none.
fn graph_schema(server: &pg::PgServer, db: &str) -> Vec<String> {
    let mut c = server.admin(db);
    let mut out: Vec<String> = c
        .query(
            "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || COALESCE(column_default, '') \
               FROM information_schema.columns \
              WHERE table_schema = current_schema() AND table_name IN ('checkpoints', 'checkpoint_writes') \
              ORDER BY table_name, ordinal_position",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    out.extend(
        c.query(
            "SELECT indexdef FROM pg_indexes \
              WHERE schemaname = current_schema() AND tablename IN ('checkpoints', 'checkpoint_writes') \
              ORDER BY indexname",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| r.get::<_, String>(0)),
    );
    out
}

/// Store a checkpoint and one write through the flush machine, and read
/// them back as LangGraph asks for a thread.
fn put_and_read_back(store: &mut turnsafe_host::pg::PgStore, server: &pg::PgServer, db: &str, thread: &str) {
    common::graph::put_and_read_back(store, thread);
    assert_eq!(count(server, db, "checkpoints"), 1);
    assert_eq!(count(server, db, "checkpoint_writes"), 1);
}

/// The LangGraph tables of a database this turnsafe creates.
fn new_graph_schema(server: &pg::PgServer) -> Vec<String> {
    let db = server.create_db("pgnew");
    let home = Home::new();
    let store = pg::store(&server.url(&db), home.path());
    assert!(store.is_open());
    drop(store);
    assert_eq!(version(server, &db), VERSION.to_string());
    graph_schema(server, &db)
}

#[test]
fn a_version_3_database_is_migrated_and_keeps_every_row_and_archived_row() {
    let server = pg_or_skip!();
    let db = server.create_db("pgv3");
    server.admin(&db).batch_execute(FIXTURE).unwrap();
    assert_eq!(version(&server, &db), "3");
    assert!(graph_schema(&server, &db).is_empty());
    let before = (
        dump(&server, &db, "messages", "id"),
        dump(&server, &db, "archive", "id"),
        dump(&server, &db, "sessions", "id"),
        dump(&server, &db, "messages_search", "message_id"),
    );
    assert_eq!(
        (before.0.len(), before.1.len(), before.2.len(), before.3.len()),
        (4, 2, 2, 4)
    );
    let s1 = pg::rows(&server, &db, "s1");
    assert_eq!(
        s1.iter().map(|r| (r.0.as_str(), r.1)).take(3).collect::<Vec<_>>(),
        [("u1", 1), ("u2", 2), ("u3", 3)]
    );
    assert!(pg::rows(&server, &db, "s2").is_empty());

    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.is_open());
    const { assert!(VERSION >= 4) };
    assert_eq!(version(&server, &db), VERSION.to_string());
    let after = (
        dump(&server, &db, "messages", "id"),
        dump(&server, &db, "archive", "id"),
        dump(&server, &db, "sessions", "id"),
        dump(&server, &db, "messages_search", "message_id"),
    );
    assert_eq!(after, before);
    let archived = store.archived("s1", None).unwrap();
    assert_eq!(
        archived
            .iter()
            .map(|a| (a.uid.as_str(), a.reason.as_str()))
            .collect::<Vec<_>>(),
        [("u5", "pop")]
    );
    // The tables a new database gets, empty.
    let schema = graph_schema(&server, &db);
    assert!(
        schema.iter().any(|c| c.starts_with("checkpoints.checkpoint bytea NO"))
            && schema.iter().any(|c| c.starts_with("checkpoint_writes.value bytea NO"))
            && schema.iter().any(|c| c.contains("checkpoints_by_run")),
        "{schema:#?}"
    );
    assert_eq!(schema, new_graph_schema(&server));
    assert_eq!(count(&server, &db, "checkpoints"), 0);
    assert_eq!(count(&server, &db, "checkpoint_writes"), 0);

    put_and_read_back(&mut store, &server, &db, "thread 1");
    assert_eq!(dump(&server, &db, "messages", "id"), before.0);
    assert_eq!(dump(&server, &db, "archive", "id"), before.1);
    // Messages are written on as before.
    assert!(store.append_batch(&sid("s1"), &batch("new", 1)).persisted);
    assert_eq!(pg::rows(&server, &db, "s1").last().unwrap().0, "new-0");
}

#[test]
fn version_1_and_2_databases_reach_the_current_version_with_the_langgraph_tables() {
    let server = pg_or_skip!();
    let new = new_graph_schema(&server);
    for (name, sql, was, messages) in [
        ("pgv1", include_str!("fixtures/pg-v1.sql"), "1", 6),
        ("pgv2", include_str!("fixtures/pg-v2.sql"), "2", 6),
    ] {
        let db = server.create_db(name);
        server.admin(&db).batch_execute(sql).unwrap();
        assert_eq!(version(&server, &db), was, "{name}");
        assert!(graph_schema(&server, &db).is_empty(), "{name}");
        let home = Home::new();
        let mut store = pg::store(&server.url(&db), home.path());
        assert!(store.is_open(), "{name}");
        assert_eq!(version(&server, &db), VERSION.to_string(), "{name}");
        assert_eq!(graph_schema(&server, &db), new, "{name}");
        assert_eq!(count(&server, &db, "messages"), messages, "{name}");
        assert_eq!(count(&server, &db, "archive"), 0, "{name}");
        put_and_read_back(&mut store, &server, &db, "t");
    }
}
