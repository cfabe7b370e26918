//! # turnsafe-host
//!
//! The native shell around `turnsafe-policy`: it performs every effect
//! (the SQLite store, the flush, the divert, the guard) and asks the policy
//! what each failure means. This crate also carries the policy as a WASM
//! component ([`engine::COMPONENT`]) and can run either implementation.

pub mod capture;
pub mod captures;
pub mod cli;
pub mod divert;
pub mod divert_files;
pub mod doctor;
pub mod durable;
pub mod engine;
pub mod exit;
pub mod failpoint;
#[cfg(feature = "fault-injection")]
pub mod faultvfs;
pub mod guard;
pub mod holders;
pub mod message;
pub mod observe;
pub mod outcome;
pub mod recover;
pub mod replay;
pub mod store;
