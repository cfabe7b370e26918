//! Transcript positions (`seq`) belong to the session's lease holder. With
//! two writers on one session, found by the multi-writer crash torture:
//!
//! - a writer taking the lease over learns the seqs the old holder's
//!   diverted lines hold, and commits after them, so replay puts those
//!   lines back in place;
//! - a fenced writer claims no position: a batch it diverts later (the
//!   guard tripped before the lease was checked) carries no seq, and replay
//!   appends it;
//! - replay never puts a line on a seq another message holds: such a line
//!   goes to the end.
//!
//! Before, each of these left two messages at one seq, interleaving two
//! turns in the transcript.
mod common;
use std::time::Duration;

use common::*;
use serde_json::json;
use turnsafe_host::backend::Backend;
use turnsafe_host::faultvfs::{self, Fault, FileKind, Op};
use turnsafe_host::replay::{ReplayOptions, replay};
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::Cause;

fn opts(holder: &str, ttl_ms: u64) -> StoreOptions {
    StoreOptions {
        holder: holder.into(),
        lease_ttl: Duration::from_millis(ttl_ms),
        ..StoreOptions::default()
    }
}

fn forced_replay(home: &Home) {
    let opts = ReplayOptions {
        force: true,
        ..ReplayOptions::default()
    };
    replay(home.path(), &opts).unwrap();
}

fn transcript(home: &Home) -> Vec<(String, i64)> {
    home.rows("s1").into_iter().map(|(uid, seq, _)| (uid, seq)).collect()
}

fn at(uids: &[&str]) -> Vec<(String, i64)> {
    uids.iter()
        .enumerate()
        .map(|(i, u)| (u.to_string(), i as i64 + 1))
        .collect()
}

#[test]
fn a_takeover_commits_after_the_old_holders_diverted_lines() {
    let home = Home::new();
    faultvfs::register().unwrap();
    let mut a = home.store_with(StoreOptions {
        vfs: Some(faultvfs::VFS_NAME.into()),
        ..opts("a", 400)
    });
    let mut b = home.store_with(opts("b", 30_000));
    assert!(a.append_batch(&sid("s1"), &batch("a1", 2)).persisted);
    let fenced = b.append_batch(&sid("s1"), &batch("b1", 2));
    assert_eq!(fenced.cause, Some(Cause::TurnLease));
    // A's next commit fails (only A writes through the fault VFS): its
    // batch is diverted at seqs 3 and 4.
    let tag = home.path().to_string_lossy().into_owned();
    let fault = faultvfs::arm(Fault::new(&tag, Op::Write, FileKind::Wal, 1)).unwrap();
    let out = a.append_batch(&sid("s1"), &batch("a2", 2));
    drop(fault);
    assert_eq!((out.cause, out.diverted), (Some(Cause::Disk), 2), "{}", out.to_value());
    let lines = receipt_lines(out.receipt.as_ref().unwrap());
    assert_eq!((&lines[0]["seq"], &lines[1]["seq"]), (&json!(3), &json!(4)));
    // A's lease runs out; B takes the session over with its handed-back batch.
    std::thread::sleep(Duration::from_millis(500));
    let out = b.append_batch(&sid("s1"), &batch("b1", 2));
    assert!(out.persisted, "{}", out.to_value());
    forced_replay(&home);
    assert_eq!(transcript(&home), at(&["a1-0", "a1-1", "a2-0", "a2-1", "b1-0", "b1-1"]));
}

#[test]
fn a_fenced_writer_diverts_without_a_position() {
    let home = Home::new();
    let mut a = home.store_with(opts("a", 30_000));
    let mut b = home.store_with(opts("b", 30_000));
    assert!(a.append_batch(&sid("s1"), &batch("a1", 2)).persisted);
    let fenced = b.append_batch(&sid("s1"), &batch("b1", 2));
    assert_eq!(fenced.cause, Some(Cause::TurnLease));
    // The generation is retired under both; B writes first. Its guard trips
    // before any lease is checked, and it diverts.
    let other = home.other();
    other
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(other);
    std::fs::remove_file(home.path().join("state.db-wal")).unwrap();
    std::fs::remove_file(home.path().join("state.db-shm")).unwrap();
    let out = b.append_batch(&sid("s1"), &batch("b2", 2));
    assert_eq!(
        (out.cause, out.diverted),
        (Some(Cause::DeletedWal), 2),
        "{}",
        out.to_value()
    );
    let lines = receipt_lines(out.receipt.as_ref().unwrap());
    assert!(lines.iter().all(|l| l["seq"].is_null()), "{lines:?}");
    // A, the holder, diverts too, at its own positions.
    let out = a.append_batch(&sid("s1"), &batch("a2", 1));
    assert_eq!(out.diverted, 1, "{}", out.to_value());
    let lines = receipt_lines(out.receipt.as_ref().unwrap());
    assert_eq!(lines[0]["seq"], 3);
    drop((a, b));
    // Replay takes the file in order: B's lines, with no place, go to the
    // end; A's line then finds its seq taken, and follows them.
    forced_replay(&home);
    assert_eq!(transcript(&home), at(&["a1-0", "a1-1", "b2-0", "b2-1", "a2-0"]));
}

#[test]
fn replay_never_puts_a_line_on_a_taken_seq() {
    let home = Home::new();
    let mut a = home.store();
    assert!(a.append_batch(&sid("s1"), &batch("a1", 2)).persisted);
    a.release_lease(&sid("s1"));
    drop(a);
    std::fs::create_dir_all(home.path().join("sessions")).unwrap();
    let line = |uid: &str, seq: i64| {
        json!({"v": 2, "session": "s1", "uid": uid, "seq": seq, "batch": "x", "cause": "disk",
               "at": "2026-11-30T00:00:00.000Z", "message": {"role": "user", "content": uid}})
        .to_string()
    };
    // Two lines on seqs committed rows hold, one on a free seq: in file
    // order, d1 goes to the end (3), d2 to its place (4), d3 to the end (5).
    let text = [line("d1", 2), line("d2", 4), line("d3", 1)].join("\n") + "\n";
    std::fs::write(home.divert_file("s1"), text).unwrap();
    forced_replay(&home);
    assert_eq!(
        transcript(&home),
        [("a1-0", 1), ("a1-1", 2), ("d1", 3), ("d2", 4), ("d3", 5)]
            .iter()
            .map(|(u, s)| (u.to_string(), *s))
            .collect::<Vec<_>>()
    );
}
