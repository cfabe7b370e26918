//! PostgreSQL: the connection dies around COMMIT, for real, through a
//! loopback proxy between the writer and the server (`common::pg_proxy`);
//! the `postgres` crate has no hook between sending COMMIT and reading its
//! answer, so the proxy is the honest way.
//!
//! - Cut just after COMMIT reached the server: the server committed, the
//!   writer saw a closed connection with COMMIT sent: `outcome_unknown`.
//!   It connects again and looks the batch's uids up: all stored, so the
//!   batch is persisted, stored once.
//! - Cut just before COMMIT reached the server: the writer cannot tell it
//!   from the above (it wrote COMMIT and the connection closed), so it is
//!   `outcome_unknown` too; the lookup finds nothing stored and the batch
//!   is written again, once.
//! - The connection killed before COMMIT was sent (the server ends the
//!   backend between two batches): `unavailable`, a new connection, and
//!   the batch is stored.
//! - The server unreachable for a while (the proxy refuses connections):
//!   within the patience the batch waits and is stored; past it the batch
//!   is diverted as `unavailable`, and replay brings it in.
//!
//! Every writer here reaches the server through the proxy, which counts
//! the connections it accepts: "connects again" is observed there, from
//! outside the code under test, not read from the store's own counters.
mod common;
use common::pg_proxy::{Mode, PgProxy};
use common::*;
use std::time::Duration;
use turnsafe_host::backend::Backend;
use turnsafe_host::replay::ReplayOptions;
use turnsafe_policy::{ActionKind, Cause};

/// Connections the proxy has accepted, read once a connection already
/// made has had time to be accepted (the listener polls every 100 ms).
fn connections(proxy: &PgProxy) -> usize {
    std::thread::sleep(Duration::from_millis(300));
    proxy.accepted()
}

fn uids(server: &pg::PgServer, db: &str, session: &str) -> Vec<String> {
    pg::rows(server, db, session).into_iter().map(|r| r.0).collect()
}

#[test]
fn a_commit_cut_after_the_server_took_it_is_found_stored() {
    let server = pg_or_skip!();
    let db = server.create_db("cut_after");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);

    let before = connections(&proxy);
    proxy.once(Mode::DropAfterCommit);
    let out = store.append_batch(&sid("s1"), &batch("b", 3));
    assert_eq!(proxy.cuts_after_commit(), 1, "the cut happened after COMMIT");
    assert_eq!(
        connections(&proxy) - before,
        1,
        "one new connection, to look the uids up"
    );
    assert!(out.persisted, "{}", out.to_value());
    assert_eq!(out.cause, Some(Cause::OutcomeUnknown), "{}", out.to_value());
    assert_eq!(out.action, Some(ActionKind::Resolve));
    assert_eq!((out.committed, out.diverted, out.handed_back), (3, 0, 0));
    let copy = out.copy.as_ref().expect("copy");
    assert_eq!(copy.code, "outcome_unknown.persisted");
    assert!(!home.divert_file("s1").exists(), "nothing was diverted");
    assert_eq!(uids(&server, &db, "s1"), ["a-0", "a-1", "b-0", "b-1", "b-2"]);
    // The writer carries on.
    assert!(store.append_batch(&sid("s1"), &batch("c", 1)).persisted);
    assert_eq!(uids(&server, &db, "s1").len(), 6);
}

#[test]
fn a_commit_cut_before_the_server_took_it_is_written_again_once() {
    let server = pg_or_skip!();
    let db = server.create_db("cut_before");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);

    let before = connections(&proxy);
    proxy.once(Mode::DropBeforeCommit);
    let attempts_before = store.counters().append_attempts;
    let out = store.append_batch(&sid("s1"), &batch("b", 3));
    assert_eq!(proxy.cuts_before_commit(), 1, "the cut happened before COMMIT");
    assert_eq!(
        connections(&proxy) - before,
        1,
        "one new connection, to look the uids up and write again"
    );
    assert!(out.persisted, "{}", out.to_value());
    assert_eq!(out.cause, Some(Cause::OutcomeUnknown), "{}", out.to_value());
    assert_eq!(
        store.counters().append_attempts - attempts_before,
        2,
        "the lookup found nothing, so the batch was written once more"
    );
    assert_eq!(uids(&server, &db, "s1"), ["a-0", "a-1", "b-0", "b-1", "b-2"]);
}

#[test]
fn a_connection_lost_before_commit_is_unavailable_and_retried() {
    let server = pg_or_skip!();
    let db = server.create_db("lost_before");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);

    // The server ends the writer's backend: its next statement fails
    // before any COMMIT is sent.
    let ended: i64 = server
        .admin(&db)
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()) t",
            &[&db],
        )
        .unwrap()
        .get(0);
    assert!(ended >= 1);
    let before = connections(&proxy);
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    assert!(out.persisted, "{}", out.to_value());
    assert_eq!(out.cause, Some(Cause::Unavailable), "{}", out.to_value());
    assert_eq!(out.action, Some(ActionKind::Retry));
    assert_eq!(
        out.copy.as_ref().map(|c| c.code.as_str()),
        Some("unavailable.persisted")
    );
    assert_eq!(
        connections(&proxy) - before,
        1,
        "one new connection was made (seen by the proxy), and the batch stored on it"
    );
    assert_eq!(uids(&server, &db, "s1"), ["a-0", "a-1", "b-0", "b-1"]);
}

#[test]
fn an_unreachable_server_is_waited_for_within_the_patience_then_diverted() {
    let server = pg_or_skip!();
    let db = server.create_db("unreachable");
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let url = proxy.url(&db);
    let home = Home::new();
    let mut store = pg::store(&url, home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);

    // Unreachable for a second: the writer's connection is cut at its next
    // statement and new ones are refused; then the server is back.
    proxy.set_mode(Mode::Refuse);
    server
        .admin(&db)
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ))
        .unwrap();
    let waited = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(1000));
            proxy.set_mode(Mode::Pass);
        });
        store.append_batch(&sid("s1"), &batch("b", 2))
    });
    assert!(waited.persisted, "{}", waited.to_value());
    assert_eq!(waited.cause, Some(Cause::Unavailable), "{}", waited.to_value());
    assert!(proxy.refused() > 0, "connections were refused meanwhile");

    // Unreachable past the patience: diverted, named `unavailable`.
    proxy.set_mode(Mode::Refuse);
    server
        .admin(&db)
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ))
        .unwrap();
    let gone = store.append_batch(&sid("s1"), &batch("c", 2));
    assert!(!gone.persisted, "{}", gone.to_value());
    assert_eq!(gone.cause, Some(Cause::Unavailable), "{}", gone.to_value());
    assert_eq!((gone.diverted, gone.handed_back), (2, 0));
    let receipt = gone.receipt.as_ref().expect("a receipt");
    assert_eq!(receipt_lines(receipt).len(), 2);
    assert_eq!(
        gone.copy.as_ref().map(|c| c.code.as_str()),
        Some("unavailable.diverted")
    );

    proxy.set_mode(Mode::Pass);
    drop(store);
    let parsed: turnsafe_host::pg::DbUrl = server.url(&db).parse().expect("url");
    let run = turnsafe_host::pg::replay::replay(
        home.path(),
        &parsed,
        &ReplayOptions {
            force: true,
            ..Default::default()
        },
    )
    .expect("replay");
    assert_eq!(run.files.iter().map(|f| f.replayed).sum::<u64>(), 2);
    assert_eq!(uids(&server, &db, "s1"), ["a-0", "b-0", "b-1", "c-0", "c-1"]);
}
