//! `turnsafe import hermes` on copies of the committed Hermes home
//! (`tests/fixtures/hermes-0.19.0`) that the input mutates: bytes of
//! `state.db` overwritten (wrong column types, NULLs, huge lengths, a
//! corrupt page), the file cut short, or the session's divert file or
//! snapshot replaced by the input's bytes.
//!
//! Properties: the import answers with a report or an error, never a
//! panic; it never writes into the source (every file there keeps its
//! bytes, and no file appears or goes); a line of the divert file it
//! quarantines keeps its bytes in the quarantine.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use sha2::Digest;
use turnsafe_host::import_hermes::{ImportOptions, import};

const FIXTURE: &str = "hermes-0.19.0";
const DB: &[u8] = include_bytes!("../../../tests/fixtures/hermes-0.19.0/state.db");
const JSONL_NAME: &str = "20260101_090000_a1b2c3.jsonl";
const JSONL: &[u8] = include_bytes!("../../../tests/fixtures/hermes-0.19.0/sessions/20260101_090000_a1b2c3.jsonl");
const SNAPSHOT_NAME: &str = "session_20260101_090000_a1b2c3.json";
const SNAPSHOT: &[u8] =
    include_bytes!("../../../tests/fixtures/hermes-0.19.0/sessions/session_20260101_090000_a1b2c3.json");

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap_or(&path).to_string_lossy().into_owned();
                out.insert(name, std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    out
}

/// The mutated Hermes home the input describes: its first byte picks the
/// mutation, the rest drives it.
fn mutated(data: &[u8]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (mut db, mut jsonl, mut snap) = (DB.to_vec(), JSONL.to_vec(), SNAPSHOT.to_vec());
    let Some((mode, rest)) = data.split_first() else {
        return (db, jsonl, snap);
    };
    match mode % 4 {
        // Overwrite bytes of state.db: 3 bytes of offset, 1 of value, in turn.
        0 | 1 => {
            let patches = if mode % 4 == 1 && rest.len() >= 2 {
                // Cut the file short first (at a multiple of 512 bytes, or anywhere).
                let at = usize::from(u16::from_le_bytes([rest[0], rest[1]])) * 8 % db.len();
                db.truncate(at);
                &rest[2..]
            } else {
                rest
            };
            for p in patches.chunks_exact(4) {
                if db.is_empty() {
                    break;
                }
                let at = (usize::from(p[0]) | usize::from(p[1]) << 8 | usize::from(p[2]) << 16) % db.len();
                db[at] = p[3];
            }
        }
        2 => jsonl = rest.to_vec(),
        _ => snap = rest.to_vec(),
    }
    (db, jsonl, snap)
}

pub fn check_in(scratch: &Path, data: &[u8]) -> Result<(), String> {
    let (db, jsonl, snap) = mutated(data);
    let dir = tempfile::tempdir_in(scratch).map_err(|e| e.to_string())?;
    let source = dir.path().join(FIXTURE);
    std::fs::create_dir_all(source.join("sessions")).map_err(|e| e.to_string())?;
    std::fs::write(source.join("state.db"), &db).map_err(|e| e.to_string())?;
    std::fs::write(source.join("sessions").join(JSONL_NAME), &jsonl).map_err(|e| e.to_string())?;
    std::fs::write(source.join("sessions").join(SNAPSHOT_NAME), &snap).map_err(|e| e.to_string())?;
    let before = snapshot(&source);
    let home = dir.path().join("home");
    let opts = ImportOptions {
        copy_attempts: 2,
        ..ImportOptions::default()
    };
    let result = import(&source, &home, &opts);
    if snapshot(&source) != before {
        return Err(format!(
            "the import wrote into the Hermes home ({:?})",
            result.map(|r| r.summary())
        ));
    }
    // A quarantined line keeps its bytes.
    if let Ok(report) = &result
        && let Some(q) = &report.quarantine
        && let Ok(text) = std::fs::read(q)
    {
        for entry in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: Value = turnsafe_host::json_in::value_bytes(entry)
                .map_err(|e| format!("a quarantine line is not JSON: {e}"))?;
            if v["source"].as_str().is_some_and(|s| s.ends_with(JSONL_NAME))
                && let Some(n) = v["line"].as_u64()
            {
                let line = jsonl
                    .split(|b| *b == b'\n')
                    .nth(n.saturating_sub(1) as usize)
                    .unwrap_or_default();
                let sha = hex::encode(sha2::Sha256::digest(line));
                let same = v["sha256"].as_str().is_some_and(|s| s.ends_with(&sha))
                    && (v["utf8"] != true || v["text"].as_str().map(str::as_bytes) == Some(line));
                if !same {
                    return Err(format!("quarantined line {n} does not keep its bytes: {v}"));
                }
            }
        }
    }
    Ok(())
}

pub fn check(data: &[u8]) -> Result<(), String> {
    check_in(&std::env::temp_dir(), data)
}
