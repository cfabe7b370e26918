//! `turnsafe import hermes` on a Hermes home written by hermes-agent
//! 0.19.0's own `SessionDB` (`tests/fixtures/hermes-0.19.0`, made by
//! `tests/fixtures/make-hermes-home.py`): the human report and every
//! refusal as the user reads them (snapshots), the JSON counts, a second
//! import that adds nothing, and a Hermes home that keeps every byte.
//! The field-by-field comparison with Hermes' own `get_messages`, a live
//! Hermes writer and an unflushed WAL are in
//! `python/tests/test_import_hermes.py`, where the real package runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use turnsafe_host::import_hermes::ImportError;

const S1: &str = "20260101_090000_a1b2c3";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turnsafe")
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn turnsafe(args: &[&str]) -> Run {
    let out = std::process::Command::new(bin()).args(args).output().unwrap();
    Run {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A copy of the fixture home, in `dir/hermes`.
fn hermes_home(dir: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hermes-0.19.0");
    let to = dir.join("hermes");
    for entry in walk(&fixture) {
        let rel = entry.strip_prefix(&fixture).unwrap();
        let target = to.join(rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &target).unwrap();
    }
    to
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walk(dir)
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect()
}

fn redact(text: &str, dir: &Path) -> String {
    text.replace(dir.to_str().unwrap(), "[DIR]")
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_hermes_home_imports_once_and_is_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let source = hermes_home(dir.path());
    let home = dir.path().join("turnsafe");
    let before = bytes(&source);
    let (src, dst) = (source.to_str().unwrap(), home.to_str().unwrap());

    let dry = turnsafe(&["import", "hermes", "--source", src, "--home", dst, "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(!home.exists(), "a dry run writes nothing");

    let r = turnsafe(&["import", "hermes", "--source", src, "--home", dst]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    turnsafe_tests::snapshot_settings().bind(|| {
        insta::assert_snapshot!("operator__import_hermes_report", redact(&r.stdout, dir.path()));
        insta::assert_snapshot!("operator__import_hermes_dry_run", redact(&dry.stdout, dir.path()));
    });
    assert_eq!(
        dry.stdout.lines().next(),
        r.stdout.lines().next(),
        "a dry run reports what the import does"
    );

    let again = turnsafe(&["import", "hermes", "--source", src, "--home", dst, "--json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let lines = json_lines(&again.stdout);
    let end = &lines.last().unwrap()["data"];
    assert_eq!((end["imported"].as_u64(), end["archived"].as_u64()), (Some(0), Some(0)));
    assert_eq!(end["sessions"], 2);
    assert_eq!(end["quarantined"], 1);
    assert_eq!(end["torn"], 1);
    let mapped = &end["renamed"]["user 42/ü"];
    assert_eq!(mapped, "user_42__-h10fbab2a704de8bd73782225570d18a0");

    // What the home holds: the session in Hermes' order, then the new
    // divert and snapshot lines; the compacted rows archived.
    let show = turnsafe(&["show", "--home", dst, "--session", S1, "--json"]);
    let contents: Vec<Value> = json_lines(&show.stdout)
        .into_iter()
        .filter(|v| v["type"] == "message")
        .map(|v| v["data"]["message"]["content"].clone())
        .collect();
    assert_eq!(
        contents,
        [
            Value::from("[summary] 4.2 km"),
            Value::from("4,2 km."),
            Value::from("Und morgen? ☀"),
            Value::from("Morgen auch."),
        ]
    );
    let archived = turnsafe(&["show", "--home", dst, "--session", S1, "--archived", "--json"]);
    assert!(archived.stdout.contains("compaction"), "{}", archived.stdout);
    assert_eq!(bytes(&source), before, "the Hermes home keeps every byte");
}

#[test]
fn refusals_say_what_was_refused_and_that_nothing_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let source = hermes_home(dir.path());
    let src = source.to_str().unwrap();
    let before = bytes(&source);

    let same = turnsafe(&["import", "hermes", "--source", src, "--home", src]);
    assert_eq!(same.code, 5);
    let unknown = turnsafe(&[
        "import",
        "hermes",
        "--source",
        src,
        "--home",
        dir.path().join("t").to_str().unwrap(),
        "--session",
        "nope",
    ]);
    assert_eq!(unknown.code, 2);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let missing = turnsafe(&["import", "hermes", "--source", empty.to_str().unwrap(), "--home", src]);
    assert_eq!(missing.code, 2);
    let not_hermes_dir = dir.path().join("other");
    std::fs::create_dir(&not_hermes_dir).unwrap();
    rusqlite::Connection::open(not_hermes_dir.join("state.db"))
        .unwrap()
        .execute_batch("CREATE TABLE t(x)")
        .unwrap();
    let not_hermes = turnsafe(&[
        "import",
        "hermes",
        "--source",
        not_hermes_dir.to_str().unwrap(),
        "--home",
        dir.path().join("t2").to_str().unwrap(),
    ]);
    assert_eq!(not_hermes.code, 2);
    let busy = ImportError::SourceBusy {
        path: PathBuf::from("/home/me/.hermes/state.db"),
        attempts: 10,
    };
    assert!(busy.is_refusal());
    let text = [
        ("home is the source", same.stderr),
        ("no such session", unknown.stderr),
        ("no state.db", missing.stderr),
        ("not a Hermes database", not_hermes.stderr),
        ("Hermes kept writing", format!("turnsafe import hermes: {busy}\n")),
    ]
    .iter()
    .map(|(k, v)| format!("{k}:\n{}", redact(v, dir.path())))
    .collect::<Vec<_>>()
    .join("\n");
    turnsafe_tests::snapshot_settings().bind(|| {
        insta::assert_snapshot!("operator__import_hermes_refusals", text);
    });
    assert_eq!(bytes(&source), before);
    assert!(!dir.path().join("t").exists() && !dir.path().join("t2").exists());
}
