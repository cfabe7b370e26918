//! The properties turnsafe's fuzz targets check, as plain functions of
//! the input bytes, each returning what it found wrong.
//!
//! Two callers run the same code: the libFuzzer targets in `fuzz/`
//! (nightly, `cargo fuzz run <target>`), which panic on an `Err`, and this
//! crate's `tests/corpus.rs` (stable, part of `cargo test --workspace`),
//! which replays every committed seed and every reproducer of a past find
//! under `fuzz/`. [`TARGETS`] ties each target's name to its check.

pub mod append;
pub mod divert;
pub mod flush;
pub mod hermes;
pub mod json;
pub mod records;

/// A target's check: the input's bytes in, what is wrong out.
pub type Check = fn(&[u8]) -> Result<(), String>;

/// Every fuzz target by its name in `fuzz/Cargo.toml` (and its corpus
/// folder, `fuzz/corpus/<name>/`).
pub const TARGETS: &[(&str, Check)] = &[
    ("divert_file", divert::check),
    ("divert_line", divert::check_line),
    ("ledger", records::check_ledger),
    ("capture_manifest", records::check_capture),
    ("receipt", records::check_receipt),
    ("json_entry_points", json::check),
    ("flush_machine", flush::check),
    ("append_stdin", append::check),
    ("hermes_import", hermes::check),
];
