//! PostgreSQL: a read that finds the handle's connection dropped connects
//! again the one way a writer does, because the next batch writes on that
//! same connection. Its session gets the writer's `lock_timeout`, the
//! durability is read again (`synchronous_commit`), the generation is
//! compared and the identity guard runs:
//!
//! - the backend terminated (`pg_terminate_backend` from a second
//!   connection), a LangGraph read (`get_tuple`'s) connects again: the
//!   server says `lock_timeout` is 50ms on that session, and the next
//!   batch, written on it, is not claimed durable once the database's
//!   `synchronous_commit` is `off`;
//! - the backend terminated and the server restored from an older backup
//!   before the read: the read is refused as `replaced`, and so is the
//!   next batch, diverted, sticky; nothing is read from or written into
//!   the older copy;
//! - the database dropped and created again under the handle: the read is
//!   refused as `replaced` instead of reading the new, empty database.
mod common;
use common::graph::checkpoint;
use common::*;
use pg::Recovery;
use turnsafe_host::backend::History;
use turnsafe_host::backend::{Backend, ReadError};
use turnsafe_host::graph::{GraphBatch, GraphQuery};
use turnsafe_policy::{Cause, Durability, Operation};

/// A read right after the connection was dropped: its first attempt may
/// meet the dead connection (`unavailable`), and the next connects again.
fn read_again<T>(mut read: impl FnMut() -> Result<T, ReadError>) -> Result<T, ReadError> {
    match read() {
        Err(e) if e.cause == Some(Cause::Unavailable) => read(),
        other => other,
    }
}

fn thread(id: &str) -> GraphQuery {
    GraphQuery {
        thread_id: Some(id.into()),
        ..GraphQuery::default()
    }
}

/// The backend behind the store's own connection.
fn backend_pid(store: &mut turnsafe_host::pg::PgStore) -> i32 {
    store
        .backend()
        .client()
        .expect("a connection")
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pg_backend_pid")
        .get(0)
}

/// End the store's backend from a second connection.
fn terminate(server: &pg::PgServer, db: &str, pid: i32) {
    let ended: bool = server
        .admin(db)
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(ended, "backend {pid} terminated");
}

#[test]
fn a_read_after_a_dropped_connection_connects_as_a_writer_does() {
    let server = pg_or_skip!();
    let db = server.create_db("read_reconnects");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    let cp = checkpoint("t1", "1ef1");
    let first = store.put_graph(&GraphBatch::Checkpoint(cp.clone()));
    assert!(first.persisted && first.durable, "{}", first.to_value());
    let shown: String = store
        .backend()
        .client()
        .unwrap()
        .query_one("SHOW lock_timeout", &[])
        .unwrap()
        .get(0);
    assert_eq!(shown, "50ms", "the writer's connection");

    // New sessions of the database return from COMMIT before the WAL flush.
    server
        .admin("postgres")
        .batch_execute(&format!("ALTER DATABASE \"{db}\" SET synchronous_commit = off"))
        .unwrap();
    let old = backend_pid(&mut store);
    terminate(&server, &db, old);

    let read = read_again(|| store.graph_read(&thread("t1"))).expect("the read connects again");
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].record, cp);
    let new = backend_pid(&mut store);
    assert_ne!(new, old, "a new connection");
    let shown: String = store
        .backend()
        .client()
        .unwrap()
        .query_one("SHOW lock_timeout", &[])
        .unwrap()
        .get(0);
    assert_eq!(shown, "50ms", "the session the read made has the writer's lock_timeout");
    assert_eq!(
        store.durability(),
        Durability::Unsynced,
        "the read's connection read synchronous_commit"
    );

    let next = store.put_graph(&GraphBatch::Checkpoint(checkpoint("t1", "1ef2")));
    assert!(next.persisted, "{}", next.to_value());
    assert!(
        !next.durable,
        "committed with synchronous_commit off is not claimed durable: {}",
        next.to_value()
    );
    assert_eq!(
        backend_pid(&mut store),
        new,
        "the batch was written on the read's connection"
    );
}

#[test]
fn a_read_reconnecting_to_a_restored_server_is_refused() {
    let mut server = pg_or_skip!();
    let db = server.create_db("read_restored");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let backup = server.base_backup("older").expect("base backup");
    let b = store.append_batch(&sid("s1"), &batch("b", 2));
    assert!(b.persisted, "acknowledged after the backup: {}", b.to_value());

    let pid = backend_pid(&mut store);
    terminate(&server, &db, pid);
    server.restore_base_backup(&backup, Recovery::Crash).expect("restore");
    let older: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(older, ["a-0", "a-1"], "the restored server lacks batch b");

    let read = read_again(|| store.rows("s1", None));
    let refused = read.expect_err("the read does not answer from the older copy");
    assert_eq!(refused.cause, Some(Cause::Replaced), "{refused}");
    assert!(refused.message.contains("lacks 2 of the 2 messages"), "{refused}");

    let c = store.append_batch(&sid("s1"), &batch("c", 2));
    assert!(!c.persisted, "{}", c.to_value());
    assert_eq!(
        (c.operation, c.cause),
        (Some(Operation::Open), Some(Cause::Replaced)),
        "{}",
        c.to_value()
    );
    assert_eq!((c.diverted, c.handed_back), (2, 0));
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    let graph = store
        .graph_read(&thread("t1"))
        .expect_err("a sticky handle refuses reads");
    assert_eq!(graph.cause, Some(Cause::Replaced));
    let after: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(after, ["a-0", "a-1"], "nothing was written into the older copy");
}

#[test]
fn a_read_reconnecting_to_another_database_is_refused() {
    let server = pg_or_skip!();
    let db = server.create_db("read_replaced");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(
        store
            .put_graph(&GraphBatch::Checkpoint(checkpoint("t1", "1ef1")))
            .persisted
    );

    let mut admin = server.admin("postgres");
    admin
        .batch_execute(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .unwrap();
    admin.batch_execute(&format!("CREATE DATABASE \"{db}\"")).unwrap();

    let read = read_again(|| store.graph_read(&thread("t1")));
    let refused = read.expect_err("the read does not answer from another database");
    assert_eq!(refused.cause, Some(Cause::Replaced), "{refused}");
    let next = store.put_graph(&GraphBatch::Checkpoint(checkpoint("t1", "1ef2")));
    assert_eq!(
        (next.operation, next.cause, next.diverted),
        (Some(Operation::Open), Some(Cause::Replaced), 1),
        "{}",
        next.to_value()
    );
}
