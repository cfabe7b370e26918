//! Group commit: several batches in one transaction, each in its own
//! savepoint, each with its own outcome.
//!
//! Transactions are counted from below, by the counting VFS (the WAL write
//! lock taken), never by the store's own counters:
//! - a batch that fails alone (a uid conflict, a lease held elsewhere) is
//!   rolled back to its savepoint and the others commit, in one transaction;
//! - an I/O error at COMMIT fails the whole group: nothing of it is stored,
//!   and every batch is diverted with a receipt of its own;
//! - batches from many threads through one `SharedStore` share commits.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::faultvfs::{self, Counter, Fault, FileKind, Op};
use turnsafe_host::message::Message;
use turnsafe_host::replay::{ReplayOptions, replay};
use turnsafe_host::store::{SessionId, SessionStore, SharedStore, StoreOptions};
use turnsafe_policy::{ActionKind, Cause};

fn vfs_opts() -> StoreOptions {
    StoreOptions {
        vfs: Some(faultvfs::VFS_NAME.into()),
        ..StoreOptions::default()
    }
}

/// A store through the counting VFS, with a counter on its home.
fn counted(home: &Home) -> (SessionStore, Counter) {
    let counter = faultvfs::count(&home.path().to_string_lossy()).expect("counting VFS");
    (home.store_with(vfs_opts()), counter)
}

#[test]
fn one_conflicting_batch_fails_alone_and_the_others_commit_together() {
    let home = Home::new();
    let (mut store, counter) = counted(&home);
    assert!(store.append_batch(&sid("a"), &batch("a0", 2)).persisted);
    let before = counter.counts().main.write_locks;

    let (a, b, c) = (sid("a"), sid("b"), sid("c"));
    let conflicting = vec![
        Message::new("user", "new in the refused batch").with_uid("fresh-1"),
        Message::new("user", "other content, same uid").with_uid("a0-1"),
    ];
    let (b1, a1, c1, b2) = (batch("b1", 3), batch("a1", 2), batch("c1", 2), batch("b2", 3));
    let outs = store.append_group(&[(&b, &b1), (&a, &conflicting), (&a, &a1), (&c, &c1), (&b, &b2)]);
    assert_eq!(outs.len(), 5);

    let refused = &outs[1];
    assert!(!refused.persisted, "{}", refused.to_value());
    assert_eq!(refused.cause, Some(Cause::UidConflict));
    assert_eq!(refused.action, Some(ActionKind::FailClosed));
    assert_eq!((refused.committed, refused.diverted, refused.handed_back), (0, 0, 2));
    for (i, out) in outs.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert!(out.persisted, "batch {i}: {}", out.to_value());
        assert_eq!(out.attempts, 1, "batch {i}");
    }
    assert_eq!(
        counter.counts().main.write_locks - before,
        1,
        "five batches, one transaction"
    );

    // The refused batch's new message went with its savepoint; the batch
    // after it in the same session follows the stored rows.
    let a_rows = home.rows("a");
    assert!(a_rows.iter().all(|r| r.0 != "fresh-1"), "{a_rows:?}");
    let a_uids: Vec<(&str, i64)> = a_rows.iter().map(|r| (r.0.as_str(), r.1)).collect();
    assert_eq!(a_uids, [("a0-0", 1), ("a0-1", 2), ("a1-0", 3), ("a1-1", 4)]);
    // Two batches of one session in one group: seq follows their order.
    let b_seqs: Vec<(String, i64)> = home.rows("b").into_iter().map(|r| (r.0, r.1)).collect();
    let expected: Vec<(String, i64)> = ["b1-0", "b1-1", "b1-2", "b2-0", "b2-1", "b2-2"]
        .iter()
        .zip(1..)
        .map(|(u, s)| (u.to_string(), s))
        .collect();
    assert_eq!(b_seqs, expected);
    assert_eq!(home.rows("c").len(), 2);
    assert!(!home.divert_file("a").exists(), "a conflict is never diverted");
}

#[test]
fn a_lease_held_elsewhere_fails_only_its_batch() {
    let home = Home::new();
    let mut holder = home.store_with(StoreOptions {
        holder: "other-writer".into(),
        ..StoreOptions::default()
    });
    assert!(holder.append_batch(&sid("held"), &batch("h0", 1)).persisted);

    let (mut store, counter) = counted(&home);
    let before = counter.counts().main.write_locks;
    let (free, held) = (sid("free"), sid("held"));
    let (f1, h1, f2) = (batch("f1", 2), batch("h1", 2), batch("f2", 2));
    let outs = store.append_group(&[(&free, &f1), (&held, &h1), (&free, &f2)]);
    assert!(outs[0].persisted && outs[2].persisted, "{}", outs[0].to_value());
    assert_eq!(outs[1].cause, Some(Cause::TurnLease), "{}", outs[1].to_value());
    assert_eq!(
        (outs[1].diverted, outs[1].handed_back),
        (0, 2),
        "fenced, never diverted"
    );
    assert_eq!(counter.counts().main.write_locks - before, 1);
    assert_eq!(home.rows("held").len(), 1, "nothing of the fenced batch is stored");
    assert_eq!(home.rows("free").len(), 4);
}

#[test]
fn an_io_error_at_commit_diverts_every_batch_with_its_own_receipt() {
    let home = Home::new();
    let (mut store, counter) = counted(&home);
    assert!(store.append_batch(&sid("s0"), &batch("warm", 1)).persisted);
    let tag = home.path().to_string_lossy().into_owned();
    // The WAL is synced at COMMIT, and only there.
    let fault = faultvfs::arm(Fault::new(&tag, Op::Sync, FileKind::Wal, 1)).expect("arm");
    let before = counter.counts().main.write_locks;

    let ids: Vec<SessionId> = ["s1", "s2", "s1", "s3"].iter().map(|s| sid(s)).collect();
    let batches: Vec<Vec<Message>> = (0..4).map(|i| batch(&format!("g{i}"), 3)).collect();
    let group: Vec<(&SessionId, &[Message])> = ids.iter().zip(&batches).map(|(s, b)| (s, b.as_slice())).collect();
    let outs = store.append_group(&group);
    assert_eq!(fault.fired(), 1, "the COMMIT's sync failed once");
    drop(fault);
    assert_eq!(
        counter.counts().main.write_locks - before,
        1,
        "one transaction, no retry"
    );

    let mut ranges = Vec::new();
    for (i, out) in outs.iter().enumerate() {
        assert!(!out.persisted, "batch {i}: {}", out.to_value());
        assert_eq!(out.cause, Some(Cause::Disk), "batch {i}: {}", out.to_value());
        assert_eq!((out.committed, out.diverted, out.handed_back), (0, 3, 0), "batch {i}");
        let receipt = out.receipt.as_ref().expect("each batch has its own receipt");
        assert!(
            receipt.path.ends_with(&format!("{}.jsonl", ids[i].as_str())),
            "{}",
            receipt.path
        );
        let lines = receipt_lines(receipt);
        let uids: Vec<&str> = lines.iter().map(|l| l["uid"].as_str().unwrap()).collect();
        assert_eq!(uids, out.uids.iter().map(String::as_str).collect::<Vec<_>>());
        let copy = out.copy.as_ref().expect("copy");
        assert!(copy.body.contains(&receipt.path), "{}", copy.body);
        ranges.push((receipt.path.clone(), receipt.offset, receipt.length));
    }
    // Two batches of s1 in one file, one after the other.
    assert_eq!(ranges[0].0, ranges[2].0);
    assert_eq!(ranges[0].1 + ranges[0].2, ranges[2].1);
    for s in ["s1", "s2", "s3"] {
        assert!(home.rows(s).is_empty(), "{s}: nothing of a failed group is stored");
    }

    // Replay brings every batch in once, in its place.
    drop(store);
    replay(home.path(), &ReplayOptions::default()).expect("replay");
    let s1: Vec<String> = home.rows("s1").into_iter().map(|r| r.0).collect();
    assert_eq!(s1, ["g0-0", "g0-1", "g0-2", "g2-0", "g2-1", "g2-2"]);
    assert_eq!((home.rows("s2").len(), home.rows("s3").len()), (3, 3));
}

#[test]
fn threads_on_one_shared_store_share_commits() {
    let home = Home::new();
    let counter = faultvfs::count(&home.path().to_string_lossy()).expect("counting VFS");
    let store = SharedStore::open(home.path(), vfs_opts()).expect("open");
    assert!(store.append_batch(&sid("warm"), &batch("warm", 1)).persisted);
    let before = counter.counts().main.write_locks;

    // Hold the store so the threads' batches queue behind the first one.
    const THREADS: usize = 12;
    let outcomes = store.with_store(|_| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || store.append_batch(&sid(&format!("t{t}")), &batch(&format!("t{t}"), 2)))
            })
            .collect();
        // No group starts while the store is held: every batch queues.
        while store.waiting() < THREADS {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        handles
    });
    for (t, h) in outcomes.into_iter().enumerate() {
        let out = h.join().expect("thread");
        assert!(out.persisted, "t{t}: {}", out.to_value());
        assert_eq!(home.rows(&format!("t{t}")).len(), 2);
    }
    let transactions = counter.counts().main.write_locks - before;
    assert_eq!(
        transactions, 1,
        "everything that queued behind the held store, in one transaction"
    );
}

#[test]
fn batches_handed_over_without_waiting_share_commits() {
    let home = Home::new();
    let counter = faultvfs::count(&home.path().to_string_lossy()).expect("counting VFS");
    let store = SharedStore::open(home.path(), vfs_opts()).expect("open");
    assert!(store.append_batch(&sid("warm"), &batch("warm", 1)).persisted);
    let before = counter.counts().main.write_locks;

    // One thread hands 16 batches over while the store is held: the
    // committer thread takes what is queued when it starts (it then waits
    // for the store), and everything else goes in the group after it.
    const BATCHES: usize = 16;
    let (tx, rx) = std::sync::mpsc::channel();
    store.with_store(|_| {
        for b in 0..BATCHES {
            let tx = tx.clone();
            let tag = format!("h{b}");
            store.append_batch_then(&sid(&tag), batch(&tag, 2), move |out| {
                let _ = tx.send((b, out));
            });
        }
    });
    drop(tx);
    let mut outcomes: Vec<_> = rx.iter().collect();
    outcomes.sort_by_key(|(b, _)| *b);
    assert_eq!(outcomes.len(), BATCHES, "every batch called back once");
    for (b, out) in &outcomes {
        assert!(out.persisted, "h{b}: {}", out.to_value());
        assert_eq!(home.rows(&format!("h{b}")).len(), 2);
    }
    let transactions = counter.counts().main.write_locks - before;
    assert!(
        (1..=2).contains(&transactions),
        "16 batches handed over took {transactions} transactions"
    );
}
