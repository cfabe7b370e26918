//! # turnsafe-host
//!
//! The native shell around `turnsafe-policy`: it performs every effect
//! (the SQLite store, the flush, the divert, the guard) and asks the policy
//! what each failure means.
//!
//! With the `wasm-engine` feature (on by default, and what the `turnsafe`
//! command line needs) it also carries the policy as a WASM component
//! (`engine::COMPONENT`) and can run either implementation. Without it, as
//! in the Python package, it builds with no wasm32 target and no wasmtime.

pub mod backend;
pub mod capture;
pub mod capture_holds;
pub mod capture_pid;
pub mod captures;
pub mod clear;
#[cfg(feature = "wasm-engine")]
pub mod cli;
pub mod db_copy;
pub mod divert;
pub mod divert_files;
pub mod doctor;
pub mod durable;
#[cfg(feature = "wasm-engine")]
pub mod engine;
pub mod exit;
pub mod failpoint;
#[cfg(feature = "fault-vfs")]
pub mod faultvfs;
pub mod graph;
pub mod guard;
pub mod history;
pub mod holders;
pub mod ids;
pub mod import_hermes;
pub mod import_rows;
pub mod json_in;
pub mod lease_proof;
pub mod lines;
pub mod message;
pub mod observe;
pub mod outcome;
pub mod pending;
pub mod pg;
pub mod recover;
pub mod replay;
pub(crate) mod rows;
pub mod same;
pub mod settle;
pub mod stamps;
pub mod store;
pub mod target;
pub mod transcript;
pub mod walstat;

/// SQLite's full-text search, by the name it has always had.
pub use store::search;
