//! PostgreSQL with every connection slot of the writer's role taken
//! (`max_connections` small, other clients holding the rest): a new
//! connection is refused with SQLSTATE 53300, `unavailable`. The writer
//! retries within the policy's patience: slots freed meanwhile, the batch
//! is stored; held past it, the batch is diverted with a receipt.
mod common;
use common::pg_limits::{Slots, hold_slots, start_with_few_slots};
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::Cause;

const ROLE: &str = "turnsafe_writer";
const ROLE_PW: &str = "writer-pw";

/// End the writer's backend, so its next batch needs a new connection.
fn end_writer(server: &pg::PgServer, db: &str) {
    server
        .admin("postgres")
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1 AND datname = $2",
            &[&ROLE, &db],
        )
        .unwrap();
}

#[test]
fn refused_connections_are_unavailable_waited_for_then_diverted() {
    let server = turnsafe_tests::require!(start_with_few_slots(6, 2));
    let db = server.create_db("slots_store");
    server.create_role(ROLE, ROLE_PW);
    server.grant_create(&db, ROLE);
    let home = Home::new();
    let mut store = pg::store(&server.url_as(ROLE, ROLE_PW, &db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 1)).persisted);

    // Slots taken, then freed within the patience.
    end_writer(&server, &db);
    let held = hold_slots(&server, &db, Slots::NonSuperuser).expect("hold the slots");
    assert_eq!(held.role_refused.code, "53300");
    let waited = std::thread::scope(|scope| {
        scope.spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(800));
            held.release().expect("release");
        });
        store.append_batch(&sid("s1"), &batch("b", 2))
    });
    assert!(waited.persisted, "{}", waited.to_value());
    assert_eq!(waited.cause, Some(Cause::Unavailable), "{}", waited.to_value());
    assert_eq!(
        waited.failure.as_ref().and_then(|f| f.sqlstate.as_deref()),
        Some("53300")
    );

    // Held past the patience: diverted.
    end_writer(&server, &db);
    let held = hold_slots(&server, &db, Slots::NonSuperuser).expect("hold the slots");
    let gone = store.append_batch(&sid("s1"), &batch("c", 2));
    held.release().expect("release");
    assert!(!gone.persisted, "{}", gone.to_value());
    assert_eq!(gone.cause, Some(Cause::Unavailable), "{}", gone.to_value());
    assert_eq!((gone.diverted, gone.handed_back), (2, 0));
    assert_eq!(receipt_lines(gone.receipt.as_ref().expect("a receipt")).len(), 2);
    let uids: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(uids, ["a-0", "b-0", "b-1"]);
}
