//! `turnsafe component --out` writes exactly the component the binary runs.

use assert_cmd::Command;

#[test]
fn writes_the_embedded_component_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("policy.wasm");
    let status = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["component", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0));
    let written = std::fs::read(&out).unwrap();
    assert_eq!(written, turnsafe_host::engine::COMPONENT);
    // And it loads and answers like the embedded one.
    let mut engine = turnsafe_host::engine::WasmEngine::from_bytes(&written).unwrap();
    use turnsafe_host::engine::PolicyEngine;
    assert_eq!(
        engine.classify_json("{\"code\":13}").unwrap(),
        turnsafe_policy::json::classify_json("{\"code\":13}")
    );
}
