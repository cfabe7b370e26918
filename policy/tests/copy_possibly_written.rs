//! A batch whose COMMIT failed after its write (SQLite: the WAL's sync
//! failed with the frames already in the file) is not in the database now,
//! and the next open's WAL recovery may bring it back. Its copy, from the
//! flush machine every host drives and from `evaluate-json`, says so:
//! possibly written, never "not saved" or "not stored anywhere". A failure
//! before COMMIT keeps the plain copy.

use turnsafe_policy::json::copy_to_value;
use turnsafe_policy::machine::{DivertReceipt, Event, Failure, FlushStart, Handle, Step};
use turnsafe_policy::{Cause, CopyContext, DivertFailure, Evidence, Outcome, explain};

const RECEIPT: &str = "/home/agent/.turnsafe/sessions/s-7f3a.jsonl";

fn receipt() -> DivertReceipt {
    DivertReceipt {
        path: RECEIPT.into(),
        offset: 0,
        length: 231,
        count: 1,
        sha256: "5f2b".repeat(16),
    }
}

/// SQLite's failure of a write attempt: `extended_code`, and whether it
/// was COMMIT that failed (the host's evidence `commit_sent`).
fn write_failure(extended_code: i64, at_commit: bool) -> Failure {
    Failure {
        code: Some(extended_code & 0xff),
        extended_code: Some(extended_code),
        message: "disk I/O error".into(),
        errno: Some(5),
        evidence: if at_commit { vec![Evidence::CommitSent] } else { vec![] },
        ..Failure::default()
    }
}

/// The copy of a flush whose open succeeded and whose write failed with
/// `failure`, then diverted (or failed to).
fn flush_copy(failure: Failure, cause: Cause, outcome: Outcome) -> turnsafe_policy::Copy {
    let mut h = Handle::new();
    h.start(FlushStart {
        session: "s-7f3a".into(),
        uids: vec!["u1".into()],
        ..FlushStart::default()
    })
    .unwrap();
    assert_eq!(h.poll(), Some(Step::Open));
    h.handle(Event::Opened).unwrap();
    assert!(matches!(h.poll(), Some(Step::Write(_))));
    h.handle(Event::Failed(failure)).unwrap();
    assert_eq!(h.poll(), Some(Step::Divert { cause }), "the batch is diverted");
    h.handle(match outcome {
        Outcome::Diverted => Event::Diverted(receipt()),
        _ => Event::DivertFailed {
            failure: DivertFailure {
                operation: "open".into(),
                errno: Some(24),
            },
            message: "Too many open files (os error 24)".into(),
            residue: None,
        },
    })
    .unwrap();
    match h.poll() {
        Some(Step::Done(report)) => {
            assert_eq!(report.committed, 0, "not committed: nothing reads it now");
            report.copy.expect("a failed flush has copy")
        }
        other => panic!("not done: {other:?}"),
    }
}

/// The WAL's sync failed at COMMIT (`SQLITE_IOERR_FSYNC`).
const FSYNC: i64 = 1034;

#[test]
fn one_snapshot_per_outcome_of_a_commit_that_failed_after_its_write() {
    turnsafe_tests::snapshot_settings().bind(|| {
        for outcome in [Outcome::Diverted, Outcome::DivertFailed] {
            let copy = flush_copy(write_failure(FSYNC, true), Cause::Disk, outcome);
            let value = copy_to_value(&copy);
            let body = value["body"].as_str().unwrap();
            assert!(body.contains("COMMIT failed after writing"), "{body}");
            assert!(body.contains("not in the session database now"), "{body}");
            assert!(body.contains("its next open may bring them back"), "{body}");
            assert!(!body.contains("were not saved"), "{body}");
            assert!(!body.contains("not stored anywhere"), "{body}");
            assert!(value["title"].as_str().unwrap().contains("possibly"), "{value}");
            assert_eq!(value["details"]["commit"], "possibly written", "{value}");
            insta::assert_json_snapshot!(format!("copy__disk__{}__possibly_written", outcome.label()), value);
        }
    });
}

/// Replay settles a kept message the database holds again as a
/// duplicate, and a batch handed back is resent with its uids: either way
/// no message is stored twice.
#[test]
fn replay_and_a_resend_store_each_message_once() {
    let diverted = flush_copy(write_failure(FSYNC, true), Cause::Disk, Outcome::Diverted);
    let last = diverted.remediation.last().unwrap();
    assert!(
        last.contains("turnsafe replay") && last.contains("as a duplicate"),
        "{last}"
    );
    let failed = flush_copy(write_failure(FSYNC, true), Cause::Disk, Outcome::DivertFailed);
    let last = failed.remediation.last().unwrap();
    assert!(last.contains("with the uids this outcome lists"), "{last}");
    assert!(last.contains("none is stored twice"), "{last}");
}

/// A write that failed before COMMIT (a frame written at a cache spill,
/// say) or a COMMIT that never got its lock wrote nothing that can come
/// back: the plain copy, word for word.
#[test]
fn a_failure_before_commits_write_keeps_the_plain_copy() {
    for outcome in [Outcome::Diverted, Outcome::DivertFailed] {
        let ctx = CopyContext {
            session: Some("s-7f3a".into()),
            errno: Some(5),
            receipt: (outcome == Outcome::Diverted).then(receipt),
            divert_failure: (outcome == Outcome::DivertFailed).then(|| DivertFailure {
                operation: "open".into(),
                errno: Some(24),
            }),
            ..CopyContext::default()
        };
        let plain = explain(Cause::Disk, outcome, &ctx).unwrap();
        assert_eq!(flush_copy(write_failure(778, false), Cause::Disk, outcome), plain);
        assert_eq!(flush_copy(write_failure(FSYNC, false), Cause::Disk, outcome), plain);
        assert!(plain.body.contains("were not saved"), "{plain:?}");
    }
}

/// A COMMIT whose frames could not be written (a full disk, a failed
/// write) left no commit frame in the WAL: not written, the plain copy. A
/// sync that ran out of space after the writes is possibly written.
#[test]
fn a_commit_whose_frames_were_not_written_is_not_possibly_written() {
    for (code, cause) in [(13, Cause::DiskFull), (778, Cause::Disk)] {
        let copy = flush_copy(write_failure(code, true), cause, Outcome::Diverted);
        assert!(copy.body.contains("were not saved"), "{copy:?}");
        assert!(!copy.title.contains("possibly"), "{copy:?}");
    }
    let enospc_at_sync = Failure {
        errno: Some(28),
        ..write_failure(FSYNC, true)
    };
    let copy = flush_copy(enospc_at_sync, Cause::DiskFull, Outcome::Diverted);
    assert_eq!(copy.code, "disk_full.diverted");
    assert!(copy.body.contains("COMMIT failed after writing"), "{copy:?}");
}

/// `evaluate-json` gives the copy the flush machine gives.
#[test]
fn evaluate_gives_the_copy_the_machine_gives() {
    for (at_commit, evidence) in [(true, vec!["commit_sent"]), (false, vec![])] {
        let request = serde_json::json!({
            "observation": {
                "operation": "append_batch",
                "code": 10,
                "extended_code": FSYNC,
                "message": "disk I/O error",
                "errno": 5,
                "evidence": evidence,
            },
            "context": { "session": "s-7f3a", "receipt": receipt() },
        });
        let out: serde_json::Value =
            serde_json::from_str(&turnsafe_policy::json::evaluate_json(&request.to_string())).unwrap();
        assert_eq!(out["cause"], "disk", "{out}");
        assert_eq!(
            out["copy"],
            copy_to_value(&flush_copy(
                write_failure(FSYNC, at_commit),
                Cause::Disk,
                Outcome::Diverted
            )),
            "{out}"
        );
    }
}
