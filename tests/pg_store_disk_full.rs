//! PostgreSQL's disk full, for real: the writer's database lives in a
//! tablespace on a small tmpfs (`pg_wal` stays on the normal disk, since a
//! full WAL disk makes the server PANIC), filled until inserts fail with
//! SQLSTATE 53100. The batch is `disk_full`: diverted with a receipt, never
//! retried. Space freed, the same writer carries on, and replay brings the
//! diverted batch in, in its place. Needs root for the mount: under
//! `CI=true` it must run.
mod common;
use common::pg_limits::SmallTablespace;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::replay::ReplayOptions;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn a_full_tablespace_diverts_the_batch_as_disk_full() {
    let server = pg_or_skip!();
    let ts = skip_unless!(SmallTablespace::create(&server, "turnsafe_small", "16m"));
    let db = ts.create_db("full_store");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);

    let full = ts.fill(&db).expect("the tablespace fills up");
    assert_eq!(full.code, "53100");
    // Enough rows to need pages the tmpfs cannot give.
    let attempts = store.counters().append_attempts;
    let out = store.append_batch(&sid("s1"), &batch("b", 40));
    assert!(!out.persisted, "{}", out.to_value());
    assert_eq!(out.cause, Some(Cause::DiskFull), "{}", out.to_value());
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!(out.failure.as_ref().and_then(|f| f.sqlstate.as_deref()), Some("53100"));
    assert_eq!(
        store.counters().append_attempts - attempts,
        1,
        "a full disk is not retried"
    );
    assert_eq!((out.diverted, out.handed_back), (40, 0));
    let receipt = out.receipt.as_ref().expect("a receipt");
    assert_eq!(receipt_lines(receipt).len(), 40);
    assert_eq!(out.copy.as_ref().map(|c| c.code.as_str()), Some("disk_full.diverted"));
    assert!(!server.log().contains("PANIC"), "the server keeps running");

    ts.free(&db);
    assert!(
        store.append_batch(&sid("s1"), &batch("c", 1)).persisted,
        "the writer carries on"
    );
    drop(store);
    let url: turnsafe_host::pg::DbUrl = server.url(&db).parse().expect("url");
    let run = turnsafe_host::pg::replay::replay(home.path(), &url, &ReplayOptions::default()).expect("replay");
    assert_eq!(run.files.iter().map(|f| f.replayed).sum::<u64>(), 40);
    let uids: Vec<String> = pg::rows(&server, &db, "s1").into_iter().map(|r| r.0).collect();
    assert_eq!(uids.len(), 43);
    assert_eq!(&uids[..3], ["a-0", "a-1", "b-0"], "the diverted batch in its place");
    assert_eq!(uids.last().map(String::as_str), Some("c-0"));
}
