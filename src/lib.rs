//! Shared support for turnsafe's top-level integration tests.
//!
//! Every user-copy snapshot lives in the top-level `snapshots/` folder;
//! [`snapshot_settings`] is the one place that says so. A test that needs
//! a capability the machine may lack (root, `chattr`, a tmpfs mount,
//! `setpriv`, `strace`) asks [`require`], which never lets it pass silently.

use std::io::Write;
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

/// The environment variable naming the file where skipped tests are
/// recorded, one line each; `scripts/test-all` sets it and counts them.
pub const SKIP_LOG: &str = "TURNSAFE_SKIP_LOG";

/// Whether this run is CI (`CI=true`), where no capability may be missing.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The name of the running test: libtest names each test's thread after
/// it; with one test thread, `fallback` (the caller's module path) stands in.
fn current_test(fallback: &str) -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => format!("{fallback}::{name}"),
        _ => fallback.to_string(),
    }
}

/// What a test does when a capability it needs is missing:
///
/// - under `CI=true` it fails, naming the capability and why it is missing;
/// - otherwise it is skipped, and the skip is recorded as one line
///   `rust <test>: <why>` in the file named by [`SKIP_LOG`], so the test
///   command reports it (and on stderr, for a run without that file).
///
/// Returns `Some(value)` when the capability is there. Use it through
/// [`require!`], which returns from the test on a skip.
pub fn require<T>(module: &str, capability: Result<T, String>) -> Option<T> {
    let why = match capability {
        Ok(v) => return Some(v),
        Err(why) => why,
    };
    let test = current_test(module);
    if in_ci() {
        panic!("{test}: a required capability is missing, and CI=true allows no skip: {why}");
    }
    let line = format!("rust {test}: {}\n", why.replace('\n', " "));
    eprint!("SKIPPED {line}");
    if let Some(path) = std::env::var_os(SKIP_LOG).filter(|p| !p.is_empty()) {
        // One write of one short line to an O_APPEND file: lines from test
        // binaries running at the same time do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!(
                "{test}: skipped ({why}), and the skip could not be recorded in {}: {e}",
                PathBuf::from(path).display()
            );
        }
    }
    None
}

/// `let v = require!(result_with_a_reason);`: the value, or (locally) a
/// recorded skip that returns from the test, or (in CI) a failure.
#[macro_export]
macro_rules! require {
    ($e:expr) => {
        match $crate::require(module_path!(), $e) {
            Some(v) => v,
            None => return,
        }
    };
}

/// `strace`, for the tests that watch a process from outside: `Ok`, or why
/// it cannot run here (for [`require!`]).
pub fn strace() -> Result<(), String> {
    match std::process::Command::new("strace").arg("-V").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!("strace -V failed ({}); .ci/run installs strace", out.status)),
        Err(e) => Err(format!("strace is not installed ({e}); .ci/run installs it")),
    }
}
