//! Shared support for turnsafe's top-level integration tests.
//!
//! Every user-copy snapshot lives in the top-level `snapshots/` folder;
//! [`snapshot_settings`] is the one place that says so.

use std::path::PathBuf;

/// The workspace root (where `tests/`, `snapshots/` and `docs/` live).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// insta settings shared by every snapshot test: the top-level
/// `snapshots/` folder, and no module prefix in snapshot names.
pub fn snapshot_settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(root().join("snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}
