//! PostgreSQL restored from an older base backup under a writer whose last
//! batch before the restore was not a plain message batch. The identity
//! guard checks, at every new connection, that the last batch the handle
//! stored is still there; every batch kind leaves what it needs for that:
//!
//! - a LangGraph-only writer (checkpoints and writes, as the Python saver
//!   puts them): the checkpoint it stored after the backup is missing, so
//!   its next batch is `replaced` at the open, diverted with a receipt,
//!   sticky, as a message writer's is;
//! - a writer of mixed groups (messages and checkpoints in one group)
//!   whose last group stored only its checkpoint (its message batch was
//!   handed back as a uid conflict): likewise;
//! - a batch whose COMMIT answer was lost, found stored when the writer
//!   connected again: it is the last batch stored, at a WAL position read
//!   then, for a LangGraph batch and for messages alike.
//!
//! Each restore stops the server (`-m immediate`) and starts the backup
//! in its place on the same port, so the writer's connection dies and its
//! next batch connects again; nothing is written into the older copy.
mod common;
use common::graph::{checkpoint, write};
use common::pg_proxy::{Mode, PgProxy};
use common::*;
use pg::Recovery;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::group::{Item, flush_group};
use turnsafe_host::graph::GraphBatch;
use turnsafe_host::message::Message;
use turnsafe_host::store::SessionId;
use turnsafe_policy::{Cause, Operation};

/// The checkpoint ids stored on `server`, live or not.
fn checkpoint_ids(server: &pg::PgServer, db: &str) -> Vec<String> {
    server
        .admin(db)
        .query("SELECT checkpoint_id FROM checkpoints ORDER BY checkpoint_id", &[])
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect()
}

fn uids(server: &pg::PgServer, db: &str, session: &str) -> Vec<String> {
    pg::rows(server, db, session).into_iter().map(|r| r.0).collect()
}

/// A batch the open refused because the server lacks the last batch
/// stored: diverted whole with a receipt, the store sticky.
fn assert_refused_as_replaced(out: &turnsafe_host::outcome::FlushOutcome, diverted: usize) {
    assert!(!out.persisted, "{}", out.to_value());
    assert_eq!(
        (out.operation, out.cause),
        (Some(Operation::Open), Some(Cause::Replaced)),
        "{}",
        out.to_value()
    );
    assert_eq!((out.diverted, out.handed_back), (diverted, 0), "{}", out.to_value());
    let receipt = out.receipt.as_ref().expect("a receipt");
    assert_eq!(receipt_lines(receipt).len(), diverted);
    assert_eq!(out.copy.as_ref().expect("copy").code, "replaced.diverted");
}

#[test]
fn a_langgraph_only_writer_is_refused_after_a_restore() {
    let mut server = pg_or_skip!();
    let db = server.create_db("graph_restored");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    let first = store.put_graph(&GraphBatch::Checkpoint(checkpoint("t1", "1ef1")));
    assert!(first.persisted, "{}", first.to_value());
    let backup = server.base_backup("older").expect("base backup");
    let second = store.put_graph(&GraphBatch::Checkpoint(checkpoint("t1", "1ef2")));
    assert!(second.persisted, "acknowledged after the backup: {}", second.to_value());
    server.restore_base_backup(&backup, Recovery::Crash).expect("restore");
    assert_eq!(
        checkpoint_ids(&server, &db),
        ["1ef1"],
        "the restored server lacks the checkpoint stored after the backup"
    );

    let third = store.put_graph(&GraphBatch::Writes(vec![write("t1", "1ef2")]));
    assert_refused_as_replaced(&third, 1);
    let failure = third.failure.as_ref().expect("the failure the machine took");
    assert!(
        failure
            .message
            .contains("lacks the LangGraph checkpoint this handle stored there last"),
        "{}",
        failure.message
    );
    assert_eq!(store.sticky(), Some(Cause::Replaced));

    let fourth = store.put_graph(&GraphBatch::Checkpoint(checkpoint("t1", "1ef3")));
    assert_eq!((fourth.cause, fourth.diverted), (Some(Cause::Replaced), 1));
    assert_eq!(
        checkpoint_ids(&server, &db),
        ["1ef1"],
        "nothing was written into the older copy"
    );
    let writes: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM checkpoint_writes", &[])
        .unwrap()
        .get(0);
    assert_eq!(writes, 0);
}

#[test]
fn a_mixed_group_is_refused_after_a_restore() {
    let mut server = pg_or_skip!();
    let db = server.create_db("mixed_restored");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    let (s1, graph_session) = (sid("s1"), SessionId::graph("t1"));
    let messages = batch("a", 2);
    let cp1 = GraphBatch::Checkpoint(checkpoint("t1", "1ef1"));
    let group: Vec<Item<'_>> = vec![(&s1, &messages, None), (&graph_session, &[], Some(&cp1))];
    let outs = flush_group(&mut store, &group);
    assert!(outs.iter().all(|o| o.persisted), "{:?}", outs[0].failure);
    let backup = server.base_backup("older").expect("base backup");

    // After the backup: a group whose checkpoint is stored and whose
    // message batch fails alone (a uid stored with other content).
    let conflicting = vec![Message::new("user", "other content").with_uid("a-1")];
    let cp2 = GraphBatch::Checkpoint(checkpoint("t1", "1ef2"));
    let group: Vec<Item<'_>> = vec![(&s1, &conflicting, None), (&graph_session, &[], Some(&cp2))];
    let outs = flush_group(&mut store, &group);
    assert_eq!(outs[0].cause, Some(Cause::UidConflict), "{}", outs[0].to_value());
    assert!(
        outs[1].persisted,
        "acknowledged after the backup: {}",
        outs[1].to_value()
    );
    server.restore_base_backup(&backup, Recovery::Archive).expect("restore");
    assert_eq!(checkpoint_ids(&server, &db), ["1ef1"]);

    let more = batch("b", 2);
    let cp3 = GraphBatch::Checkpoint(checkpoint("t1", "1ef3"));
    let group: Vec<Item<'_>> = vec![(&s1, &more, None), (&graph_session, &[], Some(&cp3))];
    let outs = flush_group(&mut store, &group);
    assert_refused_as_replaced(&outs[0], 2);
    assert_refused_as_replaced(&outs[1], 1);
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    assert_eq!(
        checkpoint_ids(&server, &db),
        ["1ef1"],
        "nothing was written into the older copy"
    );
    assert_eq!(uids(&server, &db, "s1"), ["a-0", "a-1"]);
}

/// A batch stored after the backup whose COMMIT answer the proxy cut: the
/// writer connects again, finds it stored, and it is persisted. The
/// restore then takes it away, and the next batch is refused.
fn a_lost_commit_found_stored_is_guarded(kind: &str) {
    let mut server = pg_or_skip!();
    let db = server.create_db(&format!("lost_commit_{kind}"));
    // Relays to the server's port, which the restored copy listens on too.
    let proxy = PgProxy::start(server.port()).expect("proxy");
    let home = Home::new();
    let mut store = pg::store(&proxy.url(&db), home.path());
    let put = |store: &mut turnsafe_host::pg::PgStore, tag: &str| match kind {
        "graph" => store.put_graph(&GraphBatch::Checkpoint(checkpoint("t1", tag))),
        _ => store.append_batch(&sid("s1"), &batch(tag, 2)),
    };
    assert!(put(&mut store, "1ef1").persisted);
    let backup = server.base_backup("older").expect("base backup");

    proxy.once(Mode::DropAfterCommit);
    let lost = put(&mut store, "1ef2");
    assert_eq!(proxy.cuts_after_commit(), 1, "the cut happened after COMMIT");
    assert!(lost.persisted, "{}", lost.to_value());
    assert_eq!(lost.cause, Some(Cause::OutcomeUnknown), "{}", lost.to_value());

    server.restore_base_backup(&backup, Recovery::Crash).expect("restore");
    let next = put(&mut store, "1ef3");
    let size = if kind == "graph" { 1 } else { 2 };
    assert_refused_as_replaced(&next, size);
    assert_eq!(store.sticky(), Some(Cause::Replaced));
    match kind {
        "graph" => assert_eq!(checkpoint_ids(&server, &db), ["1ef1"]),
        _ => assert_eq!(uids(&server, &db, "s1"), ["1ef1-0", "1ef1-1"]),
    }
}

#[test]
fn a_lost_commit_of_a_langgraph_batch_found_stored_is_guarded() {
    a_lost_commit_found_stored_is_guarded("graph");
}

#[test]
fn a_lost_commit_of_messages_found_stored_is_guarded() {
    a_lost_commit_found_stored_is_guarded("messages");
}
