//! PostgreSQL: one rule for every read on a sticky handle. The database
//! at the URL is dropped and created again under a live writer, which
//! finds it `replaced` and turns sticky (as `pg_database_replaced.rs`
//! shows). From then on every read through the handle refuses with the
//! error `rows` gives, and connects to nothing: the archive, the
//! transcript, search, `stored_uids`, LangGraph's checkpoints and the
//! identity never read the new database as if it were the one the
//! handle wrote to. Connections are counted by a loopback proxy, outside
//! the code under test.
mod common;
use common::pg_proxy::PgProxy;
use common::*;
use std::time::Duration;
use turnsafe_host::backend::History;
use turnsafe_host::backend::{Backend, BackendError, ReadError};
use turnsafe_host::graph::GraphQuery;
use turnsafe_policy::Cause;

/// Connections the proxy has accepted, read once a connection already
/// made has had time to be accepted (the listener polls every 100 ms).
fn connections(proxy: &PgProxy) -> usize {
    std::thread::sleep(Duration::from_millis(300));
    proxy.accepted()
}

#[test]
fn after_the_database_was_replaced_every_read_refuses_and_connects_to_nothing() {
    let server = pg_or_skip!();
    let db = server.create_db("sticky_reads");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("ok", 3)).persisted);
    assert!(store.pop_last(&sid("s1")).expect("pop").is_some());
    assert_eq!(store.archived("s1", None).expect("archived").len(), 1);
    assert_eq!(store.transcript("s1").expect("transcript").len(), 2);

    let mut admin = server.admin("postgres");
    admin
        .batch_execute(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .unwrap();
    admin.batch_execute(&format!("CREATE DATABASE \"{db}\"")).unwrap();
    let out = store.append_batch(&sid("s1"), &batch("hit", 2));
    assert_eq!(out.cause, Some(Cause::Replaced), "{}", out.to_value());
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    let sticky_at = connections(&proxy);

    let want: ReadError = store.rows("s1", None).expect_err("rows refuses on a sticky handle");
    assert_eq!(want.cause, Some(Cause::Replaced), "{want:?}");
    let mut wrong = Vec::new();
    let mut read = |what: &str, got: Result<String, ReadError>| match got {
        Err(e) if e.message == want.message && e.cause == want.cause => {}
        other => wrong.push(format!("{what}: {other:?}")),
    };
    let backend = |got: Result<String, BackendError>| match got {
        Err(BackendError::Refused(e)) => Err(e),
        Err(other) => Ok(format!("{other:?}")),
        Ok(v) => Ok(v),
    };
    read("archived", store.archived("s1", None).map(|r| format!("{r:?}")));
    read("transcript", backend(store.transcript("s1").map(|r| format!("{r:?}"))));
    read(
        "search",
        backend(store.search("lorem", None, 10, true).map(|r| format!("{:?}", r.hits))),
    );
    read(
        "stored_uids",
        backend(store.stored_uids("s1", &["ok-0".into()]).map(|r| format!("{r:?}"))),
    );
    read("identity", backend(store.identity().map(|r| format!("{r:?}"))));
    read(
        "graph_read",
        store.graph_read(&GraphQuery::default()).map(|r| format!("{r:?}")),
    );
    if let Some(lineage) = store.lineage("s1") {
        wrong.push(format!("lineage: {lineage:?}"));
    }
    assert!(
        wrong.is_empty(),
        "on a sticky handle these reads did not refuse as rows does ({}):\n{}",
        want.message,
        wrong.join("\n")
    );
    assert_eq!(
        connections(&proxy),
        sticky_at,
        "a read on the sticky handle connected to the new database"
    );
}
