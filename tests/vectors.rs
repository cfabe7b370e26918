//! The shared vectors (`tests/vectors/*.json`), run natively and through
//! the embedded WASM component. Both must meet `expected`, and both must
//! answer with the same bytes.

use serde_json::{Value, json};
use turnsafe_host::engine::{NativeEngine, PolicyEngine, WasmEngine};

fn load_vectors() -> Vec<(String, Value)> {
    let dir = turnsafe_tests::root().join("tests/vectors");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/vectors exists")
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
fn there_are_enough_vectors_and_names_are_unique() {
    let vectors = load_vectors();
    assert!(vectors.len() >= 60, "only {} vectors", vectors.len());
    let mut names: Vec<&str> = vectors.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "duplicate vector names");
    let induced = vectors.iter().filter(|(_, v)| v.get("induced").is_some()).count();
    assert!(induced >= 5, "only {induced} vectors come from real SQLite failures");
}

#[test]
fn every_vector_agrees_natively_and_in_wasm() {
    let mut native = NativeEngine;
    let mut wasm = WasmEngine::new().expect("component loads");
    let mut failures = Vec::new();
    for (name, v) in load_vectors() {
        let request = json!({ "observation": v["observation"], "context": v["context"] }).to_string();
        let n = native.evaluate_json(&request).expect("native never fails");
        let w = wasm.evaluate_json(&request).expect("component does not trap");
        if n != w {
            failures.push(format!("{name}: native and wasm differ\n  native: {n}\n  wasm:   {w}"));
            continue;
        }
        // The classify entry point must agree too, byte for byte.
        let obs = v["observation"].to_string();
        let (nc, wc) = (native.classify_json(&obs).unwrap(), wasm.classify_json(&obs).unwrap());
        if nc != wc {
            failures.push(format!("{name}: classify differs\n  native: {nc}\n  wasm:   {wc}"));
        }
        let out: Value = serde_json::from_str(&n).expect("evaluate answers JSON");
        let exp = &v["expected"];
        let got = json!({
            "cause": out["cause"],
            "basis": out["basis"],
            "action": out["action"],
            "copy_code": out["copy"].get("code").cloned().unwrap_or(Value::Null),
        });
        if &got != exp {
            failures.push(format!("{name}: expected {exp}, got {got} (full: {n})"));
        }
        if out["action"] == "retry" && !out["delay_ms"].is_u64() {
            failures.push(format!("{name}: retry without delay_ms"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} vector failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A bare path is no receipt: both engines' `explain-json` refuse
/// `receipt_path` and name `receipt`, and copy nothing from it.
#[test]
fn explain_json_refuses_a_bare_receipt_path_in_both_engines() {
    let request = json!({"cause": "disk", "outcome": "diverted", "session": "s1",
        "receipt_path": "/nonexistent/x.jsonl"})
    .to_string();
    let native = NativeEngine.explain_json(&request).expect("native explain");
    let wasm = WasmEngine::new()
        .expect("load the component")
        .explain_json(&request)
        .expect("wasm explain");
    assert_eq!(native, wasm, "the engines disagree");
    let answer: Value = serde_json::from_str(&native).expect("JSON answer");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("receipt_path") && error.contains("receipt"),
        "a bare path must be refused, naming its replacement: {answer}"
    );
    assert!(
        !native.contains("/nonexistent/x.jsonl\""),
        "no copy names the bare path: {native}"
    );
}

/// The lease decisions (`tests/vectors/lease.json`): when a writer takes
/// over a turn lease another holder has, natively and in the component,
/// byte for byte.
#[test]
fn every_lease_vector_agrees_natively_and_in_wasm() {
    let text = std::fs::read_to_string(turnsafe_tests::root().join("tests/vectors/lease.json")).expect("lease vectors");
    let vectors: Vec<Value> = serde_json::from_str(&text).expect("lease vectors parse");
    assert!(vectors.len() >= 12, "only {} lease vectors", vectors.len());
    let mut native = NativeEngine;
    let mut wasm = WasmEngine::new().expect("component loads");
    let mut verdicts = std::collections::BTreeSet::new();
    for v in &vectors {
        let name = v["name"].as_str().expect("named");
        let request = v["probe"].to_string();
        let n = native.decide_lease_json(&request).expect("native never fails");
        let w = wasm.decide_lease_json(&request).expect("component does not trap");
        assert_eq!(n, w, "{name}: native and wasm differ");
        let out: Value = serde_json::from_str(&n).expect("JSON out");
        assert_eq!(out, v["expected"], "{name}: {}", v["why"]);
        verdicts.insert(out["verdict"].as_str().unwrap_or_default().to_string());
    }
    // Every verdict the policy can give is covered.
    assert_eq!(
        verdicts.into_iter().collect::<Vec<_>>(),
        ["backend_gone", "free", "holder_exited", "pid_reused", "stands"]
    );
    // A probe the policy cannot read is an error, never a verdict.
    for bad in [r#"{"expires_ms": 5}"#, r#"{"now_ms": 1, "local": "alive"}"#, "[]", "{"] {
        let out: Value = serde_json::from_str(&native.decide_lease_json(bad).unwrap()).unwrap();
        assert!(out["error"].is_string(), "{bad}: {out}");
        assert_eq!(
            native.decide_lease_json(bad).unwrap(),
            wasm.decide_lease_json(bad).unwrap()
        );
    }
}

/// A scope vector's observation as the component's typed record.
fn wit_observation(o: &Value) -> turnsafe_host::engine::wit::Observation {
    use turnsafe_host::engine::wit;
    let evidence = o["evidence"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|e| match e.as_str().expect("an evidence label") {
                    "deleted_wal_generation" => wit::Evidence::DeletedWalGeneration,
                    "db_replaced" => wit::Evidence::DbReplaced,
                    "turn_lease_lost" => wit::Evidence::TurnLeaseLost,
                    "compression_in_progress" => wit::Evidence::CompressionInProgress,
                    "compression_closed" => wit::Evidence::CompressionClosed,
                    "fts_scope" => wit::Evidence::FtsScope,
                    "commit_sent" => wit::Evidence::CommitSent,
                    other => panic!("unknown evidence {other}"),
                })
                .collect()
        })
        .unwrap_or_default();
    wit::Observation {
        operation: wit::Operation::AppendBatch,
        engine: match o["engine"].as_str() {
            Some("postgres") => wit::DbEngine::Postgres,
            _ => wit::DbEngine::Sqlite,
        },
        sqlstate: o["sqlstate"].as_str().map(String::from),
        code: o["code"].as_i64(),
        extended_code: o["extended_code"].as_i64(),
        message: o["message"].as_str().unwrap_or_default().to_string(),
        errno: o["errno"].as_i64(),
        evidence,
        attempt: 1,
        elapsed_ms: 0,
        seed: 0,
        lease: None,
    }
}

/// The failure scopes (`tests/vectors/scope.json`): how far a failure
/// inside a group's transaction reaches, natively and in the component
/// (its JSON entry point byte for byte, and its typed `decide-scope`).
#[test]
fn every_scope_vector_agrees_natively_and_in_wasm() {
    use turnsafe_host::engine::wit::FailureScope;
    let text = std::fs::read_to_string(turnsafe_tests::root().join("tests/vectors/scope.json")).expect("scope vectors");
    let vectors: Vec<Value> = serde_json::from_str(&text).expect("scope vectors parse");
    assert!(vectors.len() >= 40, "only {} scope vectors", vectors.len());
    let mut native = NativeEngine;
    let mut wasm = WasmEngine::new().expect("component loads");
    let mut scopes = std::collections::BTreeSet::new();
    for v in &vectors {
        let name = v["name"].as_str().expect("named");
        let request = v["request"].to_string();
        let n = native.decide_scope_json(&request).expect("native never fails");
        let w = wasm.decide_scope_json(&request).expect("component does not trap");
        assert_eq!(n, w, "{name}: native and wasm differ");
        let out: Value = serde_json::from_str(&n).expect("JSON out");
        assert_eq!(out, v["expected"], "{name}: {}", v["why"]);
        let obs = wit_observation(&v["request"]["observation"]);
        let open = v["request"]["transaction_open"].as_bool().expect("transaction_open");
        let typed = wasm
            .call(|g, s| g.call_decide_scope(s, &obs, open))
            .expect("component does not trap");
        let typed = match typed {
            FailureScope::Batch => "batch",
            FailureScope::Transaction => "transaction",
        };
        assert_eq!(typed, out["scope"], "{name}: the typed export differs");
        scopes.insert(typed);
    }
    assert_eq!(scopes.into_iter().collect::<Vec<_>>(), ["batch", "transaction"]);
    for bad in [
        r#"{"observation": {}}"#,
        r#"{"observation": {"code": "x"}, "transaction_open": true}"#,
        "[]",
        "{",
    ] {
        let out: Value = serde_json::from_str(&native.decide_scope_json(bad).unwrap()).unwrap();
        assert!(out["error"].is_string(), "{bad}: {out}");
        assert_eq!(
            native.decide_scope_json(bad).unwrap(),
            wasm.decide_scope_json(bad).unwrap()
        );
    }
}
