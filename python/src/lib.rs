//! `turnsafe_store._native`: the native host behind a thin PyO3 binding.
//!
//! Nothing here decides anything: every call converts its arguments,
//! releases the GIL, calls the host (`turnsafe-host`, built without the
//! WASM engine) and converts the answer. The exceptions are defined in
//! `turnsafe_store/_errors.py` so they can have two bases and attributes.
//!
//! Rooms, each importing only rooms listed before it:
//! - `convert`: JSON values to and from Python objects, and a batch of messages;
//! - `errors`: the package's exceptions, and `Failed`, a failure carried to them;
//! - `args`: arguments every entry point parses the same way (session id, home, db, limit);
//! - `outcome`: `Outcome`, what one batch did;
//! - `aio`: `Completions`, answers handed to an event loop through a pipe;
//! - `engine`: which engine a home's `SharedStore` writes to;
//! - `store`: `Store`, one home shared by every thread, and its batches;
//! - `history`: a session's reads and edits (show, pop, clear, restore, fork, ...);
//! - `langgraph`: the checkpoints and writes of `turnsafe_store.langgraph`;
//! - `commands`: the command line's reports (replay, import, doctor, search);
//! - `same`: the canonical bytes every host compares.

use pyo3::prelude::*;

mod aio;
mod args;
mod commands;
mod convert;
mod engine;
mod errors;
mod history;
mod langgraph;
mod outcome;
mod same;
mod store;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<outcome::Outcome>()?;
    m.add_class::<aio::Completions>()?;
    m.add_function(wrap_pyfunction!(commands::replay, m)?)?;
    m.add_function(wrap_pyfunction!(commands::import_hermes, m)?)?;
    m.add_function(wrap_pyfunction!(commands::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(commands::search, m)?)?;
    m.add_function(wrap_pyfunction!(same::canonical_json, m)?)?;
    m.add_function(wrap_pyfunction!(same::digest_json, m)?)?;
    m.add("SCHEMA_VERSION", turnsafe_host::store::SCHEMA_VERSION)?;
    Ok(())
}
