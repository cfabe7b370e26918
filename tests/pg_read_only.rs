//! PostgreSQL: the server turns `default_transaction_read_only` on under a
//! live writer (ALTER SYSTEM and a reload), as a primary turned standby
//! looks. The next insert fails with SQLSTATE 25006, `read_only`: the
//! writer connects again and retries within the policy's patience, as it
//! would while a failover completes; past it the batch is diverted with a
//! receipt, and nothing reaches the server. Once writes are allowed again,
//! the writer carries on.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{ActionKind, Cause, Operation};

#[test]
fn a_read_only_server_diverts_the_batch() {
    let server = pg_or_skip!();
    let db = server.create_db("readonly");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);

    let mut admin = server.admin("postgres");
    admin
        .batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    // The reload reaches every backend at its next command; wait until a
    // fresh session sees it.
    wait_for_setting(&server, &db, "on");

    let out = store.append_batch(&sid("s1"), &batch("b", 4));
    assert!(!out.persisted, "{}", out.to_value());
    assert_eq!(out.operation, Some(Operation::AppendBatch));
    assert_eq!(out.cause, Some(Cause::ReadOnly), "{}", out.to_value());
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 4, 0));
    assert_eq!(out.error.as_deref(), Some("session_persistence_failed:read_only"));
    let receipt = out.receipt.as_ref().expect("a receipt");
    assert_eq!(receipt.path, home.divert_file("s1").to_string_lossy());
    let lines = receipt_lines(receipt);
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["uid"], "b-0");
    assert_eq!(lines[0]["seq"], 3, "the divert keeps the transcript position");
    let copy = out.copy.as_ref().expect("copy");
    assert_eq!(copy.code, "read_only.diverted");
    assert!(copy.body.contains(&receipt.path));
    assert_eq!(
        pg::rows(&server, &db, "s1").len(),
        2,
        "nothing of the batch reached the server"
    );
    let c = store.counters();
    assert!(
        c.append_attempts > 2 && c.open_attempts > 1,
        "retried on new connections within the patience: {c:?}"
    );

    admin
        .batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for_setting(&server, &db, "off");
    let later = store.append_batch(&sid("s1"), &batch("c", 1));
    assert!(later.persisted, "{}", later.to_value());
    let rows = pg::rows(&server, &db, "s1");
    assert_eq!(
        rows.last().map(|r| (r.0.as_str(), r.1)),
        Some(("c-0", 7)),
        "after the diverted seqs"
    );
}

fn wait_for_setting(server: &pg::PgServer, db: &str, want: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let v: String = server
            .admin(db)
            .query_one("SHOW default_transaction_read_only", &[])
            .unwrap()
            .get(0);
        if v == want {
            // Give live backends the moment they need to process the signal.
            std::thread::sleep(std::time::Duration::from_millis(200));
            return;
        }
        assert!(std::time::Instant::now() < deadline, "setting never became {want}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
