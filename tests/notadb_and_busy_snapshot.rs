//! Garbage over the database header: SQLITE_NOTADB at open is `corrupt`,
//! diverted, and sticky for the handle.
mod common;
use common::*;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn garbage_over_the_header_is_corrupt_and_sticky() {
    let home = Home::new();
    let mut first = home.store();
    assert!(first.append_batch(&sid("s1"), &batch("a", 2)).persisted);
    drop(first);
    let mut bytes = std::fs::read(home.db()).unwrap();
    bytes[..100].fill(0x5A);
    std::fs::write(home.db(), &bytes).unwrap();

    let mut store = home.store();
    let out = store.append_batch(&sid("s1"), &batch("b", 2));
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Corrupt));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!(out.diverted, 2);
    assert_eq!(out.copy.as_ref().unwrap().code, "corrupt.diverted");
    let lines = receipt_lines(out.receipt.as_ref().unwrap());
    assert_eq!(lines[0]["cause"], "corrupt");
}

#[test]
fn busy_snapshot_is_recorded_from_a_real_second_connection() {
    // The vector `induced_busy_snapshot` comes from this sequence.
    let home = Home::new();
    drop(home.store());
    let a = home.other();
    let b = home.other();
    b.busy_timeout(std::time::Duration::ZERO).unwrap();
    b.execute_batch("BEGIN").unwrap();
    let _: i64 = b.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
    a.execute("INSERT INTO state_meta(key, value) VALUES ('probe', 'a')", [])
        .unwrap();
    let err = b
        .execute("UPDATE state_meta SET value = value WHERE key = 'generation'", [])
        .unwrap_err();
    let (code, ext, msg) = turnsafe_host::observe::sqlite_parts(&err);
    assert_eq!((code, ext, msg.as_str()), (Some(5), Some(517), "database is locked"));
    let obs = turnsafe_host::observe::observation(turnsafe_policy::Operation::AppendBatch, &err, None, vec![], 1, 0, 1);
    let d = turnsafe_policy::decide(&obs);
    assert_eq!((d.classification.cause, d.action), (Cause::Locked, ActionKind::Retry));
}

#[test]
fn the_flush_never_reads_before_begin_immediate() {
    // If a flush read under a deferred transaction, a commit by another
    // writer in between would give it BUSY_SNAPSHOT and a retry. It never does.
    let home = Home::new();
    let mut store = home.store();
    let other = home.other();
    for i in 0..100 {
        other
            .execute(
                "INSERT OR REPLACE INTO state_meta(key, value) VALUES ('probe', ?1)",
                [i.to_string()],
            )
            .unwrap();
        let out = store.append_batch(&sid("s1"), &batch(&format!("b{i}"), 2));
        assert!(
            out.persisted && out.attempts == 1 && out.cause.is_none(),
            "{:?}",
            out.to_value()
        );
    }
}
