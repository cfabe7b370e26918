//! `examples/sqlite-codes.json` (read by the Python and JavaScript hosts)
//! is generated from the libsqlite3-sys constants; this fails when stale.
//! Regenerate: `cargo run -q -- codes > examples/sqlite-codes.json`.

#[test]
fn the_committed_code_table_matches_libsqlite3_sys() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sqlite-codes.json");
    let committed: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).expect("table exists")).unwrap();
    assert_eq!(
        committed,
        turnsafe_host::cli::codes::table(),
        "examples/sqlite-codes.json is stale: run `cargo run -q -- codes > examples/sqlite-codes.json`"
    );
    assert_eq!(committed["SQLITE_BUSY_SNAPSHOT"], 517);
    assert_eq!(committed["SQLITE_READONLY_DBMOVED"], 1032);
}
