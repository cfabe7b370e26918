//! The flush machine's steps for a core set of sequences, written by hand
//! from the decision table's rules (DESIGN.md "Actions"), not recorded from
//! the machine: each cause at open and at write, capture, a failed capture,
//! a failed divert with and without residue, patience, stickiness, and a
//! pending capture. The events come from `tests/vectors/flush_sequences.json`
//! (inputs only); what the machine answers is checked against the tables
//! below, natively and through the component.
use serde_json::{Value, json};
use turnsafe_host::engine::{NativeEngine, PolicyEngine, WasmEngine};

/// One turn: the step types asked for, then the outcome's
/// (persisted, cause, action, committed, diverted, handed_back, capture?, receipt?, residue?).
type Expect = (
    &'static [&'static str],
    (
        bool,
        Option<&'static str>,
        Option<&'static str>,
        u64,
        u64,
        u64,
        bool,
        bool,
        bool,
    ),
);

fn expected() -> Vec<(&'static str, Vec<Expect>)> {
    const DIVERTED: &[&str] = &["open", "divert", "done"];
    vec![
        // A lock at open past the patience: no more retries, the batch is kept.
        (
            "open_locked",
            vec![(
                DIVERTED,
                (false, Some("locked"), Some("divert"), 0, 2, 0, false, true, false),
            )],
        ),
        // A lock at write within the patience: wait, write again, saved.
        (
            "write_locked",
            vec![(
                &["open", "write", "wait", "write", "done"],
                (true, Some("locked"), Some("retry"), 2, 0, 0, false, false, false),
            )],
        ),
        (
            "open_disk",
            vec![(
                DIVERTED,
                (false, Some("disk"), Some("divert"), 0, 2, 0, false, true, false),
            )],
        ),
        (
            "write_disk",
            vec![(
                &["open", "write", "divert", "done"],
                (false, Some("disk"), Some("divert"), 0, 2, 0, false, true, false),
            )],
        ),
        (
            "open_disk_full",
            vec![(
                DIVERTED,
                (false, Some("disk_full"), Some("divert"), 0, 2, 0, false, true, false),
            )],
        ),
        // A retired generation is captured before the batch is kept.
        (
            "write_replaced",
            vec![(
                &["open", "write", "capture", "divert", "done"],
                (false, Some("replaced"), Some("divert"), 0, 2, 0, true, true, false),
            )],
        ),
        (
            "write_deleted_wal",
            vec![(
                &["open", "write", "capture", "divert", "done"],
                (false, Some("deleted_wal"), Some("divert"), 0, 2, 0, true, true, false),
            )],
        ),
        (
            "write_corrupt",
            vec![(
                &["open", "write", "divert", "done"],
                (false, Some("corrupt"), Some("divert"), 0, 2, 0, false, true, false),
            )],
        ),
        // One-shot remedies: written again once, and saved.
        (
            "write_fts_index",
            vec![(
                &["open", "write", "write", "done"],
                (
                    true,
                    Some("fts_index"),
                    Some("degrade_fts"),
                    2,
                    0,
                    0,
                    false,
                    false,
                    false,
                ),
            )],
        ),
        (
            "write_session_row_missing",
            vec![(
                &["open", "write", "write", "done"],
                (
                    true,
                    Some("session_row_missing"),
                    Some("recreate_session"),
                    2,
                    0,
                    0,
                    false,
                    false,
                    false,
                ),
            )],
        ),
        // Fencing: handed back, never diverted.
        (
            "write_turn_lease",
            vec![(
                &["open", "write", "done"],
                (
                    false,
                    Some("turn_lease"),
                    Some("fail_closed"),
                    0,
                    0,
                    2,
                    false,
                    false,
                    false,
                ),
            )],
        ),
        (
            "locked_past_patience_diverts",
            vec![(
                &["open", "write", "wait", "write", "wait", "write", "divert", "done"],
                (false, Some("locked"), Some("divert"), 0, 2, 0, false, true, false),
            )],
        ),
        // The capture failed: reported, and the batch still kept.
        (
            "capture_failed_then_diverted",
            vec![(
                &["open", "write", "capture", "divert", "done"],
                (false, Some("deleted_wal"), Some("divert"), 0, 2, 0, true, true, false),
            )],
        ),
        (
            "divert_failed_no_residue",
            vec![(
                DIVERTED,
                (false, Some("disk"), Some("divert"), 0, 0, 2, false, false, false),
            )],
        ),
        (
            "divert_failed_with_residue",
            vec![(
                &["open", "write", "divert", "done"],
                (false, Some("disk_full"), Some("divert"), 0, 0, 2, false, false, true),
            )],
        ),
        // Sticky: the second batch never reaches the database.
        (
            "sticky_corrupt_across_two_batches",
            vec![
                (
                    &["open", "write", "divert", "done"],
                    (false, Some("corrupt"), Some("divert"), 0, 2, 0, false, true, false),
                ),
                (
                    &["divert", "done"],
                    (false, Some("corrupt"), Some("divert"), 0, 3, 0, false, true, false),
                ),
            ],
        ),
        // A pending capture keeps only its sessions out, and is not sticky.
        (
            "pending_capture_diverts_its_sessions_only",
            vec![
                (
                    &["divert", "done"],
                    (false, Some("deleted_wal"), Some("divert"), 0, 2, 0, false, true, false),
                ),
                (
                    &["open", "write", "done"],
                    (true, None, None, 1, 0, 0, false, false, false),
                ),
                (
                    &["divert", "done"],
                    (false, Some("corrupt"), Some("divert"), 0, 0, 1, false, false, false),
                ),
            ],
        ),
    ]
}

fn summary(o: &Value) -> (bool, Option<String>, Option<String>, u64, u64, u64, bool, bool, bool) {
    (
        o["persisted"].as_bool().unwrap(),
        o["cause"].as_str().map(String::from),
        o["action"].as_str().map(String::from),
        o["committed"].as_u64().unwrap(),
        o["diverted"].as_u64().unwrap(),
        o["handed_back"].as_u64().unwrap(),
        !o["capture"].is_null(),
        !o["receipt"].is_null(),
        !o["divert_residue"].is_null(),
    )
}

fn run(engine: &mut dyn PolicyEngine, turns: &[Value]) -> Vec<(Vec<String>, Value)> {
    let mut state = Value::Null;
    let mut out = Vec::new();
    for turn in turns {
        let mut types = Vec::new();
        let mut request = json!({ "state": state, "start": turn["start"] });
        let events = turn["events"].as_array().unwrap();
        let mut i = 0;
        loop {
            let answer: Value = serde_json::from_str(&engine.flush_step_json(&request.to_string()).unwrap()).unwrap();
            assert!(answer.get("error").is_none(), "{answer}");
            let step = &answer["step"];
            types.push(step["type"].as_str().unwrap().to_string());
            state = answer["state"].clone();
            if step["type"] == "done" {
                out.push((types, step["outcome"].clone()));
                break;
            }
            request = json!({ "state": state, "event": events[i] });
            i += 1;
        }
    }
    out
}

#[test]
fn the_core_sequences_follow_the_rules_as_written() {
    let text = std::fs::read_to_string(turnsafe_tests::root().join("tests/vectors/flush_sequences.json")).unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    let mut native = NativeEngine;
    let mut wasm = WasmEngine::new().expect("component loads");
    let want = expected();
    assert!(want.len() >= 17);
    for (name, turns) in want {
        let case = cases
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no case {name} in the vectors"));
        let inputs = case["turns"].as_array().unwrap();
        assert_eq!(inputs.len(), turns.len(), "{name}");
        for engine in [&mut native as &mut dyn PolicyEngine, &mut wasm] {
            let got = run(engine, inputs);
            for (i, ((types, outcome), (want_types, want_sum))) in got.iter().zip(&turns).enumerate() {
                assert_eq!(types, want_types, "{name}, turn {i}: the steps");
                let (p, c, a, cm, dv, hb, cap, rc, rs) = *want_sum;
                let want = (p, c.map(String::from), a.map(String::from), cm, dv, hb, cap, rc, rs);
                assert_eq!(summary(outcome), want, "{name}, turn {i}: the outcome {outcome}");
            }
        }
    }
}

/// `durable`, by the rule as written: a commit under `unsynced` is not
/// durable and its copy (after a retry) never says "saved"; a receipt is
/// durable whatever the host's commits are; a synced commit is durable.
#[test]
fn durable_follows_the_hosts_durability_as_written() {
    let text = std::fs::read_to_string(turnsafe_tests::root().join("tests/vectors/flush_sequences.json")).unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    let find = |name: &str| {
        cases
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no case {name} in the vectors"))["turns"]
            .as_array()
            .unwrap()
            .clone()
    };
    let mut native = NativeEngine;
    let mut wasm = WasmEngine::new().expect("component loads");
    for engine in [&mut native as &mut dyn PolicyEngine, &mut wasm] {
        let got = run(engine, &find("unsynced_commits_are_not_durable"));
        let durable: Vec<(bool, bool)> = got
            .iter()
            .map(|(_, o)| (o["persisted"].as_bool().unwrap(), o["durable"].as_bool().unwrap()))
            .collect();
        assert_eq!(durable, [(true, false), (true, false), (false, true)]);
        assert!(got[0].1["copy"].is_null(), "a first-try commit has no copy");
        let retried = got[1].1["copy"].to_string().to_lowercase();
        assert!(!retried.contains("saved"), "{retried}");
        assert!(retried.contains("power cut"), "{retried}");
        let synced = run(engine, &find("first_try_commit"));
        assert_eq!(synced[0].1["durable"], json!(true));
    }
}
