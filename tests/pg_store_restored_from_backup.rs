//! PostgreSQL restored from an older base backup under a live writer: the
//! same cluster (`system_identifier`), and with crash recovery the same
//! timeline, but the WAL position has gone back and the batches the writer
//! stored after the backup are gone. At its next connection the writer
//! checks that the last batch it stored is still there; it is not, so the
//! store is `replaced`: sticky, the batch is diverted with a receipt, and
//! every later batch is diverted without connecting again. The copy says
//! what happened and claims no capture (there is none on this machine).
//! Restored by archive recovery (a new timeline), the same.
//!
//! The writer reaches the server through a loopback proxy
//! (`common::pg_proxy`) that counts the connections it accepts, so "at its
//! next connection" and "without connecting again" are observed from
//! outside the code under test, not read from the store's own counters.
mod common;
use common::pg_proxy::PgProxy;
use common::*;
use pg::Recovery;
use std::time::Duration;
use turnsafe_host::backend::Backend;
use turnsafe_policy::{Cause, Operation};

/// Connections the proxy has accepted, read once a connection already
/// made has had time to be accepted (the listener polls every 100 ms).
fn connections(proxy: &PgProxy) -> usize {
    std::thread::sleep(Duration::from_millis(300));
    proxy.accepted()
}

fn restored_under_a_live_writer(recovery: Recovery) {
    let mut server = pg_or_skip!();
    let db = server.create_db("restored");
    // Relays to the server's port, which the restored copy listens on too.
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    let backup = server.base_backup("older").expect("base backup");
    for tag in ["b", "c"] {
        let out = store.append_batch(&sid("s1"), &batch(tag, 2));
        assert!(out.persisted, "acknowledged after the backup: {}", out.to_value());
    }
    server.restore_base_backup(&backup, recovery).expect("restore");
    let rows: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(
        rows,
        ["a-0", "a-1"],
        "the restored server lacks what came after the backup"
    );

    let before_d = connections(&proxy);
    let d = store.append_batch(&sid("s1"), &batch("d", 2));
    assert!(!d.persisted, "{}", d.to_value());
    assert_eq!(
        (d.operation, d.cause),
        (Some(Operation::Open), Some(Cause::Replaced)),
        "{}",
        d.to_value()
    );
    assert_eq!((d.diverted, d.handed_back), (2, 0));
    let receipt = d.receipt.as_ref().expect("a receipt");
    assert_eq!(receipt_lines(receipt).len(), 2);
    let copy = d.copy.as_ref().expect("copy");
    assert_eq!(copy.code, "replaced.diverted");
    assert!(!copy.body.contains("captured"), "no capture is claimed: {}", copy.body);
    let failure = d.failure.as_ref().expect("the failure the machine took");
    assert!(
        failure.message.contains("lacks 2 of the 2 messages"),
        "{}",
        failure.message
    );
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    let sticky_at = connections(&proxy);
    assert_eq!(
        sticky_at - before_d,
        1,
        "the batch connected again once (its old connection died with the server), and found the older copy"
    );

    let e = store.append_batch(&sid("s1"), &batch("e", 1));
    assert_eq!((e.cause, e.diverted), (Some(Cause::Replaced), 1));
    assert_eq!(
        connections(&proxy),
        sticky_at,
        "a sticky handle never connects again (connections seen by the proxy)"
    );
    let rows_after: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(rows_after, ["a-0", "a-1"], "nothing was written into the older copy");
}

#[test]
fn a_restore_by_crash_recovery_is_replaced() {
    restored_under_a_live_writer(Recovery::Crash);
}

#[test]
fn a_restore_by_archive_recovery_is_replaced() {
    restored_under_a_live_writer(Recovery::Archive);
}
