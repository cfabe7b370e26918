//! The copy snapshots (`tests/copy_snapshots.rs`), run as the policy's own
//! test so that a mutation run of this crate is checked against every
//! reviewed word.
#[path = "../../tests/copy_snapshots.rs"]
mod copy_snapshots;
