//! Tables and labels hosts depend on by name: SQLite's primary code names
//! (checked against the committed table generated from libsqlite3-sys),
//! errno names, and the stable snake_case labels of causes and outcomes.

use std::collections::BTreeMap;

use turnsafe_policy::codes::{primary_name, primary_of};
use turnsafe_policy::{Cause, Outcome, errno};

/// `examples/sqlite-codes.json`: every SQLite result code name and number,
/// generated from libsqlite3-sys (a host test keeps it fresh).
fn sqlite_codes() -> BTreeMap<String, i64> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sqlite-codes.json");
    serde_json::from_slice(&std::fs::read(&path).expect("the code table exists")).expect("a name -> number map")
}

#[test]
fn primary_names_are_sqlites_own() {
    let table = sqlite_codes();
    let primaries: BTreeMap<i64, &str> = table
        .iter()
        .filter(|(_, n)| **n <= 0xff)
        .map(|(name, n)| (*n, name.as_str()))
        .collect();
    assert_eq!(primaries.len(), 31, "{primaries:?}");
    for code in -1..=600 {
        assert_eq!(primary_name(code), primaries.get(&code).copied(), "code {code}");
    }
}

#[test]
fn an_extended_codes_primary_is_its_low_byte() {
    let table = sqlite_codes();
    for (name, n) in &table {
        if *n > 0xff {
            let primary = primary_name(primary_of(*n)).expect("every extended code has a primary");
            assert!(
                name.starts_with(&format!("{primary}_")),
                "{name} ({n}) is not under {primary}"
            );
        }
    }
    assert_eq!(primary_of(517), 5);
    assert_eq!(primary_of(8458), 10);
}

#[test]
fn errno_names_read_back_to_their_numbers() {
    for (n, name) in [
        (24, "EMFILE"),
        (28, "ENOSPC"),
        (13, "EACCES"),
        (122, "EDQUOT"),
        (2, "ENOENT"),
    ] {
        assert_eq!(errno::from_name(name), Some(n));
        assert_eq!(errno::from_name(&name.to_lowercase()), Some(n));
        assert_eq!(errno::describe(n).map(|(s, _)| s), Some(name));
    }
    assert_eq!(errno::from_name("EWHATEVER"), None);
    assert_eq!(errno::from_name(""), None);
}

#[test]
fn labels_read_back_to_the_same_value() {
    for c in Cause::ALL {
        assert_eq!(Cause::from_label(c.label()), Some(c), "{c:?}");
        assert_eq!(c.failure_label(), format!("session_persistence_failed:{}", c.label()));
    }
    assert_eq!(Cause::Disk.failure_label(), "session_persistence_failed:disk");
    assert_eq!(Cause::from_label("no_such_cause"), None);
    for o in Outcome::ALL {
        assert_eq!(Outcome::from_label(o.label()), Some(o), "{o:?}");
    }
    assert_eq!(Outcome::from_label("diverted"), Some(Outcome::Diverted));
    assert_eq!(Outcome::from_label("no_such_outcome"), None);
}
