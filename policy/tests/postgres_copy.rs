//! The copy of a failure from PostgreSQL names no SQLite command or file:
//! every cause, every outcome the table pairs it with, every artifact a
//! PostgreSQL flush can have, through `explain`, `explain-json`,
//! `evaluate-json` and the flush machine (a sticky handle's later batches
//! included, over the wire too). Where its copy differs from SQLite's, it
//! has its own snapshot.

use serde_json::{Value, json};
use turnsafe_policy::json::{copy_to_value, evaluate_json, explain_json};
use turnsafe_policy::machine::{
    DivertReceipt, Event, Failure, FlushStart, Handle, Step, event_to_text, flush_step_json,
};
use turnsafe_policy::{
    CaptureFailure, Cause, CopyContext, DivertFailure, DivertResidue, Durability, Engine, Evidence, Outcome, explain,
    needs_capture, producible_pairs,
};

/// What only SQLite has: its recovery and capture commands, the index
/// repair, its file, its fd limit and its pragma.
const SQLITE_ONLY: &[&str] = &[
    "turnsafe recover",
    "turnsafe capture",
    "--repair-fts",
    "state.db",
    "ulimit",
    "synchronous=full",
    "sqlite",
];

/// Why `text` (a copy, lower-cased) could not be PostgreSQL's, if it could not.
fn sqlite_only(text: &str) -> Option<String> {
    let text = text.to_lowercase();
    if let Some(word) = SQLITE_ONLY.iter().find(|w| text.contains(*w)) {
        return Some(format!("names `{word}`"));
    }
    // `turnsafe doctor` and `turnsafe replay` read state.db without `--db`.
    for command in ["turnsafe doctor", "turnsafe replay"] {
        for (at, _) in text.match_indices(command) {
            if !text[at + command.len()..].starts_with(" --db") {
                return Some(format!("names `{command}` without `--db`"));
            }
        }
    }
    None
}

fn receipt() -> DivertReceipt {
    DivertReceipt {
        path: "/home/agent/.turnsafe/sessions/s1.jsonl".into(),
        offset: 0,
        length: 231,
        count: 1,
        sha256: "5f2b".repeat(16),
    }
}

/// Every context a PostgreSQL flush can give an outcome: the failed divert
/// with or without lines left behind, the failed capture (a PostgreSQL
/// store keeps no generation on the host to capture), an unsynced commit,
/// an errno. A capture receipt and a pending capture are SQLite files, and
/// name SQLite's commands by right.
fn contexts(outcome: Outcome) -> Vec<(&'static str, CopyContext)> {
    let base = CopyContext {
        session: Some("s1".into()),
        receipt: (outcome == Outcome::Diverted).then(receipt),
        divert_failure: (outcome == Outcome::DivertFailed).then(|| DivertFailure {
            operation: "open".into(),
            errno: Some(24),
        }),
        engine: Engine::Postgres,
        ..CopyContext::default()
    };
    vec![
        ("plain", base.clone()),
        (
            "capture_failed",
            CopyContext {
                capture_failure: Some(CaptureFailure {
                    operation: "read".into(),
                    errno: None,
                }),
                ..base.clone()
            },
        ),
        (
            "residue",
            CopyContext {
                divert_residue: (outcome == Outcome::DivertFailed).then(|| DivertResidue {
                    path: "/home/agent/.turnsafe/sessions/s1.jsonl".into(),
                    offset: 4096,
                }),
                ..base.clone()
            },
        ),
        (
            "unsynced",
            CopyContext {
                durability: Durability::Unsynced,
                ..base.clone()
            },
        ),
        (
            "errno",
            CopyContext {
                errno: Some(111),
                ..base
            },
        ),
    ]
}

#[test]
fn every_postgres_cause_names_no_sqlite_command() {
    let mut failures = Vec::new();
    let mut walked = 0;
    for (cause, outcome) in producible_pairs() {
        for (name, ctx) in contexts(outcome) {
            let copy = explain(cause, outcome, &ctx).expect("a producible pair explains");
            let text = copy_to_value(&copy).to_string();
            if let Some(why) = sqlite_only(&text) {
                failures.push(format!("{}.{} ({name}): {why}: {text}", cause.label(), outcome.label()));
            }
            walked += 1;
        }
        // explain-json takes the engine as the typed context does.
        let answer = explain_json(
            &json!({"cause": cause.label(), "outcome": outcome.label(), "session": "s1", "engine": "postgres",
                "receipt": serde_json::to_value(receipt()).unwrap(), "divert_failed": {"operation": "open", "errno": 24}})
            .to_string(),
        );
        if let Some(why) = sqlite_only(&answer) {
            failures.push(format!(
                "explain-json {}.{}: {why}: {answer}",
                cause.label(),
                outcome.label()
            ));
        }
    }
    assert!(walked >= 150, "only {walked} copies walked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same copies for SQLite still name SQLite's steps: the engine picks
/// the steps, it does not drop them.
#[test]
fn sqlite_keeps_its_own_steps() {
    let ctx = CopyContext {
        receipt: Some(receipt()),
        ..CopyContext::default()
    };
    let copy = explain(Cause::Corrupt, Outcome::Diverted, &ctx).unwrap();
    assert!(
        copy.remediation
            .iter()
            .any(|s| s.contains("turnsafe recover --source state.db")),
        "{copy:?}"
    );
    let pg = explain(
        Cause::Corrupt,
        Outcome::Diverted,
        &CopyContext {
            engine: Engine::Postgres,
            ..ctx
        },
    )
    .unwrap();
    assert_eq!((pg.title, pg.body), (copy.title, copy.body));
    assert_ne!(pg.remediation, copy.remediation);
}

/// `evaluate-json` gives the observation's engine to the copy.
#[test]
fn evaluate_json_gives_a_postgres_failure_postgres_steps() {
    for (sqlstate, code) in [
        ("XX001", 11),
        ("XX002", 11),
        ("53100", 13),
        ("3D000", 14),
        ("28P01", 23),
    ] {
        let request = json!({
            "observation": {"operation": "append_batch", "engine": "postgres", "sqlstate": sqlstate, "code": code,
                "message": format!("postgres SQLSTATE {sqlstate}: x")},
            "context": {"session": "s1", "receipt": serde_json::to_value(receipt()).unwrap()},
        });
        let answer = evaluate_json(&request.to_string());
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["outcome"], "diverted", "{answer}");
        assert_eq!(sqlite_only(&answer), None, "{answer}");
    }
}

fn pg_failure(sqlstate: Option<&str>, code: Option<i64>, evidence: Vec<Evidence>) -> Failure {
    Failure {
        engine: Engine::Postgres,
        sqlstate: sqlstate.map(String::from),
        code,
        message: format!("postgres SQLSTATE {}: x", sqlstate.unwrap_or("none")),
        evidence,
        ..Failure::default()
    }
}

fn start(uid: &str) -> FlushStart {
    FlushStart {
        session: "s1".into(),
        uids: vec![uid.into()],
        seed: 7,
        ..FlushStart::default()
    }
}

/// Drive one batch: `first` answers the first open or write, then every
/// step is answered as a host would (waits waited, captures failed as a
/// PostgreSQL store's do, diverts kept). Returns the outcome's JSON.
fn flush(h: &mut Handle, uid: &str, first: Option<Failure>) -> Value {
    h.start(start(uid)).unwrap();
    let mut first = first;
    loop {
        let event = match h.poll().expect("a flush runs") {
            Step::Open => match first.take() {
                Some(f) => Event::Failed(f),
                None => Event::Opened,
            },
            Step::Write(_) => match first.take() {
                Some(f) => Event::Failed(f),
                None => Event::Committed,
            },
            Step::Wait { .. } => Event::Waited { elapsed_ms: 600_000 },
            Step::Capture => Event::CaptureFailed {
                failure: CaptureFailure {
                    operation: "read".into(),
                    errno: None,
                },
                error: "postgres://agent@db/agents keeps no generation on this machine to capture".into(),
            },
            Step::Divert { .. } => Event::Diverted(receipt()),
            Step::Resolve => Event::Failed(pg_failure(Some("08006"), Some(10), Vec::new())),
            Step::Done(report) => return report.to_value(),
        };
        h.handle(event).unwrap();
    }
}

/// A sticky PostgreSQL handle (corrupt, replaced) diverts every later batch
/// without a failure of its own: its copy still speaks PostgreSQL.
#[test]
fn the_flush_machine_remembers_the_engine_across_batches() {
    for (first, sticky) in [
        (pg_failure(Some("XX001"), Some(11), Vec::new()), Cause::Corrupt),
        (pg_failure(None, Some(10), vec![Evidence::DbReplaced]), Cause::Replaced),
    ] {
        let mut h = Handle::new();
        let a = flush(&mut h, "a", Some(first));
        assert_eq!(h.sticky(), Some(sticky));
        let b = flush(&mut h, "b", None);
        for outcome in [&a, &b] {
            assert_eq!(outcome["cause"], sticky.label(), "{outcome}");
            assert_eq!(outcome["copy"]["outcome"], "diverted", "{outcome}");
            assert_eq!(sqlite_only(&outcome["copy"].to_string()), None, "{outcome}");
        }
    }
}

/// The same over the wire: the state carries the engine from batch to batch.
#[test]
fn the_wire_state_carries_the_engine() {
    let step = |state: &Value, start: Option<FlushStart>, event: Option<Event>| -> Value {
        let mut request = json!({"state": state});
        if let Some(s) = start {
            request["start"] = serde_json::to_value(s).unwrap();
        }
        if let Some(e) = event {
            request["event"] = serde_json::from_str(&event_to_text(&e)).unwrap();
        }
        serde_json::from_str(&flush_step_json(&request.to_string())).unwrap()
    };
    let corrupt = pg_failure(Some("XX001"), Some(11), Vec::new());
    let mut answer = step(&Value::Null, Some(start("a")), None);
    answer = step(&answer["state"], None, Some(Event::Failed(corrupt)));
    assert_eq!(answer["step"]["type"], "divert", "{answer}");
    answer = step(&answer["state"], None, Some(Event::Diverted(receipt())));
    assert_eq!(answer["state"]["engine"], "postgres", "{answer}");
    assert_eq!(answer["state"]["sticky"], "corrupt", "{answer}");
    // The next batch never touches the database, and its copy is PostgreSQL's.
    answer = step(&answer["state"], Some(start("b")), None);
    assert_eq!(answer["step"]["type"], "divert", "{answer}");
    answer = step(&answer["state"], None, Some(Event::Diverted(receipt())));
    let outcome = &answer["step"]["outcome"];
    assert_eq!(outcome["copy"]["code"], "corrupt.diverted", "{answer}");
    assert_eq!(sqlite_only(&outcome["copy"].to_string()), None, "{outcome}");
}

/// One snapshot for each PostgreSQL copy that differs from SQLite's: the
/// plain copy of each pair, a failed capture's where the cause captures,
/// an unsynced commit's.
#[test]
fn one_snapshot_per_postgres_copy_of_its_own() {
    let mut n = 0;
    turnsafe_tests::snapshot_settings().bind(|| {
        for (cause, outcome) in producible_pairs() {
            for (name, ctx) in contexts(outcome) {
                // The plain copy of each pair; a failed capture only where
                // the cause captures, an unsynced commit only persisted.
                let kept = match name {
                    "plain" => true,
                    "capture_failed" => needs_capture(cause),
                    "unsynced" => outcome == Outcome::Persisted,
                    _ => false,
                };
                if !kept {
                    continue;
                }
                let sqlite = CopyContext {
                    engine: Engine::Sqlite,
                    ..ctx.clone()
                };
                let pg = explain(cause, outcome, &ctx).unwrap();
                if pg == explain(cause, outcome, &sqlite).unwrap() {
                    continue;
                }
                let suffix = if name == "plain" {
                    String::new()
                } else {
                    format!("__{name}")
                };
                insta::assert_json_snapshot!(
                    format!("copy__{}__{}__postgres{suffix}", cause.label(), outcome.label()),
                    copy_to_value(&pg)
                );
                n += 1;
            }
        }
    });
    assert!(n >= 10, "only {n} PostgreSQL copies differ from SQLite's");
}
