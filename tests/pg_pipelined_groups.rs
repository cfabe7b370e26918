//! PostgreSQL: a shared store pipelines its groups, each on its own
//! connection, and keeps every rule of one connection.
//!
//! The server delays one COMMIT for real: a deferred constraint trigger
//! (it runs at COMMIT) takes an advisory lock the test holds, for the rows
//! whose uid starts with `slow-`. Nothing waits on time: the test reads
//! `pg_locks` to know the COMMIT is waiting, and lets it go when it chooses.
//!
//! - While one group's COMMIT waits, a batch of another session commits on
//!   a second connection; a batch of the waiting session sent meanwhile is
//!   not taken into that group (its turn comes after the one it sent
//!   first), and commits once the first did, with the next seq.
//! - A connection the server ends takes only its own group to
//!   `outcome_unknown`: the held COMMIT's backend is terminated, its batch
//!   is looked up by uid and written again on a new connection, and the
//!   group the other connection committed meanwhile was never touched.
//! - A LangGraph checkpoint pipelines the same way: it commits on a second
//!   connection while a turn's COMMIT waits.
//! - The identity guard is one for the pipeline: the second connection
//!   committed last, the server is restored from a backup taken before
//!   that batch, and the first connection, whose own last batch is older
//!   than the backup, is refused when it connects again. Nothing is written
//!   into the older copy.
mod common;
use std::thread::JoinHandle;
use std::time::Duration;

use common::graph::checkpoint;
use common::*;
use pg::Recovery;
use turnsafe_host::backend::SharedStore;
use turnsafe_host::graph::GraphBatch;
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_policy::Cause;

const LOCK: i64 = 4242;

/// The trigger that makes a `slow-` row's COMMIT wait for [`LOCK`].
fn delay_slow_commits(server: &pg::PgServer, db: &str) {
    let mut admin = server.admin(db);
    // The store creates its schema on its first connection. The wait is
    // the function's own, outside the writer's `lock_timeout`: it lasts
    // until the test lets it go.
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION wait_at_commit() RETURNS trigger LANGUAGE plpgsql SET lock_timeout = 0 AS $$ \
             BEGIN PERFORM pg_advisory_xact_lock({LOCK}); RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON messages \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.uid LIKE 'slow-%') \
             EXECUTE FUNCTION wait_at_commit();"
        ))
        .expect("the delaying trigger");
}

/// Until some backend waits for [`LOCK`]: a COMMIT held by the trigger.
fn wait_for_held_commit(server: &pg::PgServer, db: &str) {
    let mut admin = server.admin(db);
    for _ in 0..6000 {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted",
                &[&(LOCK as u32)],
            )
            .expect("pg_locks")
            .get(0);
        if waiting > 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no COMMIT ever waited for the advisory lock");
}

/// The backend whose COMMIT waits for [`LOCK`].
fn held_backend(server: &pg::PgServer, db: &str) -> i32 {
    server
        .admin(db)
        .query_one(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted",
            &[&(LOCK as u32)],
        )
        .expect("the waiting backend")
        .get(0)
}

/// The sessions' uids as stored, in seq order.
fn stored(server: &pg::PgServer, db: &str, session: &str) -> Vec<String> {
    pg::rows(server, db, session).into_iter().map(|r| r.0).collect()
}

/// A pipelined store on a new database `name` whose `slow-` rows' COMMIT
/// waits for [`LOCK`], with one batch (`a1`) of session `a` stored.
fn pipelined(server: &pg::PgServer, name: &str) -> (String, Home, SharedStore) {
    let db = server.create_db(name);
    let home = Home::new();
    let shared = SharedStore::over(pg::store(&server.url(&db), home.path()), home.path());
    assert!(shared.lanes() >= 2, "a PostgreSQL store pipelines by default");
    assert!(shared.append_batch(&sid("a"), &batch("a1", 1)).persisted);
    delay_slow_commits(server, &db);
    (db, home, shared)
}

/// Hold [`LOCK`] on a connection of the test's own (until it is dropped)
/// and send session `a`'s batch `slow` from another thread; returns once
/// its COMMIT waits for the lock.
fn hold_slow_commit(
    server: &pg::PgServer,
    db: &str,
    shared: &SharedStore,
) -> (postgres::Client, JoinHandle<FlushOutcome>) {
    let mut holder = server.admin(db);
    holder.query_one("SELECT pg_advisory_lock($1)", &[&LOCK]).unwrap();
    let waiting = {
        let shared = shared.clone();
        std::thread::spawn(move || shared.append_batch(&sid("a"), &batch("slow", 1)))
    };
    wait_for_held_commit(server, db);
    (holder, waiting)
}

#[test]
fn a_group_is_written_while_another_commits_and_a_session_keeps_its_order() {
    let server = pg_or_skip!();
    let (db, _home, shared) = pipelined(&server, "pipelined");
    let (holder, first) = hold_slow_commit(&server, &db, &shared);
    // The same session's next batch, queued behind the one in the held COMMIT.
    let second = {
        let shared = shared.clone();
        std::thread::spawn(move || shared.append_batch(&sid("a"), &batch("a2", 1)))
    };
    while shared.waiting() == 0 && !second.is_finished() {
        std::thread::yield_now();
    }
    assert_eq!(shared.waiting(), 1, "a2 waits behind the held COMMIT of its session");

    // Another session's batch commits while the first COMMIT still waits:
    // a group of its own, on a second connection. Had a2 been eligible, it
    // was queued first and would have gone in this group.
    let other = shared.append_batch(&sid("b"), &batch("b1", 1));
    assert!(other.persisted, "{}", other.to_value());
    assert_eq!(stored(&server, &db, "b"), ["b1-0"]);
    assert_eq!(
        stored(&server, &db, "a"),
        ["a1-0"],
        "neither slow nor a2 is committed yet"
    );
    assert!(
        !first.is_finished() && !second.is_finished(),
        "no batch of session a is answered while its COMMIT waits"
    );
    assert_eq!(shared.waiting(), 1, "a2 still waits");

    drop(holder);
    let slow = first.join().unwrap();
    let a2 = second.join().unwrap();
    assert!(slow.persisted, "{}", slow.to_value());
    assert!(a2.persisted, "{}", a2.to_value());
    let rows = pg::rows(&server, &db, "a");
    let in_order: Vec<(&str, i64)> = rows.iter().map(|r| (r.0.as_str(), r.1)).collect();
    assert_eq!(in_order, [("a1-0", 1), ("slow-0", 2), ("a2-0", 3)]);
}

#[test]
fn the_first_connection_is_refused_by_what_the_second_stored_before_a_restore() {
    let mut server = pg_or_skip!();
    let (db, _home, shared) = pipelined(&server, "pipelined_restore");
    let backup = server.base_backup("older").expect("base backup");

    // The first connection waits in a COMMIT; the second stores c1, the
    // last batch stored, after the backup.
    let (holder, waiting) = hold_slow_commit(&server, &db, &shared);
    let c1 = shared.append_batch(&sid("c"), &batch("c1", 1));
    assert!(c1.persisted, "{}", c1.to_value());

    // The restore stops the server with the lock still held: the held
    // COMMIT goes with it.
    server.restore_base_backup(&backup, Recovery::Crash).expect("restore");
    drop(holder);
    assert_eq!(
        stored(&server, &db, "c"),
        Vec::<String>::new(),
        "the restored server lacks c1"
    );
    let slow = waiting.join().unwrap();
    assert!(!slow.persisted, "{}", slow.to_value());
    assert_eq!(
        slow.diverted,
        1,
        "the batch of the lost COMMIT is kept: {}",
        slow.to_value()
    );

    // Nothing else runs: the next batch takes the first connection again,
    // whose own last batch (a1) the restored server holds.
    let next = shared.append_batch(&sid("a"), &batch("a2", 1));
    assert!(!next.persisted, "{}", next.to_value());
    assert_eq!(next.cause, Some(Cause::Replaced), "{}", next.to_value());
    assert_eq!(next.diverted, 1);
    assert_eq!(
        stored(&server, &db, "a"),
        ["a1-0"],
        "nothing was written into the older copy"
    );
}

#[test]
fn a_connection_the_server_ends_takes_only_its_own_group_to_an_unknown_outcome() {
    let server = pg_or_skip!();
    let (db, _home, shared) = pipelined(&server, "pipelined_ended");
    let (holder, waiting) = hold_slow_commit(&server, &db, &shared);
    let other = shared.append_batch(&sid("b"), &batch("b1", 1));
    assert!(other.persisted, "{}", other.to_value());

    // The server ends the connection whose COMMIT waits: its answer is lost.
    let pid = held_backend(&server, &db);
    let ended: bool = server
        .admin(&db)
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(ended);
    drop(holder);
    let slow = waiting.join().unwrap();
    assert!(
        slow.persisted,
        "looked up by uid, then written again: {}",
        slow.to_value()
    );
    assert!(slow.attempts >= 2, "{}", slow.to_value());
    assert_eq!(other.attempts, 1, "the other group never failed: {}", other.to_value());
    assert_eq!(stored(&server, &db, "a"), ["a1-0", "slow-0"], "each once, in order");
    assert_eq!(stored(&server, &db, "b"), ["b1-0"]);
    let next = shared.append_batch(&sid("b"), &batch("b2", 1));
    assert!(next.persisted, "{}", next.to_value());
}

#[test]
fn a_langgraph_checkpoint_commits_on_a_second_connection_while_a_turn_waits() {
    let server = pg_or_skip!();
    let (db, _home, shared) = pipelined(&server, "pipelined_graph");
    let (holder, waiting) = hold_slow_commit(&server, &db, &shared);
    let put = shared.put_graph(GraphBatch::Checkpoint(checkpoint("t1", "1ef1")));
    assert!(put.persisted, "{}", put.to_value());
    let stored_checkpoints: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM checkpoints WHERE thread_id = 't1'", &[])
        .unwrap()
        .get(0);
    assert_eq!(stored_checkpoints, 1, "committed while the turn's COMMIT still waits");
    assert!(!waiting.is_finished());
    drop(holder);
    assert!(waiting.join().unwrap().persisted);
}
