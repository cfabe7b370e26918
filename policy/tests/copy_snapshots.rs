//! One snapshot per (cause, outcome) pair the action table can produce,
//! each the JSON copy object. A changed word is a reviewed snapshot change.

use turnsafe_policy::json::copy_to_value;
use turnsafe_policy::{
    CaptureFailure, CaptureReceipt, CapturedFile, Cause, CopyContext, DivertFailure, DivertResidue, Durability,
    Outcome, explain, is_producible, needs_capture, producible_pairs,
};

const RECEIPT: &str = "/home/agent/.turnsafe/sessions/s-7f3a.jsonl";

/// A whole divert receipt for `path`, as a host makes one after fsync.
fn receipt(path: &str) -> turnsafe_policy::machine::DivertReceipt {
    turnsafe_policy::machine::DivertReceipt {
        path: path.into(),
        offset: 0,
        length: 231,
        count: 1,
        sha256: "5f2b".repeat(16),
    }
}

const CAPTURE: &str = "/home/agent/.turnsafe/state.db.retired-20261130T120000Z-4242";

fn context_for(outcome: Outcome) -> CopyContext {
    CopyContext {
        session: Some("s-7f3a".into()),
        receipt: (outcome == Outcome::Diverted).then(|| receipt(RECEIPT)),
        divert_failure: (outcome == Outcome::DivertFailed).then(|| DivertFailure {
            operation: "open".into(),
            errno: Some(24),
        }),
        ..CopyContext::default()
    }
}

fn capture_receipt() -> CaptureReceipt {
    CaptureReceipt {
        path: CAPTURE.into(),
        files: vec![
            CapturedFile {
                name: "state.db".into(),
                size: 8192,
            },
            CapturedFile {
                name: "state.db-wal".into(),
                size: 41_232,
            },
        ],
        manifest_sha256: "9f2c".repeat(16),
    }
}

/// One snapshot per variant an artifact adds: a capture receipt and a
/// failed capture for every cause that captures, and a divert residue for
/// every cause that can end in `divert_failed`.
#[test]
fn one_snapshot_per_artifact_variant() {
    let mut n = 0;
    turnsafe_tests::snapshot_settings().bind(|| {
        for (cause, outcome) in producible_pairs() {
            if needs_capture(cause) {
                let variants = [
                    (
                        "capture_receipt",
                        CopyContext {
                            capture_receipt: Some(capture_receipt()),
                            ..context_for(outcome)
                        },
                    ),
                    (
                        "capture_failed",
                        CopyContext {
                            capture_failure: Some(CaptureFailure {
                                operation: "mkdir".into(),
                                errno: Some(2),
                            }),
                            ..context_for(outcome)
                        },
                    ),
                ];
                for (name, ctx) in variants {
                    let copy = explain(cause, outcome, &ctx).expect("explains");
                    insta::assert_json_snapshot!(
                        format!("copy__{}__{}__{name}", cause.label(), outcome.label()),
                        copy_to_value(&copy)
                    );
                    n += 1;
                }
            }
            if outcome == Outcome::DivertFailed {
                let ctx = CopyContext {
                    divert_failure: Some(DivertFailure {
                        operation: "fsync".into(),
                        errno: Some(5),
                    }),
                    divert_residue: Some(DivertResidue {
                        path: RECEIPT.into(),
                        offset: 4096,
                    }),
                    ..context_for(outcome)
                };
                let copy = explain(cause, outcome, &ctx).expect("explains");
                insta::assert_json_snapshot!(
                    format!("copy__{}__{}__residue", cause.label(), outcome.label()),
                    copy_to_value(&copy)
                );
                n += 1;
            }
            // A commit the host does not sync (SQLite `synchronous=NORMAL`):
            // written, not yet safe from a power cut, never plainly "saved".
            if outcome == Outcome::Persisted {
                let ctx = CopyContext {
                    durability: Durability::Unsynced,
                    ..context_for(outcome)
                };
                let copy = explain(cause, outcome, &ctx).expect("explains");
                insta::assert_json_snapshot!(
                    format!("copy__{}__{}__unsynced", cause.label(), outcome.label()),
                    copy_to_value(&copy)
                );
                n += 1;
            }
            // A batch kept out of the database by an unsettled capture that
            // holds its session's rows: the capture's cause, its path, and
            // what settles it before replay.
            let sticky_or_unknown = matches!(
                cause,
                Cause::Replaced | Cause::DeletedWal | Cause::Corrupt | Cause::Unknown
            );
            if sticky_or_unknown && matches!(outcome, Outcome::Diverted | Outcome::DivertFailed) {
                let ctx = CopyContext {
                    pending_capture: Some(CAPTURE.into()),
                    ..context_for(outcome)
                };
                let copy = explain(cause, outcome, &ctx).expect("explains");
                insta::assert_json_snapshot!(
                    format!("copy__{}__{}__pending_capture", cause.label(), outcome.label()),
                    copy_to_value(&copy)
                );
                n += 1;
            }
        }
    });
    assert!(n >= 23, "only {n} artifact variants");
}

#[test]
fn a_capture_is_claimed_only_with_its_receipt() {
    for cause in [Cause::Replaced, Cause::DeletedWal] {
        for outcome in [Outcome::Diverted, Outcome::DivertFailed] {
            let plain = copy_to_value(&explain(cause, outcome, &context_for(outcome)).unwrap()).to_string();
            assert!(!plain.contains("was captured"), "{plain}");
            let ctx = CopyContext {
                capture_receipt: Some(capture_receipt()),
                ..context_for(outcome)
            };
            let with = copy_to_value(&explain(cause, outcome, &ctx).unwrap());
            assert!(
                with["body"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("captured at {CAPTURE}")),
                "{with}"
            );
            assert_eq!(with["details"]["capture_path"], CAPTURE);
            let ctx = CopyContext {
                capture_failure: Some(turnsafe_policy::parse_capture_failure(
                    "capture of the retired generation failed at mkdir: No such file or directory (os error 2)",
                )),
                ..context_for(outcome)
            };
            let failed = copy_to_value(&explain(cause, outcome, &ctx).unwrap()).to_string();
            assert!(!failed.contains("was captured"), "{failed}");
            assert!(
                failed.contains(
                    "Capturing the retired database generation failed (mkdir: no such file or directory (ENOENT))"
                ),
                "{failed}"
            );
            // The frames are in the writer's open files: the copy keeps them
            // first, and never asks to stop the writer before that.
            let capture_step = failed.find("turnsafe capture --pid").expect(&failed);
            assert!(!failed.contains("recover --source state.db"), "{failed}");
            if let Some(stop) = failed.find("stop every process") {
                assert!(stop > capture_step, "a stop before the capture: {failed}");
            }
        }
    }
}

#[test]
fn python_errno_text_keeps_its_errno_beside_a_path() {
    let f = turnsafe_policy::parse_divert_failure("[Errno 24] Too many open files: '/home/agent/.h/sessions/s1.jsonl'");
    assert_eq!(f.errno, Some(24));
    let f = turnsafe_policy::parse_divert_failure("open: [Errno 13] Permission denied: '/x/y'");
    assert_eq!(
        f,
        DivertFailure {
            operation: "open".into(),
            errno: Some(13)
        }
    );
    let copy = copy_to_value(
        &explain(
            Cause::Disk,
            Outcome::DivertFailed,
            &CopyContext {
                divert_failure: Some(f),
                ..CopyContext::default()
            },
        )
        .unwrap(),
    )
    .to_string();
    assert!(copy.contains("EACCES") && !copy.contains("/x/y"), "{copy}");
}

#[test]
fn one_snapshot_per_producible_pair() {
    let pairs = producible_pairs();
    assert!(pairs.len() >= 25, "only {} pairs", pairs.len());
    turnsafe_tests::snapshot_settings().bind(|| {
        for (cause, outcome) in pairs {
            let copy = explain(cause, outcome, &context_for(outcome)).expect("producible pair explains");
            insta::assert_json_snapshot!(
                format!("copy__{}__{}", cause.label(), outcome.label()),
                copy_to_value(&copy)
            );
        }
    });
}

#[test]
fn only_a_receipt_earns_a_copy_was_kept() {
    for cause in Cause::ALL {
        for outcome in Outcome::ALL {
            if !is_producible(cause, outcome) {
                assert!(explain(cause, outcome, &context_for(Outcome::Diverted)).is_err());
                continue;
            }
            // Offer every copy a receipt path and a divert failure: only a
            // diverted copy may use the path, and it must.
            let ctx = CopyContext {
                session: Some("s".into()),
                receipt: Some(receipt(RECEIPT)),
                divert_failure: Some(DivertFailure {
                    operation: "fsync".into(),
                    errno: Some(28),
                }),
                errno: Some(24),
                ..CopyContext::default()
            };
            let copy = copy_to_value(&explain(cause, outcome, &ctx).expect("explains")).to_string();
            let kept = copy.to_lowercase().contains("a copy was kept");
            let names_file = copy.contains(RECEIPT) || copy.contains(".jsonl") || copy.contains("sessions/");
            if outcome == Outcome::Diverted {
                assert!(
                    kept && copy.contains(RECEIPT),
                    "{cause:?}: diverted copy must name the receipt: {copy}"
                );
            } else {
                assert!(!kept, "{cause:?}/{outcome:?} claims a copy: {copy}");
                assert!(!names_file, "{cause:?}/{outcome:?} names a divert file: {copy}");
            }
        }
    }
}

#[test]
fn a_diverted_copy_cannot_be_built_without_a_receipt() {
    let err = explain(Cause::Disk, Outcome::Diverted, &CopyContext::default()).unwrap_err();
    assert_eq!(err.to_string(), "a `diverted` copy needs the divert receipt");
    // A receipt that is not whole earns no claim either.
    for bad in [
        receipt("relative/s1.jsonl"),
        turnsafe_policy::machine::DivertReceipt {
            count: 0,
            ..receipt(RECEIPT)
        },
        turnsafe_policy::machine::DivertReceipt {
            sha256: "abc".into(),
            ..receipt(RECEIPT)
        },
    ] {
        let ctx = CopyContext {
            receipt: Some(bad),
            ..CopyContext::default()
        };
        let err = explain(Cause::Disk, Outcome::Diverted, &ctx).unwrap_err();
        assert!(err.to_string().starts_with("the divert receipt is not whole"), "{err}");
    }
}

#[test]
fn a_divert_failure_is_told_by_operation_and_errno_only() {
    let failure = turnsafe_policy::parse_divert_failure(
        "open /home/agent/.turnsafe/sessions/s1.jsonl: Too many open files (os error 24)",
    );
    assert_eq!(
        failure,
        DivertFailure {
            operation: "open".into(),
            errno: Some(24)
        }
    );
    let ctx = CopyContext {
        divert_failure: Some(failure),
        ..CopyContext::default()
    };
    let copy = copy_to_value(&explain(Cause::Disk, Outcome::DivertFailed, &ctx).unwrap()).to_string();
    assert!(copy.contains("open: too many open files (EMFILE)"), "{copy}");
    assert!(!copy.contains("/home/agent"), "{copy}");
    // An operation word that could carry a path is not repeated.
    let ctx = CopyContext {
        divert_failure: Some(DivertFailure {
            operation: "/etc/passwd".into(),
            errno: None,
        }),
        ..CopyContext::default()
    };
    let copy = copy_to_value(&explain(Cause::Disk, Outcome::DivertFailed, &ctx).unwrap()).to_string();
    assert!(!copy.contains("/etc/passwd"), "{copy}");
}

#[test]
fn cantopen_errno_shapes_the_detail_only() {
    let ctx = CopyContext {
        errno: Some(24),
        receipt: Some(receipt(RECEIPT)),
        ..CopyContext::default()
    };
    let copy = copy_to_value(&explain(Cause::Disk, Outcome::Diverted, &ctx).unwrap());
    assert_eq!(copy["details"]["errno"], "too many open files (EMFILE)");
}
