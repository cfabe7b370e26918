//! The phrase fallback reads SQLite's texts as SQLite and the hosts shape
//! them, never a phrase inside a path, a file name, a table's name or an
//! identifier, and never a message that came with a SQLSTATE: there the
//! SQLSTATE (and the codes the host translated it onto) decide alone.
//! `tests/vectors/phrases.json` holds the same cases for every runtime;
//! this file checks that it covers every phrase the classifier knows, and
//! crosses every phrase with every SQLSTATE.

use serde_json::Value;
use turnsafe_policy::{Basis, Cause, Engine, Evidence, Observation, Operation, classify, known_phrases};

fn vectors() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/phrases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn message(v: &Value) -> String {
    v["observation"]["message"].as_str().unwrap_or_default().to_lowercase()
}

/// How a family of vectors carries a phrase in its message.
type Shape = dyn Fn(&str) -> String;

/// Each phrase appears alone, inside a path, as a table's name, inside an
/// identifier, after a SQLSTATE, and from PostgreSQL without one.
#[test]
fn the_shared_vectors_cover_every_known_phrase() {
    let vectors = vectors();
    let families: [(&str, &Shape); 6] = [
        ("phrase_alone_", &|p| p.to_string()),
        ("phrase_in_a_path_", &|p| format!("/home/ana/{p}/state.db")),
        ("phrase_as_a_table_name_", &|p| format!("no such table: {p}")),
        ("phrase_inside_an_identifier_", &|p| {
            format!("table {p} has no column named uid")
        }),
        ("phrase_with_sqlstate_42501_", &|p| {
            format!("postgres sqlstate 42501: {p}")
        }),
        ("phrase_from_postgres_without_sqlstate_", &|p| {
            format!("postgres sqlstate none: {p}")
        }),
    ];
    let mut missing = Vec::new();
    for phrase in known_phrases() {
        for (prefix, shape) in &families {
            let want = shape(phrase);
            let found = vectors
                .iter()
                .any(|v| v["name"].as_str().is_some_and(|n| n.starts_with(prefix)) && message(v).contains(&want));
            if !found {
                missing.push(format!("{prefix}: {want}"));
            }
        }
        let with_sqlstate = vectors
            .iter()
            .filter(|v| v["name"].as_str().is_some_and(|n| n.starts_with("sqlstate_")) && message(v).contains(phrase))
            .count();
        if with_sqlstate < 2 {
            missing.push(format!("two known SQLSTATEs with {phrase:?}"));
        }
    }
    assert!(missing.is_empty(), "phrases.json lacks:\n{}", missing.join("\n"));
}

/// The SQLSTATEs whose meaning the policy knows, a few it does not, and the
/// codes a host translates each onto (`host/src/pg/translate.rs`).
const STATES: &[(&str, Option<i64>, Option<i64>)] = &[
    ("40001", Some(5), None),
    ("40P01", Some(5), None),
    ("55P03", Some(5), None),
    ("53100", Some(13), None),
    ("XX001", Some(11), None),
    ("XX002", Some(11), None),
    ("25006", Some(8), None),
    ("08001", Some(10), None),
    ("08006", Some(10), None),
    ("57P01", Some(10), None),
    ("53300", Some(14), None),
    ("3D000", Some(14), None),
    ("28P01", Some(23), None),
    ("23505", Some(19), Some(2067)),
    ("23503", Some(19), Some(787)),
    ("22P02", None, None),
    ("42501", None, None),
    ("42601", None, None),
    ("42P01", None, None),
];

/// The ways a host passes a phrase: bare, after its own label, before a
/// detail, after the CANTOPEN text.
fn shapes(phrase: &str) -> [String; 4] {
    [
        phrase.to_string(),
        format!("postgres SQLSTATE XX000: {phrase}"),
        format!("{phrase}: messages"),
        format!("unable to open database file: {phrase}"),
    ]
}

#[test]
fn with_a_sqlstate_no_phrase_adds_anything() {
    for &(state, code, extended_code) in STATES {
        for engine in Engine::ALL {
            for operation in Operation::ALL {
                for evidence in [vec![], vec![Evidence::FtsScope]] {
                    let obs = |message: String| Observation {
                        engine,
                        sqlstate: Some(state.to_string()),
                        code,
                        extended_code,
                        message,
                        evidence: evidence.clone(),
                        ..Observation::new(operation)
                    };
                    let silent = classify(&obs(String::new()));
                    assert_ne!(silent.basis, Basis::Message, "{state}");
                    for phrase in known_phrases() {
                        for message in shapes(phrase) {
                            assert_eq!(
                                classify(&obs(message.clone())),
                                silent,
                                "{state} {code:?}/{extended_code:?} {engine:?} {operation:?}: {message:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// PostgreSQL's failures are read by their SQLSTATE; without one, their
/// text names no cause (a client error, a TLS handshake, a schema check).
#[test]
fn from_postgres_without_a_sqlstate_no_phrase_adds_anything() {
    for code in [None, Some(1), Some(10), Some(14)] {
        for phrase in known_phrases() {
            for message in shapes(phrase) {
                let obs = |message: String| Observation {
                    engine: Engine::Postgres,
                    code,
                    message,
                    ..Observation::new(Operation::AppendBatch)
                };
                assert_eq!(
                    classify(&obs(message.clone())),
                    classify(&obs(String::new())),
                    "{message:?}"
                );
            }
        }
    }
}

/// From a SQLite host with no code, each phrase still names its cause in
/// every shape SQLite and the hosts give it (the fallback stays).
#[test]
fn from_sqlite_without_codes_each_phrase_names_its_cause_in_every_shape() {
    for phrase in known_phrases() {
        let alone = classify(&Observation {
            message: phrase.to_string(),
            ..Observation::new(Operation::AppendBatch)
        });
        assert_eq!(alone.basis, Basis::Message, "{phrase}");
        assert_ne!(alone.cause, Cause::Unknown, "{phrase}");
        for message in [
            format!("sqlite3.OperationalError: {phrase}"),
            format!("SqliteError: {phrase}: messages"),
            phrase.to_uppercase(),
        ] {
            let c = classify(&Observation {
                message: message.clone(),
                ..Observation::new(Operation::AppendBatch)
            });
            assert_eq!(c, alone, "{message:?}");
        }
    }
}

/// What follows a path is the path's, and what follows a sentence is its
/// detail: neither is read, whatever it says.
#[test]
fn a_phrase_after_a_path_or_in_a_detail_is_not_read() {
    for phrase in known_phrases() {
        for (message, want) in [
            (format!("unable to open database file: /srv/a: {phrase}"), Cause::Disk),
            (
                format!("unable to open database file: C:\\agents: {phrase}"),
                Cause::Disk,
            ),
            (format!("no such table: {phrase}"), Cause::Unknown),
            (format!("no such column: {phrase}"), Cause::Unknown),
            (format!("near \"{phrase}\": syntax error"), Cause::Unknown),
        ] {
            for evidence in [vec![], vec![Evidence::FtsScope]] {
                let c = classify(&Observation {
                    message: message.clone(),
                    evidence,
                    ..Observation::new(Operation::AppendBatch)
                });
                assert_eq!(c.cause, want, "{message:?}");
            }
        }
    }
}
