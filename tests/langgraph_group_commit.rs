//! LangGraph batches from several threads that wait together are committed
//! in one transaction, each in its own savepoint, and one that fails alone
//! fails only itself (`docs/LANGGRAPH.md`, "Written through the flush
//! machine"), on SQLite and on a real PostgreSQL server.
//!
//! The batches are made to wait together for certain: a call on the
//! shared store holds it (as a read from an event loop does) while nine
//! threads each hand over a checkpoint of their own thread; once it ends,
//! they go in one group. One of them is refused by the database itself
//! for its thread alone: a trigger on SQLite, a `CHECK` constraint on
//! PostgreSQL, each added from outside the store.
//!
//! Transactions are counted from outside the store: on SQLite, the commit
//! frames of the WAL, read from the file as SQLite's WAL format defines
//! them; on PostgreSQL, each row's `xmin`.
mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::mpsc;

use common::graph::checkpoint;
use common::*;
use turnsafe_host::backend::Engine;
use turnsafe_host::graph::{GraphBatch, GraphQuery};
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::store::{SharedStore, StoreOptions};

/// The threads whose checkpoints are stored; `REFUSED`'s is refused.
const THREADS: [&str; 8] = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"];
const REFUSED: &str = "refused";

/// What the WAL file holds, read from outside the store: its salts, how
/// often it restarted (the checkpoint sequence of its header) and how many
/// transactions its valid frames commit. A frame is valid while its salts
/// are the header's and the running checksum holds; a commit frame is one
/// that gives the database's size after the commit.
#[derive(Debug, PartialEq, Eq)]
struct WalCommits {
    salts: (u32, u32),
    restarts: u32,
    commits: usize,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn wal_commits(wal: &Path) -> WalCommits {
    let data = std::fs::read(wal).expect("the WAL is there while the store is open");
    assert!(data.len() >= 32, "a WAL header");
    let magic = be32(&data, 0);
    assert!(magic == 0x377f_0682 || magic == 0x377f_0683, "WAL magic {magic:#x}");
    let big_endian = magic & 1 == 1;
    let word = |b: &[u8], at: usize| {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if big_endian {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    };
    let checksum = |(mut s0, mut s1): (u32, u32), chunk: &[u8]| {
        for at in (0..chunk.len()).step_by(8) {
            s0 = s0.wrapping_add(word(chunk, at)).wrapping_add(s1);
            s1 = s1.wrapping_add(word(chunk, at + 4)).wrapping_add(s0);
        }
        (s0, s1)
    };
    let page_size = be32(&data, 8) as usize;
    let salts = (be32(&data, 16), be32(&data, 20));
    let mut sum = checksum((0, 0), &data[..24]);
    assert_eq!(sum, (be32(&data, 24), be32(&data, 28)), "the WAL header's checksum");
    let (mut commits, mut at) = (0, 32);
    while at + 24 + page_size <= data.len() {
        let frame = &data[at..at + 24];
        if (be32(frame, 8), be32(frame, 12)) != salts {
            break;
        }
        sum = checksum(checksum(sum, &frame[..8]), &data[at + 24..at + 24 + page_size]);
        if sum != (be32(frame, 16), be32(frame, 20)) {
            break;
        }
        if be32(frame, 4) != 0 {
            commits += 1;
        }
        at += 24 + page_size;
    }
    WalCommits {
        salts,
        restarts: be32(&data, 12),
        commits,
    }
}

/// The transaction a PostgreSQL COMMIT record commits and its
/// subtransactions (`subxacts:` in pg_walinspect's description).
fn committed_xids(xid: &str, description: &str) -> BTreeSet<u64> {
    let mut xids: BTreeSet<u64> = xid.parse().into_iter().collect();
    if let Some((_, rest)) = description.split_once("subxacts:") {
        xids.extend(
            rest.split_whitespace()
                .map_while(|w| w.trim_end_matches(';').parse::<u64>().ok()),
        );
    }
    xids
}

/// The checkpoint each thread hands over.
fn checkpoints() -> Vec<GraphBatch> {
    THREADS
        .iter()
        .chain([&REFUSED])
        .map(|t| GraphBatch::Checkpoint(checkpoint(t, "1ef2")))
        .collect()
}

/// Nine threads hand a checkpoint each to `shared` while a call holds the
/// store; the call ends once all nine wait, and they are committed in the
/// group after it. Returns each thread's outcome, in `checkpoints()` order.
fn wait_together(shared: &SharedStore) -> Vec<FlushOutcome> {
    let (held_tx, held_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    shared.call_then(
        move |_store: &mut dyn Engine| {
            let _ = held_tx.send(());
            let _ = go_rx.recv();
        },
        |_| {},
    );
    held_rx.recv().expect("the call holds the store");
    let senders: Vec<_> = checkpoints()
        .into_iter()
        .map(|batch| {
            let shared = shared.clone();
            std::thread::spawn(move || shared.put_graph(batch))
        })
        .collect();
    while shared.waiting() < senders.len() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    go_tx.send(()).expect("the call is waiting");
    senders.into_iter().map(|h| h.join().expect("thread")).collect()
}

fn stored(store: &mut (impl Engine + ?Sized), thread: &str) -> Vec<Vec<u8>> {
    store
        .graph_read(&GraphQuery {
            thread_id: Some(thread.into()),
            ..GraphQuery::default()
        })
        .expect("read")
        .into_iter()
        .map(|c| c.record.checkpoint)
        .collect()
}

/// Every thread's checkpoint is stored but the refused one, which failed
/// alone, handed back or diverted with its own receipt, never stored.
fn only_the_refused_failed(outs: &[FlushOutcome]) {
    assert_eq!(outs.len(), THREADS.len() + 1);
    for (t, out) in THREADS.iter().zip(outs) {
        assert!(out.persisted, "{t}: {}", out.to_value());
        assert_eq!((out.committed, out.attempts), (1, 1), "{t}: {}", out.to_value());
    }
    let refused = &outs[THREADS.len()];
    assert!(!refused.persisted, "{}", refused.to_value());
    assert_eq!(refused.committed, 0, "{}", refused.to_value());
    assert_eq!(refused.diverted + refused.handed_back, 1, "{}", refused.to_value());
}

#[test]
fn graph_batches_that_wait_together_share_one_sqlite_transaction_and_one_fails_alone() {
    let home = Home::new();
    let shared = SharedStore::open(home.path(), StoreOptions::default()).expect("open");
    let warm = shared.put_graph(GraphBatch::Checkpoint(checkpoint("warm", "1ef1")));
    assert!(warm.persisted, "{}", warm.to_value());
    // The database refuses the thread's checkpoints, and only its.
    home.other()
        .execute_batch(&format!(
            "CREATE TRIGGER refuse_thread BEFORE INSERT ON checkpoints WHEN NEW.thread_id = '{REFUSED}'
             BEGIN SELECT RAISE(ABORT, 'the test refuses this thread'); END;"
        ))
        .expect("create the trigger");
    let wal = home.path().join("state.db-wal");
    let before = wal_commits(&wal);

    let outs = wait_together(&shared);
    let after = wal_commits(&wal);
    only_the_refused_failed(&outs);
    assert_eq!(
        (after.salts, after.restarts),
        (before.salts, before.restarts),
        "the WAL did not restart, so its frames hold every commit"
    );
    assert_eq!(
        after.commits - before.commits,
        1,
        "nine checkpoints that waited together, one transaction"
    );
    shared.with_store(|store| {
        for t in THREADS {
            assert_eq!(stored(store, t), [checkpoint(t, "1ef2").checkpoint], "{t}");
        }
        assert!(stored(store, REFUSED).is_empty(), "nothing of the refused batch");
    });
}

#[test]
fn graph_batches_that_wait_together_share_one_postgres_transaction_and_one_fails_alone() {
    let server = pg_or_skip!();
    let db = server.create_db("lg_group");
    let home = Home::new();
    let shared = SharedStore::over(pg::store(&server.url(&db), home.path()), home.path());
    let warm = shared.put_graph(GraphBatch::Checkpoint(checkpoint("warm", "1ef1")));
    assert!(warm.persisted, "{}", warm.to_value());
    // The database refuses the thread's checkpoints, and only its.
    server
        .admin(&db)
        .batch_execute(&format!(
            "ALTER TABLE checkpoints ADD CONSTRAINT refuse_thread CHECK (thread_id <> '{REFUSED}')"
        ))
        .expect("add the constraint");

    let mut admin = server.admin(&db);
    admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .expect("pg_walinspect, in PostgreSQL's contrib");
    let lsn = |admin: &mut postgres::Client, f: &str| -> String {
        admin
            .query_one(&format!("SELECT {f}()::text"), &[])
            .expect("read the WAL position")
            .get(0)
    };
    let before = lsn(&mut admin, "pg_current_wal_insert_lsn");

    let outs = wait_together(&shared);
    only_the_refused_failed(&outs);
    // Each batch is written in a savepoint, so each row's xmin is its
    // subtransaction's id; the COMMIT records of the WAL name the
    // transaction each subtransaction belongs to.
    let after = lsn(&mut admin, "pg_current_wal_flush_lsn");
    let xmins: BTreeSet<u64> = admin
        .query(
            "SELECT xmin::text FROM checkpoints WHERE thread_id = ANY($1)",
            &[&THREADS.to_vec()],
        )
        .expect("read xmin")
        .into_iter()
        .map(|r| r.get::<_, String>(0).parse().expect("an xid"))
        .collect();
    assert_eq!(xmins.len(), THREADS.len(), "a savepoint each");
    let commits: Vec<BTreeSet<u64>> = admin
        .query(
            "SELECT xid::text, description FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn) \
             WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT'",
            &[&before, &after],
        )
        .expect("read the WAL's COMMIT records")
        .into_iter()
        .map(|r| committed_xids(&r.get::<_, String>(0), &r.get::<_, String>(1)))
        .filter(|xids| !xids.is_disjoint(&xmins))
        .collect();
    assert_eq!(
        commits.len(),
        1,
        "eight checkpoints that waited together, one COMMIT: {commits:?} {xmins:?}"
    );
    assert!(xmins.is_subset(&commits[0]), "{commits:?} {xmins:?}");
    shared.with_store(|store| {
        for t in THREADS {
            assert_eq!(stored(store, t), [checkpoint(t, "1ef2").checkpoint], "{t}");
        }
        assert!(stored(store, REFUSED).is_empty(), "nothing of the refused batch");
    });
}
