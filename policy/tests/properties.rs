//! Totality: classify, decide and explain answer every input with a label
//! from the closed sets, and never panic; the JSON entry points answer any
//! string with a JSON object.

use proptest::prelude::*;
use turnsafe_policy::json::{classify_json, copy_to_value, evaluate_json, explain_json};
use turnsafe_policy::machine::DivertReceipt;
use turnsafe_policy::{
    ActionKind, CaptureFailure, CaptureReceipt, Cause, CopyContext, DivertFailure, DivertResidue, Durability, Engine,
    Evidence, HolderPlace, KNOWN_CAPTURE_OPS, KNOWN_DIVERT_OPS, LeaseHolder, Observation, Operation, Outcome, classify,
    decide, explain, is_producible, possible_actions,
};

fn any_holder() -> impl Strategy<Value = Option<LeaseHolder>> {
    proptest::option::of(
        (
            ".{0,80}",
            prop::sample::select(HolderPlace::ALL.to_vec()),
            proptest::option::of(1u32..u32::MAX),
            proptest::option::of(1u32..u32::MAX),
            proptest::option::of(any::<i64>()),
        )
            .prop_map(|(name, place, pid, backend_pid, expires_ms)| LeaseHolder {
                name,
                place,
                pid,
                backend_pid,
                expires_ms,
            }),
    )
}

fn any_code() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        (0i64..30).prop_map(Some),
        prop::sample::select(vec![
            261i64, 262, 267, 517, 520, 523, 526, 773, 778, 779, 787, 1032, 1034, 1544, 2067, 5130, 8458
        ])
        .prop_map(Some),
        any::<i64>().prop_map(Some),
    ]
}

fn any_message() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        prop::sample::select(vec![
            "database is locked",
            "unable to open database file",
            "unable to open database file: database is locked",
            "database disk image is malformed",
            "database or disk is full",
            "disk I/O error",
            "file is not a database",
            "attempt to write a readonly database",
            "fts5: corruption found",
            "FOREIGN KEY constraint failed",
        ])
        .prop_map(String::from),
        ".{0,80}",
    ]
}

/// What may follow a path or a sentence: anything, or one of the texts the
/// fallback knows, alone or as a part of its own.
fn any_tail() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,60}",
        (
            prop::sample::select(turnsafe_policy::known_phrases()),
            prop::sample::select(vec!["", "x: ", "agents: ", "a b: "]),
            ".{0,8}"
        )
            .prop_map(|(phrase, before, after)| format!("{before}{phrase}{after}")),
    ]
}

prop_compose! {
    fn any_observation()(
        operation in prop::sample::select(Operation::ALL.to_vec()),
        code in any_code(),
        extended_code in any_code(),
        message in any_message(),
        errno in prop_oneof![Just(None), (0i64..130).prop_map(Some), any::<i64>().prop_map(Some)],
        evidence in prop::collection::vec(prop::sample::select(Evidence::ALL.to_vec()), 0..4),
        attempt in prop_oneof![0u32..40, any::<u32>()],
        elapsed_ms in prop_oneof![0u64..10_000, any::<u64>()],
        seed in any::<u64>(),
        engine in prop::sample::select(Engine::ALL.to_vec()),
        sqlstate in prop_oneof![
            Just(None),
            prop::sample::select(vec![
                "08000", "08001", "08003", "08006", "57P01", "57P02", "57P03", "53300", "25006", "40001",
                "40P01", "55P03", "53100", "XX001", "XX002", "23505", "23503", "42601", "3D000", "28P01",
            ])
            .prop_map(|s| Some(s.to_string())),
            "[0-9A-Z]{5}".prop_map(Some),
            ".{0,8}".prop_map(Some),
        ],
        lease in any_holder().prop_map(|h| h.map(Box::new)),
    ) -> Observation {
        Observation { operation, engine, sqlstate, code, extended_code, message, errno, evidence, attempt, elapsed_ms, seed, lease }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn decide_is_total_and_consistent(obs in any_observation()) {
        let c = classify(&obs);
        let d = decide(&obs);
        prop_assert_eq!(c, d.classification);
        prop_assert!(Cause::ALL.contains(&c.cause));
        prop_assert_eq!(d.delay_ms.is_some(), d.action == ActionKind::Retry);
        if let Some(delay) = d.delay_ms {
            prop_assert!((1..=500).contains(&delay));
        }
        // deleted_wal comes from evidence only; replaced from evidence or DBMOVED.
        if c.cause == Cause::DeletedWal {
            prop_assert!(obs.has(Evidence::DeletedWalGeneration));
        }
        if c.cause == Cause::Replaced {
            prop_assert!(obs.has(Evidence::DbReplaced) || obs.extended_code == Some(1032)
                || (obs.extended_code.is_none() && obs.code == Some(1032)));
        }
        if matches!(obs.operation, Operation::Open | Operation::AppendBatch) {
            prop_assert!(possible_actions(c.cause).contains(&d.action),
                "{:?} -> {:?} not in the table", c.cause, d.action);
        }
        if obs.operation == Operation::Divert {
            prop_assert_eq!(d.action, ActionKind::FailClosed);
        }
        // An unknown outcome rests on the evidence that COMMIT was sent, and
        // only a lost connection makes it unknown.
        if c.cause == Cause::OutcomeUnknown {
            prop_assert!(obs.has(Evidence::CommitSent));
            let lost = match obs.sqlstate.as_deref() {
                None => obs.engine == Engine::Postgres,
                Some(s) => s.starts_with("08") || matches!(s, "57P01" | "57P02" | "57P03"),
            };
            prop_assert!(lost, "{:?}", obs);
        }
        // The PostgreSQL causes come from a SQLSTATE or that evidence only.
        if matches!(c.cause, Cause::Unavailable | Cause::ReadOnly) {
            prop_assert!(obs.sqlstate.is_some());
        }
    }

    /// With a SQLSTATE, or from PostgreSQL at all, the message adds
    /// nothing: the SQLSTATE and the codes decide.
    #[test]
    fn a_sqlstate_decides_without_the_message(obs in any_observation()) {
        prop_assume!(obs.sqlstate.is_some() || obs.engine == Engine::Postgres);
        let silent = Observation { message: String::new(), ..obs.clone() };
        prop_assert_eq!(classify(&obs), classify(&silent));
    }

    /// Nothing after a path is read (a path may hold `": "` and any
    /// phrase), nor anything after a sentence the fallback does not know
    /// (its detail: a table's name, a column's).
    #[test]
    fn text_after_a_path_or_a_sentence_is_not_read(obs in any_observation(), tail in any_tail()) {
        let with = |message: String| classify(&Observation { message, ..obs.clone() });
        let path = with(format!("{}: /{tail}", obs.message));
        prop_assert_eq!(path, with(obs.message.clone()));
        prop_assert_eq!(with(format!("no such table: {tail}")), with("no such table".into()));
    }

    #[test]
    fn explain_is_total(
        cause in prop::sample::select(Cause::ALL.to_vec()),
        outcome in prop::sample::select(Outcome::ALL.to_vec()),
        session in proptest::option::of(".{0,20}"),
        receipt in proptest::option::of(".{0,40}"),
        op in ".{0,12}",
        errno in proptest::option::of(any::<i64>()),
    ) {
        // Any string as a receipt's path: only an absolute one makes a
        // whole receipt.
        let whole = receipt.as_deref().is_some_and(|p| p.starts_with('/'));
        let ctx = CopyContext {
            session,
            receipt: receipt.clone().map(|path| DivertReceipt { path, offset: 0, length: 9, count: 1, sha256: "ab".repeat(32) }),
            divert_failure: Some(DivertFailure { operation: op, errno }),
            errno,
            ..CopyContext::default()
        };
        match explain(cause, outcome, &ctx) {
            Ok(copy) => {
                prop_assert!(is_producible(cause, outcome));
                prop_assert_eq!(copy.code, format!("{}.{}", cause.label(), outcome.label()));
                prop_assert!(!copy.title.is_empty() && !copy.body.is_empty());
            }
            Err(_) => prop_assert!(
                !is_producible(cause, outcome)
                    || (receipt.is_some() && !whole)
                    || (outcome == Outcome::Diverted && receipt.is_none())
            ),
        }
    }

    /// A capture is claimed only with its receipt, and a divert that may
    /// have left lines behind never says the messages are nowhere.
    #[test]
    fn claims_follow_their_artifacts(
        (cause, outcome) in prop::sample::select(turnsafe_policy::producible_pairs()),
        capture_path in proptest::option::of("/[a-z]{1,8}/state\\.db\\.retired-[0-9]{1,6}"),
        capture_failed in proptest::option::of((prop::sample::select(KNOWN_CAPTURE_OPS.to_vec()), proptest::option::of(0i64..140))),
        residue in any::<bool>(),
        receipt in any::<bool>(),
        divert_op in prop::sample::select(KNOWN_DIVERT_OPS.to_vec()),
        pending in any::<bool>(),
        unsynced in any::<bool>(),
        engine in prop::sample::select(Engine::ALL.to_vec()),
        lease in any_holder(),
    ) {
        let durability = if unsynced { Durability::Unsynced } else { Durability::Synced };
        let ctx = CopyContext {
            session: Some("s1".into()),
            // A diverted copy always has its receipt: that is how it came to be.
            receipt: (receipt || outcome == Outcome::Diverted).then(|| DivertReceipt {
                path: "/h/sessions/s1.jsonl".into(),
                offset: 0,
                length: 9,
                count: 1,
                sha256: "ab".repeat(32),
            }),
            divert_failure: Some(DivertFailure { operation: divert_op.into(), errno: Some(5) }),
            errno: None,
            capture_receipt: capture_path.clone().map(|path| CaptureReceipt { path, files: Vec::new(), manifest_sha256: String::new() }),
            capture_failure: capture_failed.map(|(op, errno)| CaptureFailure { operation: op.into(), errno }),
            divert_residue: residue.then(|| DivertResidue { path: "/h/sessions/s1.jsonl".into(), offset: 7 }),
            pending_capture: pending.then(|| "/h/state.db.retired-20261201T000000Z-9".to_string()),
            durability,
            engine,
            lease: lease.clone(),
        };
        // Every pair sampled is producible: an `Err` here is a failure, not a pass.
        let copy = explain(cause, outcome, &ctx);
        prop_assert!(copy.is_ok(), "{:?}/{:?}: {:?}", cause, outcome, copy);
        if let Ok(copy) = copy {
            let text = copy_to_value(&copy).to_string().to_lowercase();
            let claims_capture = text.contains("was captured") || text.contains("captured at");
            match &capture_path {
                Some(p) if outcome != Outcome::Persisted => {
                    prop_assert!(claims_capture && text.contains(&p.to_lowercase()), "receipt not named: {}", text);
                }
                _ => prop_assert!(!claims_capture, "capture claimed without a receipt: {}", text),
            }
            // A batch kept out by a pending capture names it and how it is
            // settled, and never sends the user to replay without that.
            if pending && outcome != Outcome::Persisted {
                prop_assert!(text.contains("state.db.retired-20261201t000000z-9"), "{}", text);
                prop_assert!(text.contains("--dismiss") && text.contains("--install"), "{}", text);
            }
            if text.contains("turnsafe replay") {
                prop_assert!(
                    !pending || text.find("turnsafe recover").is_some_and(|r| Some(r) < text.find("turnsafe replay")),
                    "replay named before what settles the capture: {}",
                    text
                );
            }
            // An unsynced commit is never called saved: it is written, and
            // the copy says a power cut may still take it.
            if unsynced && outcome == Outcome::Persisted {
                prop_assert!(!text.contains("saved"), "unsynced commit called saved: {}", text);
                prop_assert!(text.contains("power cut"), "{}", text);
            }
            // PostgreSQL's copy names no SQLite command, but for a SQLite
            // capture the context hands it (a receipt, a pending capture).
            if engine == Engine::Postgres && capture_path.is_none() && !pending {
                for sqlite_only in ["turnsafe recover", "turnsafe capture", "--repair-fts", "state.db", "ulimit"] {
                    prop_assert!(!text.contains(sqlite_only), "{}: {}", sqlite_only, text);
                }
            }
            // A lease's holder is named only by the copy of the lease that
            // fenced, and never as working or finishing: only the lease's
            // facts (who, where, until when) and what ends it.
            let names_holder = text.contains("lease_holder");
            prop_assert_eq!(names_holder, lease.is_some() && cause == Cause::TurnLease, "{}", text);
            if cause == Cause::TurnLease {
                for claim in ["finish", "still working", "took over"] {
                    prop_assert!(!text.contains(claim), "{}: {}", claim, text);
                }
                prop_assert!(pending || text.contains("lease ends"), "{}", text);
                if let Some(pid) = lease.as_ref().filter(|h| h.place == HolderPlace::ThisMachine).and_then(|h| h.pid) {
                    prop_assert!(text.contains(&format!("pid {pid} on this machine")), "{}", text);
                }
                if let Some(ms) = lease.as_ref().and_then(|h| h.expires_ms) {
                    prop_assert!(text.contains(" utc"), "expiry {} not named: {}", ms, text);
                }
            }
            if residue && outcome == Outcome::DivertFailed {
                prop_assert!(!text.contains("not stored anywhere"), "{}", text);
                prop_assert!(text.contains("may remain"), "{}", text);
                prop_assert!(!text.contains("s1.jsonl"), "a failed divert names its file: {}", text);
            }
        }
    }

    #[test]
    fn json_entry_points_answer_any_string(s in ".{0,200}") {
        for out in [classify_json(&s), explain_json(&s), evaluate_json(&s)] {
            let v: serde_json::Value = serde_json::from_str(&out).expect("always JSON");
            prop_assert!(v.is_object());
        }
    }

    #[test]
    fn classify_json_answers_any_object(
        code in proptest::option::of(any::<i64>()),
        big in any::<u64>(),
        f in any::<f64>(),
        op in ".{0,12}",
    ) {
        let inputs = [
            serde_json::json!({"code": code, "extended_code": big, "errno": f, "operation": op}),
            serde_json::json!({"code": big, "attempt": -5, "elapsed_ms": -1, "seed": -9, "evidence": [1, "db_replaced", null]}),
            serde_json::json!({"code": "14", "message": 5}),
        ];
        for input in inputs {
            let out: serde_json::Value = serde_json::from_str(&classify_json(&input.to_string())).expect("JSON");
            let ok = out.get("cause").and_then(|c| c.as_str()).is_some_and(|c| Cause::from_label(c).is_some());
            prop_assert!(ok || out.get("error").is_some(), "{}", out);
        }
    }
}

/// An event for the edit machine: success, a failure, or a wait's end.
fn any_edit_event() -> impl Strategy<Value = turnsafe_policy::machine::EditEvent> {
    use turnsafe_policy::machine::EditEvent;
    prop_oneof![
        Just(EditEvent::Succeeded),
        Just(EditEvent::Waited),
        any_observation().prop_map(EditEvent::Failed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The edit machine answers any sequence of events without a panic;
    /// `Done` and `Failed` are final; a wait is followed only by an
    /// attempt; `Done` comes only from a success, and a failure only from
    /// a failed attempt (or a sticky store, before any).
    #[test]
    fn the_edit_machine_is_total_and_ends_once(
        sticky in prop_oneof![Just(None), prop::sample::select(Cause::ALL.to_vec()).prop_map(Some)],
        events in prop::collection::vec(any_edit_event(), 0..40),
    ) {
        use turnsafe_policy::machine::{EditEvent, EditMachine, EditStep};
        let mut m = EditMachine::start(sticky);
        if let Some(cause) = sticky {
            let refused = matches!(m.poll(), EditStep::Failed { attempts: 0, cause: c, .. } if c == cause);
            prop_assert!(refused, "{:?}", m.poll());
        }
        for event in events {
            let before = m.poll();
            let accepted = m.handle(event.clone()).is_ok();
            let after = m.poll();
            match (before, &event, accepted) {
                (EditStep::Done | EditStep::Failed { .. }, _, ok) => {
                    prop_assert!(!ok);
                    prop_assert_eq!(after, before);
                }
                (EditStep::Wait { .. }, EditEvent::Waited, true) => {
                    let attempt = matches!(after, EditStep::Attempt { .. });
                    prop_assert!(attempt, "{:?}", after);
                }
                (EditStep::Attempt { .. }, EditEvent::Succeeded, true) => prop_assert_eq!(after, EditStep::Done),
                (EditStep::Attempt { .. }, EditEvent::Failed(_), true) => {
                    let done = after == EditStep::Done;
                    prop_assert!(!done, "{:?}", after);
                }
                (_, _, false) => prop_assert_eq!(after, before),
                (b, e, true) => prop_assert!(false, "{:?} accepted {:?}", b, e),
            }
        }
    }
}
