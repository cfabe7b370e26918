//! A file diverted by the Python example writer (`examples/python`,
//! committed as a fixture its own suite checks against) replays into the
//! Rust store like any other.
mod common;
use common::*;
use turnsafe_host::replay::{ReplayOptions, replay};

#[test]
fn turnsafe_replay_imports_what_the_python_writer_diverted() {
    let home = Home::new();
    drop(home.store());
    std::fs::create_dir_all(home.path().join("sessions")).unwrap();
    let fixture = turnsafe_tests::root().join("examples/python/fixtures/diverted.jsonl");
    std::fs::copy(&fixture, home.divert_file("py-session")).unwrap();
    let reports = replay(home.path(), &ReplayOptions::default()).unwrap();
    assert_eq!(
        (reports[0].lines, reports[0].replayed, reports[0].quarantined),
        (2, 2, 0)
    );
    let rows = home.rows("py-session");
    assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["py-1", "py-2"]);
    assert_eq!(rows[0].2, "hello from python");
    // Idempotent across runtimes too.
    std::fs::copy(&fixture, home.divert_file("py-session")).unwrap();
    assert_eq!(replay(home.path(), &ReplayOptions::default()).unwrap()[0].duplicate, 2);
}
