//! The Hermes home written by hermes-agent 0.19.0's own `SessionDB`
//! (`tests/fixtures/hermes-0.19.0`), copied for a test, and its files'
//! bytes, to check that an import left it as it was.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A copy of the fixture home, in `dir/hermes`.
pub fn hermes_home(dir: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hermes-0.19.0");
    let to = dir.join("hermes");
    for entry in walk(&fixture) {
        let target = to.join(entry.strip_prefix(&fixture).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &target).unwrap();
    }
    to
}

/// Every file under `dir`, sorted.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
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

/// Every file under `dir` with its bytes.
pub fn bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walk(dir)
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect()
}
