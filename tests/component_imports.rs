//! The component the binary carries imports nothing, and exports the
//! versioned engine interface.

use turnsafe_host::engine::{COMPONENT, WasmEngine};

#[test]
fn the_component_imports_nothing() {
    let engine = WasmEngine::new().expect("component loads");
    assert_eq!(
        engine.imports(),
        Vec::<String>::new(),
        "the policy world must declare no imports"
    );
    assert_eq!(engine.exports(), vec!["turnsafe:policy/engine@0.4.0".to_string()]);
    assert_eq!(turnsafe_policy::WIT_PACKAGE, "turnsafe:policy@0.4.0");
}

#[test]
fn the_component_is_a_component_not_a_core_module() {
    // Component binaries carry layer 1 in the version field (bytes 6..8).
    assert_eq!(&COMPONENT[0..4], b"\0asm");
    assert_eq!(&COMPONENT[6..8], &[0x01, 0x00]);
}

/// The design's cap on the component the binary carries (optimised by
/// `wasm-opt -Oz`, stripped, no imports): 131,072 bytes. The bench `policy`
/// prints the raw, stripped and gzip sizes; `docs/EMBEDDING.md` says where
/// the bytes go and what keeps them down.
#[test]
fn the_component_stays_under_its_cap() {
    assert!(
        COMPONENT.len() <= 131_072,
        "the component is {} bytes stripped; the cap is 131,072. See \"Size\" in docs/EMBEDDING.md for what \
         costs bytes in the component (core::fmt, iterator collects, the std sort)",
        COMPONENT.len()
    );
}
