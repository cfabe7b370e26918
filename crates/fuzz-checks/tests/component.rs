//! The component's JSON entry points through wasmtime answer every
//! committed `json_entry_points` input (seeds and reproducers) with the
//! very bytes the native entry points answer: the fuzz target checks the
//! native ones against serde_json, this holds the component to them.

use std::path::Path;

use turnsafe_fuzz_checks::json::ENTRY_POINTS;
use turnsafe_host::engine::{PolicyEngine, WasmEngine};

#[test]
fn the_component_answers_every_committed_input_as_the_native_entry_points() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut inputs = Vec::new();
    for dir in ["corpus/json_entry_points", "regressions/json_entry_points"] {
        if let Ok(rd) = std::fs::read_dir(fuzz.join(dir)) {
            inputs.extend(rd.map(|e| e.expect("a readable entry").path()));
        }
    }
    inputs.sort();
    assert!(inputs.len() >= 50, "only {} inputs", inputs.len());
    let mut wasm = WasmEngine::new().expect("the embedded component runs");
    let mut compared = 0;
    let mut failures = Vec::new();
    for path in &inputs {
        let bytes = std::fs::read(path).expect("a readable input");
        // The component takes strings: bytes that are not UTF-8 never reach it.
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        for (name, native) in ENTRY_POINTS {
            let component = match name {
                "classify_json" => wasm.classify_json(text),
                "explain_json" => wasm.explain_json(text),
                "evaluate_json" => wasm.evaluate_json(text),
                "flush_step_json" => wasm.flush_step_json(text),
                "edit_step_json" => wasm.edit_step_json(text),
                other => panic!("an entry point this test does not know: {other}"),
            }
            .unwrap_or_else(|e| panic!("{name} through wasmtime failed: {e}"));
            compared += 1;
            if component != native(text) {
                failures.push(format!(
                    "{name}, {}: component {component} / native {}",
                    path.display(),
                    native(text)
                ));
            }
        }
    }
    eprintln!("component against native: {compared} answers compared");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
