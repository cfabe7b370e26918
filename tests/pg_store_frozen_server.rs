//! A PostgreSQL server that accepts connections and never answers: its
//! postmaster stopped with SIGSTOP, as a frozen host or a connection pooler
//! waiting for a server it cannot reach would be. The kernel still accepts
//! the TCP connection, and the client library bounds only that connect, so
//! without a bound of its own a writer would wait forever in the startup.
//!
//! The writer gives the connection up after `connect_timeout` (08001,
//! `unavailable`), tries again within the policy's patience, and diverts
//! the batch past it with a receipt; a server that wakes within the
//! patience gets the batch.
mod common;
use std::time::{Duration, Instant};

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::Cause;

/// The postmaster stopped (SIGSTOP) until this is dropped (SIGCONT), so a
/// failing assertion never leaves a server that cannot be shut down.
struct Frozen(i32);

impl Frozen {
    fn postmaster(server: &pg::PgServer) -> Frozen {
        let pid = server.postmaster_pid().expect("postmaster pid");
        // SAFETY: signalling a child process this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// End the writer's backend, so its next batch needs a new connection.
fn end_backends(server: &pg::PgServer, db: &str) {
    server
        .admin("postgres")
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db],
        )
        .expect("terminate the writer's backend");
}

#[test]
fn a_server_that_accepts_and_never_answers_is_unavailable_not_a_hang() {
    let server = turnsafe_tests::require!(pg::PgServer::start());
    let db = server.create_db("frozen_store");
    let url = format!("{}&connect_timeout=1", server.url(&db));
    let home = Home::new();
    let mut store = pg::store(&url, home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);

    // Frozen past the patience: every connection stalls after the TCP
    // accept; the batch is diverted, and the flush ends.
    end_backends(&server, &db);
    let frozen = Frozen::postmaster(&server);
    let t = Instant::now();
    let gone = store.append_batch(&sid("s1"), &batch("b", 2));
    let took = t.elapsed();
    drop(frozen);
    assert!(!gone.persisted, "{}", gone.to_value());
    assert_eq!(gone.cause, Some(Cause::Unavailable), "{}", gone.to_value());
    let failure = gone.failure.as_ref().expect("the last failure");
    assert_eq!(failure.sqlstate.as_deref(), Some("08001"), "{}", gone.to_value());
    assert!(
        failure.message.contains("did not complete the startup"),
        "{}",
        failure.message
    );
    assert_eq!((gone.diverted, gone.handed_back), (2, 0));
    assert_eq!(receipt_lines(gone.receipt.as_ref().expect("a receipt")).len(), 2);
    assert!(gone.attempts >= 2, "retried within the patience: {}", gone.to_value());
    assert!(took < Duration::from_secs(30), "the flush took {took:?}");

    // Frozen for less than the patience: the batch waits and is stored.
    end_backends(&server, &db);
    let frozen = Frozen::postmaster(&server);
    let waited = std::thread::scope(|scope| {
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            drop(frozen);
        });
        store.append_batch(&sid("s1"), &batch("c", 2))
    });
    assert!(waited.persisted, "{}", waited.to_value());
    assert_eq!(waited.cause, Some(Cause::Unavailable), "{}", waited.to_value());
    let uids: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(uids, ["a-0", "c-0", "c-1"]);
}
