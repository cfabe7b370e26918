//! The flush machine's event-sequence vectors (`../tests/vectors/flush_sequences.json`),
//! driven through the native `flush_step_json` exactly as every runtime
//! drives them (see the top-level `tests/flush_sequences.rs`, which writes
//! the file and compares the component too): each turn's steps, down to
//! the final outcome, must be the recorded ones. It lives here so that the
//! policy's own tests (and a mutation run of this crate) see every sequence.

use serde_json::{Value, json};
use turnsafe_policy::machine::flush_step_json;

fn step(request: Value) -> Value {
    let v: Value = serde_json::from_str(&flush_step_json(&request.to_string())).expect("the answer is JSON");
    assert!(v.get("error").is_none(), "refused: {v}\nrequest: {request}");
    v
}

#[test]
fn every_recorded_sequence_gets_the_recorded_steps() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/flush_sequences.json");
    let cases: Vec<Value> = serde_json::from_slice(&std::fs::read(&path).expect("the sequences exist")).unwrap();
    assert!(cases.len() >= 30, "only {} sequences", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let mut state = Value::Null;
        for (t, turn) in case["turns"].as_array().unwrap().iter().enumerate() {
            let v = step(json!({ "state": state, "start": turn["start"] }));
            let mut steps = vec![v["step"].clone()];
            state = v["state"].clone();
            for e in turn["events"].as_array().unwrap() {
                let v = step(json!({ "state": state, "event": e }));
                steps.push(v["step"].clone());
                state = v["state"].clone();
            }
            if Value::Array(steps.clone()) != turn["steps"] {
                failures.push(format!(
                    "{name}, turn {t}:\n  recorded: {}\n  got:      {}",
                    turn["steps"],
                    Value::Array(steps)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
