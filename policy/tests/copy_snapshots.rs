//! One snapshot per (cause, outcome) pair the action table can produce,
//! each the JSON copy object. A changed word is a reviewed snapshot change.

use turnsafe_policy::json::copy_to_value;
use turnsafe_policy::machine::{Event, Failure, FlushStart, Handle, Step};
use turnsafe_policy::{
    CaptureFailure, CaptureReceipt, CapturedFile, Cause, CopyContext, DivertFailure, DivertResidue, Durability, Engine,
    Observation, Operation, Outcome, TlsFailure, explain, is_producible, needs_capture, producible_pairs,
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

/// A PostgreSQL connection that failed its TLS handshake, as the host
/// reports it: no SQLSTATE, `SQLITE_IOERR` (so `disk`), and the reason
/// named in its message before the client's own text.
fn tls_failure(reason: TlsFailure, client_text: &str) -> Failure {
    Failure {
        engine: Engine::Postgres,
        sqlstate: None,
        code: Some(10),
        message: format!("postgres SQLSTATE none: {}: {client_text}", reason.text()),
        ..Failure::default()
    }
}

const TLS_CASES: [(TlsFailure, &str, &str); 2] = [
    (
        TlsFailure::NotOffered,
        "tls_not_offered",
        "error performing TLS handshake: server does not support TLS",
    ),
    (
        TlsFailure::Certificate,
        "tls_certificate",
        "error performing TLS handshake: invalid peer certificate: UnknownIssuer",
    ),
];

/// The copy of a flush whose open failed with `failure`, then diverted
/// (or failed to), through the flush machine every host drives.
fn flush_copy(failure: Failure, outcome: Outcome) -> turnsafe_policy::Copy {
    let mut h = Handle::new();
    h.start(FlushStart {
        session: "s-7f3a".into(),
        uids: vec!["u1".into()],
        ..FlushStart::default()
    })
    .unwrap();
    assert_eq!(h.poll(), Some(Step::Open));
    h.handle(Event::Failed(failure)).unwrap();
    assert_eq!(h.poll(), Some(Step::Divert { cause: Cause::Disk }));
    h.handle(match outcome {
        Outcome::Diverted => Event::Diverted(receipt(RECEIPT)),
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
        Some(Step::Done(report)) => report.copy.expect("a failed flush has copy"),
        other => panic!("not done: {other:?}"),
    }
}

/// A server and a URL that disagree on TLS: the cause stays `disk`, but
/// the copy names the handshake, the reason in its `tls` detail, and the
/// URL's `sslmode` and `sslrootcert` instead of the disk's checks.
#[test]
fn one_snapshot_per_tls_reason() {
    turnsafe_tests::snapshot_settings().bind(|| {
        for (reason, name, client_text) in TLS_CASES {
            for outcome in [Outcome::Diverted, Outcome::DivertFailed] {
                let copy = flush_copy(tls_failure(reason, client_text), outcome);
                let value = copy_to_value(&copy);
                assert_eq!(value["cause"], "disk", "{value}");
                assert_eq!(value["details"]["tls"], reason.text(), "{value}");
                let body = value["body"].as_str().unwrap();
                assert!(
                    body.starts_with("The TLS handshake with the database server failed"),
                    "{body}"
                );
                assert!(!body.contains("opened or written"), "{body}");
                let first = value["remediation"][0].as_str().unwrap();
                assert!(first.contains("sslmode") && first.contains("sslrootcert"), "{value}");
                assert_eq!(first, turnsafe_policy::TLS_REMEDIATION);
                assert!(!value.to_string().contains("ulimit"), "no disk checks: {value}");
                // The client's own text is not repeated to the user.
                assert!(!value.to_string().contains("UnknownIssuer"), "{value}");
                insta::assert_json_snapshot!(format!("copy__disk__{}__{name}", outcome.label()), value);
            }
        }
    });
}

/// `evaluate-json` gives a failure's copy as the flush machine does.
#[test]
fn evaluate_gives_the_tls_copy_the_machine_gives() {
    for (reason, _, client_text) in TLS_CASES {
        let failure = tls_failure(reason, client_text);
        let request = serde_json::json!({
            "observation": {
                "operation": "open",
                "engine": "postgres",
                "code": 10,
                "message": failure.message,
            },
            "context": { "session": "s-7f3a", "receipt": receipt(RECEIPT) },
        });
        let out: serde_json::Value =
            serde_json::from_str(&turnsafe_policy::json::evaluate_json(&request.to_string())).unwrap();
        assert_eq!(out["cause"], "disk", "{out}");
        assert_eq!(
            out["copy"],
            copy_to_value(&flush_copy(failure, Outcome::Diverted)),
            "{out}"
        );
    }
}

/// The reason is read only where the whole message is the host's and the
/// cause is the one a failed handshake gets: never with a SQLSTATE (the
/// server's text may follow it), never for another cause, and text alone
/// makes no cause.
#[test]
fn the_tls_reason_refines_only_a_disk_copy_without_sqlstate() {
    let text = "postgres SQLSTATE none: the server does not offer TLS: error performing TLS handshake";
    let obs = |sqlstate: Option<&str>, engine: Engine| Observation {
        engine,
        sqlstate: sqlstate.map(String::from),
        code: Some(10),
        message: text.into(),
        ..Observation::new(Operation::Open)
    };
    assert_eq!(
        TlsFailure::of(&obs(None, Engine::Postgres)),
        Some(TlsFailure::NotOffered)
    );
    assert_eq!(TlsFailure::of(&obs(Some("08006"), Engine::Postgres)), None);
    assert_eq!(TlsFailure::of(&obs(None, Engine::Sqlite)), None);
    let certificate = Observation {
        message: "postgres SQLSTATE none: the server's certificate failed verification: x".into(),
        ..obs(None, Engine::Postgres)
    };
    assert_eq!(TlsFailure::of(&certificate), Some(TlsFailure::Certificate));

    // With a SQLSTATE the copy is the cause's own.
    let lost = Failure {
        sqlstate: Some("08006".into()),
        ..tls_failure(TlsFailure::NotOffered, "x")
    };
    let h = |failure: Failure| {
        let mut h = Handle::new();
        h.start(FlushStart {
            session: "s".into(),
            uids: vec!["u".into()],
            ..FlushStart::default()
        })
        .unwrap();
        h.handle(Event::Failed(failure)).unwrap();
        h
    };
    let mut lost_handle = h(lost);
    assert!(
        matches!(lost_handle.poll(), Some(Step::Wait { .. })),
        "unavailable retries"
    );
    // Text alone, with no code, is no cause at all.
    let bare = Observation {
        code: None,
        ..obs(None, Engine::Postgres)
    };
    assert_eq!(turnsafe_policy::classify(&bare).cause, Cause::Unknown);
    let request = serde_json::json!({
        "observation": { "operation": "open", "engine": "postgres", "message": text },
        "context": { "receipt": receipt(RECEIPT) },
    });
    let out: serde_json::Value =
        serde_json::from_str(&turnsafe_policy::json::evaluate_json(&request.to_string())).unwrap();
    assert_eq!(out["copy"]["code"], "unknown.diverted", "{out}");
    assert!(out["copy"]["details"].get("tls").is_none(), "{out}");
    // An explained `disk` copy (no failure behind it) names no TLS reason.
    let plain = copy_to_value(&explain(Cause::Disk, Outcome::Diverted, &context_for(Outcome::Diverted)).unwrap());
    assert!(plain["details"].get("tls").is_none(), "{plain}");
}

/// The holders a fenced write can meet, as hosts read them from a lease.
fn lease_holders() -> Vec<(&'static str, turnsafe_policy::LeaseHolder)> {
    use turnsafe_policy::{HolderPlace, LeaseHolder};
    // 2026-12-07T12:00:31Z
    let expires = Some(1_796_644_831_000);
    vec![
        (
            "this_machine",
            LeaseHolder {
                name: "pid-4242".into(),
                place: HolderPlace::ThisMachine,
                pid: Some(4242),
                backend_pid: None,
                expires_ms: expires,
            },
        ),
        (
            "other_machine",
            LeaseHolder {
                name: "worker-7".into(),
                place: HolderPlace::OtherMachine,
                pid: Some(4242),
                backend_pid: None,
                expires_ms: expires,
            },
        ),
        (
            "backend",
            LeaseHolder {
                name: "worker-7".into(),
                place: HolderPlace::OtherMachine,
                pid: Some(4242),
                backend_pid: Some(31337),
                expires_ms: expires,
            },
        ),
        (
            "unknown",
            LeaseHolder {
                name: "an older writer".into(),
                place: HolderPlace::Unknown,
                pid: None,
                backend_pid: None,
                expires_ms: expires,
            },
        ),
    ]
}

/// A write fenced by another holder's lease, through the flush machine:
/// the copy names the holder, where it runs and when its lease ends, says
/// what ends it, and never that the holder is working.
#[test]
fn one_snapshot_per_lease_holder() {
    turnsafe_tests::snapshot_settings().bind(|| {
        for (name, holder) in lease_holders() {
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
            h.handle(Event::Failed(Failure {
                message: "the session's turn lease is held by another writer".into(),
                evidence: vec![turnsafe_policy::Evidence::TurnLeaseLost],
                lease: Some(Box::new(holder.clone())),
                ..Failure::default()
            }))
            .unwrap();
            let copy = match h.poll() {
                Some(Step::Done(report)) => report.copy.expect("a fenced flush has copy"),
                other => panic!("not done: {other:?}"),
            };
            let value = copy_to_value(&copy);
            assert_eq!(value["code"], "turn_lease.handed_back", "{value}");
            assert_eq!(value["details"]["lease_holder"], holder.name.as_str(), "{value}");
            assert_eq!(value["details"]["lease_expires"], "2026-12-07T12:00:31Z", "{value}");
            let body = value["body"].as_str().unwrap();
            assert!(body.contains("until 12:00:31 UTC"), "{body}");
            assert!(!value.to_string().contains("finish"), "{value}");
            // evaluate-json, given the same observation, gives the same copy.
            let request = serde_json::json!({
                "observation": {
                    "operation": "append_batch",
                    "message": "the session's turn lease is held by another writer",
                    "evidence": ["turn_lease_lost"],
                    "lease": {
                        "name": holder.name,
                        "place": holder.place.label(),
                        "pid": holder.pid,
                        "backend_pid": holder.backend_pid,
                        "expires_ms": holder.expires_ms,
                    },
                },
                "context": {"session": "s-7f3a"},
            });
            let evaluated: serde_json::Value =
                serde_json::from_str(&turnsafe_policy::json::evaluate_json(&request.to_string())).unwrap();
            assert_eq!(evaluated["copy"], value, "{evaluated}");
            insta::assert_json_snapshot!(format!("copy__turn_lease__handed_back__{name}"), value);
        }
    });
}
