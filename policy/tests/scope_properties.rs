//! The failure scope of a group write and the search index's catch-up:
//! each answers every observation, from the facts its rule names and no
//! others, and the JSON entry point answers what the typed function does.

use proptest::prelude::*;
use serde_json::{Value, json};
use turnsafe_policy::json::decide_scope_json;
use turnsafe_policy::machine::background::{IndexNext, after_index_failure};
use turnsafe_policy::machine::{Scope, failure_scope};
use turnsafe_policy::{ActionKind, Cause, Engine, Evidence, Observation, Operation, classify, decide};

/// The SQLite primary codes after which nothing more is written in the
/// transaction.
const ENDING_PRIMARY: [i64; 11] = [5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 26];

fn any_code() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        (0i64..30).prop_map(Some),
        prop::sample::select(vec![261i64, 267, 517, 773, 778, 779, 787, 1032, 2067, 8458]).prop_map(Some),
        any::<i64>().prop_map(Some),
    ]
}

fn any_sqlstate() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        prop::sample::select(vec![
            "08000", "08006", "57P01", "57014", "53100", "53300", "25006", "25P02", "40001", "40P01", "55P03", "55000",
            "55006", "58030", "XX001", "XX000", "23505", "23503", "22001", "42601",
        ])
        .prop_map(|s| Some(s.to_string())),
        "[0-9A-Z]{5}".prop_map(Some),
    ]
}

prop_compose! {
    fn any_observation()(
        operation in prop::sample::select(Operation::ALL.to_vec()),
        engine in prop::sample::select(Engine::ALL.to_vec()),
        sqlstate in any_sqlstate(),
        code in any_code(),
        extended_code in any_code(),
        message in prop_oneof![Just(String::new()), ".{0,40}"],
        errno in proptest::option::of(0i64..130),
        evidence in prop::collection::vec(prop::sample::select(Evidence::ALL.to_vec()), 0..3),
        attempt in 1u32..40,
        elapsed_ms in 0u64..100_000,
        seed in any::<u64>(),
    ) -> Observation {
        Observation {
            operation, engine, sqlstate, code, extended_code, message, errno,
            evidence: evidence.into_iter().collect::<std::collections::BTreeSet<_>>().into_iter().collect(),
            attempt, elapsed_ms, seed, lease: None,
        }
    }
}

/// The rule, written out again from its statement: what the code says.
fn by_code(obs: &Observation) -> Scope {
    let ends = match obs.engine {
        Engine::Sqlite => obs
            .extended_code
            .or(obs.code)
            .is_some_and(|c| ENDING_PRIMARY.contains(&(c & 0xff))),
        Engine::Postgres => match obs.sqlstate.as_deref() {
            None => true,
            Some("55P03") => false,
            Some("25P02") => true,
            Some(s) => ["08", "40", "53", "55", "57", "58", "XX"].contains(&&s[..2]),
        },
    };
    if ends { Scope::Transaction } else { Scope::Batch }
}

fn as_json(obs: &Observation) -> Value {
    json!({
        "operation": obs.operation.label(),
        "engine": obs.engine.label(),
        "sqlstate": obs.sqlstate,
        "code": obs.code,
        "extended_code": obs.extended_code,
        "message": obs.message,
        "errno": obs.errno,
        "evidence": obs.evidence.iter().map(|e| e.label()).collect::<Vec<_>>(),
        "attempt": obs.attempt,
        "elapsed_ms": obs.elapsed_ms,
        "seed": obs.seed,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn the_scope_follows_its_rule(obs in any_observation(), open in any::<bool>()) {
        let scope = failure_scope(&obs, open);
        let store_evidence = [Evidence::DeletedWalGeneration, Evidence::DbReplaced, Evidence::CommitSent];
        let session_evidence = [Evidence::TurnLeaseLost, Evidence::CompressionInProgress, Evidence::CompressionClosed];
        let expected = if !open || obs.evidence.iter().any(|e| store_evidence.contains(e)) {
            Scope::Transaction
        } else if obs.evidence.iter().any(|e| session_evidence.contains(e)) {
            Scope::Batch
        } else {
            by_code(&obs)
        };
        prop_assert_eq!(scope, expected);
    }

    #[test]
    fn the_scope_reads_no_message_errno_operation_or_time(obs in any_observation(), other in any_observation(), open in any::<bool>()) {
        let mut moved = obs.clone();
        moved.message = other.message;
        moved.errno = other.errno;
        moved.operation = other.operation;
        moved.attempt = other.attempt;
        moved.elapsed_ms = other.elapsed_ms;
        moved.seed = other.seed;
        prop_assert_eq!(failure_scope(&obs, open), failure_scope(&moved, open));
    }

    #[test]
    fn an_engine_that_ended_the_transaction_is_always_the_transaction(obs in any_observation()) {
        prop_assert_eq!(failure_scope(&obs, false), Scope::Transaction);
    }

    #[test]
    fn the_json_entry_point_answers_what_the_function_does(obs in any_observation(), open in any::<bool>()) {
        let request = json!({ "observation": as_json(&obs), "transaction_open": open }).to_string();
        let out: Value = serde_json::from_str(&decide_scope_json(&request)).expect("JSON");
        prop_assert_eq!(out, json!({ "scope": failure_scope(&obs, open).label() }));
    }

    #[test]
    fn any_text_gets_a_json_object(text in ".{0,200}") {
        let out: Value = serde_json::from_str(&decide_scope_json(&text)).expect("JSON");
        prop_assert!(out.is_object());
    }

    #[test]
    fn the_catch_up_marks_for_rebuild_exactly_a_damaged_index(obs in any_observation()) {
        let next = after_index_failure(&obs);
        let cause = classify(&obs).cause;
        let d = decide(&obs);
        match next {
            IndexNext::MarkForRebuild => prop_assert_eq!(cause, Cause::FtsIndex),
            IndexNext::Wait { ms } => {
                prop_assert_eq!(d.action, ActionKind::Retry);
                prop_assert_eq!(Some(ms), d.delay_ms);
            }
            IndexNext::Stop { cause: stopped, action } => {
                prop_assert_eq!(stopped, cause);
                prop_assert_eq!(action, d.action);
                prop_assert!(cause != Cause::FtsIndex);
                prop_assert!(action != ActionKind::Retry);
            }
        }
        if cause == Cause::FtsIndex {
            prop_assert_eq!(next, IndexNext::MarkForRebuild);
        }
    }
}
