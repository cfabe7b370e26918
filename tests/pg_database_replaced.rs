//! PostgreSQL: the database at the URL is dropped and created again under
//! a live writer (as a failover to a fresh server would look). The batch
//! in flight loses its connection (`unavailable`, so it connects again
//! within the policy's patience) and the new connection finds a database
//! of another generation: `replaced`, sticky, and the batch is diverted.
//! It never writes a split transcript into the new database: every later
//! batch is diverted without touching it, until an operator acts.
//!
//! The writer reaches the server through a loopback proxy
//! (`common::pg_proxy`) that counts the connections it accepts: "connects
//! again" and "never connects again" are observed there, from outside the
//! code under test, not read from the store's own counters.
mod common;
use common::pg_proxy::PgProxy;
use common::*;
use std::time::Duration;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{Cause, Operation};

/// A PostgreSQL outcome's copy names no SQLite command or file: its
/// store keeps no generation on this host to capture or recover.
fn assert_postgres_copy(outcome: &serde_json::Value) {
    let copy = outcome["copy"].to_string();
    assert!(outcome["copy"].is_object(), "{outcome}");
    for sqlite_only in ["turnsafe capture", "turnsafe recover", "state.db", "ulimit"] {
        assert!(!copy.contains(sqlite_only), "names `{sqlite_only}`: {copy}");
    }
    assert!(copy.contains("turnsafe replay --db URL"), "{copy}");
}

/// Connections the proxy has accepted, read once a connection already
/// made has had time to be accepted (the listener polls every 100 ms).
fn connections(proxy: &PgProxy) -> usize {
    std::thread::sleep(Duration::from_millis(300));
    proxy.accepted()
}

#[test]
fn another_database_at_the_url_is_replaced() {
    let server = pg_or_skip!();
    let db = server.create_db("replaced");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    assert_eq!(connections(&proxy), 1, "one connection for the first batch");

    let mut admin = server.admin("postgres");
    admin
        .batch_execute(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .unwrap();
    admin.batch_execute(&format!("CREATE DATABASE \"{db}\"")).unwrap();

    let b = store.append_batch(&sid("s1"), &batch("b", 2));
    assert!(!b.persisted, "{}", b.to_value());
    assert_eq!(
        (b.operation, b.cause),
        (Some(Operation::Open), Some(Cause::Replaced)),
        "the connection was terminated, and the new one found another database: {}",
        b.to_value()
    );
    assert_eq!(b.diverted, 2);
    assert!(b.receipt.is_some());
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    let sticky_at = connections(&proxy);
    assert_eq!(
        sticky_at, 2,
        "the batch connected again once, and that connection found the new database"
    );

    let c = store.append_batch(&sid("s1"), &batch("c", 2));
    assert!(!c.persisted);
    assert_eq!(c.cause, Some(Cause::Replaced), "{}", c.to_value());
    assert_eq!(c.diverted, 2);

    let d = store.append_batch(&sid("s1"), &batch("d", 2));
    assert!(!d.persisted);
    assert_eq!(d.cause, Some(Cause::Replaced));
    assert_eq!(d.diverted, 2);
    assert_eq!(
        connections(&proxy),
        sticky_at,
        "a sticky handle never connects again (connections seen by the proxy)"
    );
    let n: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM messages", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing was written into the new database");
    assert_eq!(receipt_lines(d.receipt.as_ref().unwrap()).len(), 2);
    // The sticky handle's later batches are told as PostgreSQL's too.
    for outcome in [&b, &c, &d] {
        assert_postgres_copy(&outcome.to_value());
    }
}

/// The tables are dropped and made again (a restore with `--clean`, say)
/// while the writer's connection stays up: the write itself finds another
/// generation under the session lock, `replaced`. There is no local
/// generation to capture, and the outcome says so rather than claim one.
#[test]
fn a_database_rebuilt_under_a_live_connection_is_replaced() {
    let server = pg_or_skip!();
    let db = server.create_db("rebuilt");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);

    server
        .admin(&db)
        .batch_execute("DROP TABLE messages_search, messages, sessions, state_meta CASCADE")
        .unwrap();
    let other = Home::new();
    let mut second = pg::store(&server.url(&db), other.path());
    assert!(second.append_batch(&sid("s9"), &batch("z", 1)).persisted);

    let b = store.append_batch(&sid("s1"), &batch("b", 2));
    assert!(!b.persisted, "{}", b.to_value());
    assert_eq!(b.operation, Some(Operation::AppendBatch));
    assert_eq!(b.cause, Some(Cause::Replaced), "{}", b.to_value());
    assert_eq!(b.diverted, 2);
    let capture = b.capture.as_ref().expect("a capture was asked for");
    assert!(capture.is_err(), "no generation is claimed as captured");
    let v = b.to_value();
    assert!(
        v["capture"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("no generation")),
        "{v}"
    );
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    assert_postgres_copy(&v);
    let n: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM messages WHERE session_id = 's1'", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing of s1 was written into the rebuilt database");
}
