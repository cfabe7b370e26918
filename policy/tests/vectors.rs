//! The shared vectors (`../tests/vectors/*.json`), run through the native
//! policy's JSON entry points: each must meet its `expected`. The workspace's
//! top-level `tests/vectors.rs` checks the WASM component answers the same
//! bytes; this one lives here so that the policy's own tests (and a mutation
//! run of this crate) see every vector.

use serde_json::{Value, json};
use turnsafe_policy::json::{classify_json, decide_lease_json, decide_scope_json, evaluate_json};

fn load_vectors() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        // The flush machine's event sequences, the lease decisions and the
        // failure scopes have their own runners.
        .filter(|p| !p.ends_with("flush_sequences.json") && !p.ends_with("lease.json") && !p.ends_with("scope.json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable vector file");
        let items: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for v in items {
            let name = v["name"].as_str().expect("vector has a name").to_string();
            out.push((name, v));
        }
    }
    out
}

#[test]
fn every_vector_meets_expected_natively() {
    let vectors = load_vectors();
    assert!(vectors.len() >= 60, "only {} vectors", vectors.len());
    let mut failures = Vec::new();
    for (name, v) in vectors {
        let request = json!({ "observation": v["observation"], "context": v["context"] }).to_string();
        let out: Value = serde_json::from_str(&evaluate_json(&request)).expect("evaluate answers JSON");
        let got = json!({
            "cause": out["cause"],
            "basis": out["basis"],
            "action": out["action"],
            "copy_code": out["copy"].get("code").cloned().unwrap_or(Value::Null),
        });
        if got != v["expected"] {
            failures.push(format!("{name}: expected {}, got {got} (full: {out})", v["expected"]));
        }
        if (out["action"] == "retry") != out["delay_ms"].is_u64() {
            failures.push(format!("{name}: delay_ms must come with retry and only with it: {out}"));
        }
        // classify answers the same cause, basis and action as evaluate.
        let c: Value = serde_json::from_str(&classify_json(&v["observation"].to_string())).expect("JSON");
        for k in ["cause", "basis", "action", "delay_ms"] {
            if c[k] != out[k] {
                failures.push(format!("{name}: classify {k} {} but evaluate {}", c[k], out[k]));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} vector failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The lease decisions (`tests/vectors/lease.json`), natively: each probe
/// gets its `expected` verdict.
#[test]
fn every_lease_vector_meets_expected_natively() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/lease.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let vectors: Vec<Value> = serde_json::from_str(&text).expect("lease vectors parse");
    assert!(vectors.len() >= 12, "only {} lease vectors", vectors.len());
    for v in &vectors {
        let out: Value = serde_json::from_str(&decide_lease_json(&v["probe"].to_string())).expect("JSON");
        assert_eq!(out, v["expected"], "{}: {}", v["name"], v["why"]);
    }
}

/// The failure scopes (`tests/vectors/scope.json`), natively: each failure
/// inside a group's transaction reaches as far as its `expected` says, and
/// the typed function answers what the JSON entry point does.
#[test]
fn every_scope_vector_meets_expected_natively() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/scope.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let vectors: Vec<Value> = serde_json::from_str(&text).expect("scope vectors parse");
    assert!(vectors.len() >= 40, "only {} scope vectors", vectors.len());
    let mut seen = std::collections::BTreeSet::new();
    for v in &vectors {
        let out: Value = serde_json::from_str(&decide_scope_json(&v["request"].to_string())).expect("JSON");
        assert_eq!(out, v["expected"], "{}: {}", v["name"], v["why"]);
        seen.insert(out["scope"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["batch", "transaction"]);
    for bad in [
        r#"{"observation": {}}"#,
        r#"{"observation": {}, "transaction_open": 1}"#,
        "[]",
        "{",
    ] {
        let out: Value = serde_json::from_str(&decide_scope_json(bad)).expect("JSON");
        assert!(out["error"].is_string(), "{bad}: {out}");
    }
}
