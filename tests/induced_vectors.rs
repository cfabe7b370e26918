//! The "induced" vectors (`tests/vectors/*.json` entries with an `induced`
//! note) were recorded from real failures. Each is induced again for real
//! by the runtime that recorded it, and the observation that runtime's host
//! builds must equal the vector's: operation, codes, errno, evidence and
//! message. Attempt, elapsed time and seed vary by nature and are left out.
//!
//! This file re-induces the vectors the Rust host recorded (`turnsafe ...`)
//! and checks that every other induced vector has an inducer in the suite
//! of the runtime it names: `Python ...` in the `INDUCERS` table of
//! `examples/python/tests/test_induced_vectors.py`, `Node ...` in that of
//! `examples/node/test/induced.test.mjs`, `JavaScript ...` (the JavaScript
//! package's own host, `js/`) in that of `js/test/induced.test.mjs` (each
//! suite induces every entry).
mod common;
use common::*;
use serde_json::Value;
use turnsafe_host::backend::Backend;
use turnsafe_host::faultvfs::{self, Fault, FileKind, Op};
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::store::StoreOptions;
use turnsafe_host::store::index::IndexError;
use turnsafe_policy::{Evidence, Observation, Operation};

fn induced_vectors() -> Vec<Value> {
    let dir = turnsafe_tests::root().join("tests/vectors");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            let items: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
            items
        })
        .filter(|v| v.get("induced").is_some())
        .collect()
}

/// A vector's observation, with the policy's defaults for absent fields.
fn recorded(v: &Value) -> Observation {
    let op = v["operation"].as_str().unwrap_or("append_batch");
    let mut evidence: Vec<Evidence> = v["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| Evidence::from_label(e.as_str().unwrap()).expect("a known evidence label"))
        .collect();
    evidence.sort();
    Observation {
        code: v["code"].as_i64(),
        extended_code: v["extended_code"].as_i64(),
        message: v["message"].as_str().unwrap_or_default().to_string(),
        errno: v["errno"].as_i64(),
        evidence,
        ..Observation::new(Operation::from_label(op).expect("a known operation"))
    }
}

/// The fields a real failure fixes; `attempt`, `elapsed_ms` and `seed` do not.
fn normalised(mut o: Observation) -> Observation {
    o.attempt = 1;
    o.elapsed_ms = 0;
    o.seed = 0;
    o
}

/// The observation a flush made of its last failure: what the host
/// observed (the outcome's `failure`) and the operation that failed.
fn observed(out: FlushOutcome) -> Observation {
    let operation = out.operation.expect("the outcome names the failed operation");
    let f = out.failure.expect("the flush observed a failure");
    Observation {
        code: f.code,
        extended_code: f.extended_code,
        message: f.message,
        errno: f.errno,
        evidence: f.evidence,
        ..Observation::new(operation)
    }
}

/// The observation the Rust host builds when the failure is induced again.
fn reinduce(name: &str) -> Option<Observation> {
    let home = Home::new();
    let tag = home.path().to_string_lossy().into_owned();
    let fault_store = || {
        faultvfs::register().unwrap();
        home.store_with(StoreOptions {
            vfs: Some(faultvfs::VFS_NAME.into()),
            ..StoreOptions::default()
        })
    };
    let observed = match name {
        // WAL; B opens a read transaction, A commits, B tries to write.
        "induced_busy_snapshot" => {
            drop(home.store());
            let a = home.other();
            let b = home.other();
            b.busy_timeout(std::time::Duration::ZERO).unwrap();
            b.execute_batch("BEGIN").unwrap();
            let _: i64 = b.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
            a.execute("INSERT INTO state_meta(key, value) VALUES ('probe', 'a')", [])
                .unwrap();
            let err = b
                .execute("UPDATE state_meta SET value = value WHERE key = 'generation'", [])
                .unwrap_err();
            let errno = turnsafe_host::observe::system_errno(&b);
            turnsafe_host::observe::observation(Operation::AppendBatch, &err, errno, vec![], 1, 0, 0)
        }
        // The first 100 bytes of state.db overwritten with 0x5A, then the store opens it.
        "induced_notadb_at_open_host" => {
            let mut first = home.store();
            assert!(first.append_batch(&sid("s1"), &batch("a", 1)).persisted);
            drop(first);
            let mut bytes = std::fs::read(home.db()).unwrap();
            bytes[..100].fill(0x5A);
            std::fs::write(home.db(), &bytes).unwrap();
            let out = home.store().append_batch(&sid("s1"), &batch("b", 1));
            observed(out)
        }
        // The first WAL xWrite of a flush fails with SQLITE_IOERR_WRITE.
        "induced_fault_vfs_wal_write" => {
            let mut store = fault_store();
            let _f = faultvfs::arm(Fault::new(&tag, Op::Write, FileKind::Wal, 1)).unwrap();
            let out = store.append_batch(&sid("s1"), &batch("a", 1));
            observed(out)
        }
        // xShmMap/xShmLock fail.
        "induced_fault_vfs_shm" => {
            let mut store = fault_store();
            let _f = faultvfs::arm(Fault::new(&tag, Op::Shm, FileKind::Main, 1).persistent()).unwrap();
            let out = store.append_batch(&sid("s1"), &batch("a", 1));
            observed(out)
        }
        // A WAL xWrite fails with errno ENOSPC, read back with sqlite3_system_errno.
        "induced_fault_vfs_enospc" => {
            let mut store = fault_store();
            let _f = faultvfs::arm(Fault::new(&tag, Op::Write, FileKind::Wal, 1).errno(libc::ENOSPC)).unwrap();
            let out = store.append_batch(&sid("s1"), &batch("a", 1));
            observed(out)
        }
        // The FTS5 structure record overwritten with 0xFF. The index is off
        // the commit path, so the next batch commits; the catch-up that
        // indexes it meets the damage and shows the policy what it saw.
        "fts_scope_with_constraint_is_fts_index" => {
            let mut store = home.store();
            assert!(store.append_batch(&sid("s1"), &batch("a", 2)).persisted);
            store.catch_up_index(None).unwrap();
            home.other()
                .execute("UPDATE messages_fts_data SET block = X'FFFFFFFF' WHERE id = 10", [])
                .unwrap();
            assert!(store.append_batch(&sid("s1"), &batch("b", 1)).persisted);
            match store.catch_up_index(None) {
                Err(IndexError::Damaged { observation, .. }) => *observation,
                other => panic!("the catch-up did not meet the damage: {other:?}"),
            }
        }
        _ => return None,
    };
    Some(observed)
}

/// What an `induced` note starts with: the runtime that recorded the
/// vector (the Rust host, the Python and Node examples, the JavaScript
/// package's host).
const RUNTIMES: [&str; 4] = ["turnsafe", "Python", "Node", "JavaScript"];

/// The names in the `INDUCERS = { ... }` table of another runtime's suite:
/// each key, quoted (Python) or bare (JavaScript), before its colon.
fn inducer_names(suite: &str) -> std::collections::BTreeSet<String> {
    let path = turnsafe_tests::root().join(suite);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = text
        .find("INDUCERS = {")
        .unwrap_or_else(|| panic!("{suite} has no `INDUCERS = {{` table"));
    let body = &text[start..];
    let body = &body[..body
        .find("\n}")
        .unwrap_or_else(|| panic!("{suite}: the INDUCERS table does not end"))];
    // The opening line `INDUCERS = {` has no `key:` and yields nothing.
    body.lines()
        .filter_map(|l| {
            let key = l.trim().split_once(':')?.0.trim().trim_matches('"');
            let identifier = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            identifier.then(|| key.to_string())
        })
        .collect()
}

#[test]
fn every_induced_vector_is_reinduced_by_the_runtime_that_recorded_it() {
    let vectors = induced_vectors();
    assert!(vectors.len() >= 5, "only {} induced vectors", vectors.len());
    // Each runtime's inducers: the Rust host's here ([`reinduce`]); the
    // Python, Node and JavaScript package suites' own tables, whose tests
    // induce each entry for real and fail on any vector of theirs without one.
    let python = inducer_names("examples/python/tests/test_induced_vectors.py");
    let node = inducer_names("examples/node/test/induced.test.mjs");
    let javascript = inducer_names("js/test/induced.test.mjs");
    let mut by_runtime = std::collections::BTreeMap::<&str, Vec<&str>>::new();
    let mut missing = Vec::new();
    for v in &vectors {
        let name = v["name"].as_str().unwrap();
        let note = v["induced"].as_str().unwrap();
        let runtime = RUNTIMES
            .into_iter()
            .find(|r| note.starts_with(r))
            .unwrap_or_else(|| panic!("{name}: `induced` must start with the runtime that recorded it: {note}"));
        by_runtime.entry(runtime).or_default().push(name);
        let reinduced = match runtime {
            "turnsafe" => reinduce(name).is_some(),
            "Python" => python.contains(name),
            "Node" => node.contains(name),
            _ => javascript.contains(name),
        };
        if !reinduced {
            missing.push(format!("{name}: recorded by {runtime}, which does not induce it again"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    for runtime in RUNTIMES {
        assert!(
            by_runtime.contains_key(runtime),
            "no vector recorded by {runtime}: {by_runtime:?}"
        );
    }
}

#[test]
fn the_rust_host_builds_the_recorded_observations() {
    let mut failures = Vec::new();
    let mut checked = 0;
    // The Rust host's vectors; the Python and Node suites induce their own,
    // and the test above fails on any vector no runtime induces again.
    let rust_vectors = induced_vectors()
        .into_iter()
        .filter(|v| v["induced"].as_str().unwrap().starts_with("turnsafe"));
    for v in rust_vectors {
        let name = v["name"].as_str().unwrap();
        let want = normalised(recorded(&v["observation"]));
        match reinduce(name) {
            None => failures.push(format!("{name}: recorded by the Rust host, but not induced again here")),
            Some(got) => {
                let got = normalised(got);
                checked += 1;
                if got != want {
                    failures.push(format!("{name}:\n  recorded: {want:?}\n  induced:  {got:?}"));
                }
            }
        }
    }
    assert!(checked >= 5, "only {checked} vectors induced again");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
