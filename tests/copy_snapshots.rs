//! One snapshot per (cause, outcome) pair the action table can produce,
//! each the JSON copy object. A changed word is a reviewed snapshot change.

use turnsafe_policy::json::copy_to_value;
use turnsafe_policy::{Cause, CopyContext, DivertFailure, Outcome, explain, is_producible, producible_pairs};

const RECEIPT: &str = "/home/agent/.turnsafe/sessions/s-7f3a.jsonl";

fn context_for(outcome: Outcome) -> CopyContext {
    CopyContext {
        session: Some("s-7f3a".into()),
        receipt_path: (outcome == Outcome::Diverted).then(|| RECEIPT.to_string()),
        divert_failure: (outcome == Outcome::DivertFailed).then(|| DivertFailure {
            operation: "open".into(),
            errno: Some(24),
        }),
        errno: None,
    }
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
                receipt_path: Some(RECEIPT.into()),
                divert_failure: Some(DivertFailure {
                    operation: "fsync".into(),
                    errno: Some(28),
                }),
                errno: Some(24),
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
    assert_eq!(err.to_string(), "a `diverted` copy needs the receipt path");
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
        receipt_path: Some(RECEIPT.into()),
        ..CopyContext::default()
    };
    let copy = copy_to_value(&explain(Cause::Disk, Outcome::Diverted, &ctx).unwrap());
    assert_eq!(copy["details"]["errno"], "too many open files (EMFILE)");
}
