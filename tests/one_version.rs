//! One release, one version: the workspace (`Cargo.toml`, whose version the
//! `turnsafe` binary and the policy crate take), the Python package
//! (`python/Cargo.toml`, whose version the wheel takes) and the npm package
//! (`js/package.json` and its lockfile) name the same one, and the top
//! entry of `CHANGELOG.md` is that release.
//!
//! The policy component's WIT package has a version of its own by design:
//! it is the contract version (`docs/EMBEDDING.md`, "Versioning"), bumped
//! only when the contract changes, so it is not compared with the release
//! version. What is compared: the package line of `wit/policy.wit`, the
//! newest entry of the contract changelog in `docs/EMBEDDING.md`, and the
//! contract the top entry of `CHANGELOG.md` says its artifacts carry.
//!
//! The files are read as text, with the few rules below, so this test
//! needs no TOML parser; each rule fails loudly when the file's shape moves.

use std::path::Path;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `version = "..."` in the `[section]` table of a Cargo manifest.
fn toml_version(rel: &str, section: &str) -> String {
    let text = read(rel);
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
            continue;
        }
        if inside
            && let Some(rest) = line.strip_prefix("version")
            && let Some(value) = rest.trim_start().strip_prefix('=')
        {
            return value.trim().trim_matches('"').to_string();
        }
    }
    panic!("{rel} has no version in [{section}]");
}

fn json_version(rel: &str, pointer: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"));
    v.pointer(pointer)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_else(|| panic!("{rel} has no string at {pointer}"))
        .to_string()
}

/// The version of `package turnsafe:policy@X;` in the WIT file.
fn wit_version() -> String {
    let text = read("wit/policy.wit");
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("package turnsafe:policy@"))
        .expect("wit/policy.wit has no `package turnsafe:policy@X;` line");
    line.trim_start_matches("package turnsafe:policy@")
        .trim_end_matches(';')
        .to_string()
}

/// The first `### X` heading under `## Changelog` in docs/EMBEDDING.md.
fn contract_changelog_version() -> String {
    let text = read("docs/EMBEDDING.md");
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("## ") {
            inside = line.trim() == "## Changelog";
            continue;
        }
        if inside && let Some(heading) = line.strip_prefix("### ") {
            return heading.split_whitespace().next().unwrap_or_default().to_string();
        }
    }
    panic!("docs/EMBEDDING.md has no `### X` entry under `## Changelog`");
}

/// The first `## ` heading of CHANGELOG.md.
fn changelog_top() -> String {
    read("CHANGELOG.md")
        .lines()
        .find(|l| l.starts_with("## "))
        .expect("CHANGELOG.md has no `## ` entry")
        .to_string()
}

#[test]
fn every_package_names_the_release_version() {
    let release = toml_version("Cargo.toml", "workspace.package");
    let found = [
        (
            "python/Cargo.toml [package]",
            toml_version("python/Cargo.toml", "package"),
        ),
        ("js/package.json", json_version("js/package.json", "/version")),
        ("js/package-lock.json", json_version("js/package-lock.json", "/version")),
        (
            "js/package-lock.json packages[\"\"]",
            json_version("js/package-lock.json", "/packages//version"),
        ),
    ];
    for (what, version) in found {
        assert_eq!(
            version, release,
            "{what} says version {version}, the workspace's Cargo.toml {release}: a release has one version"
        );
    }
}

#[test]
fn the_changelog_opens_with_this_release_and_its_contract() {
    let release = toml_version("Cargo.toml", "workspace.package");
    let contract = wit_version();
    let top = changelog_top();
    let named = top
        .trim_start_matches("## ")
        .split_whitespace()
        .next()
        .unwrap_or_default();
    assert_eq!(
        named, release,
        "CHANGELOG.md's top entry ({top:?}) is not the release version {release}"
    );
    assert!(
        top.contains(&format!("turnsafe:policy@{contract}")),
        "CHANGELOG.md's top entry ({top:?}) does not name the contract wit/policy.wit declares, turnsafe:policy@{contract}"
    );
}

#[test]
fn the_contract_changelog_opens_with_the_wit_version() {
    assert_eq!(
        contract_changelog_version(),
        wit_version(),
        "docs/EMBEDDING.md's contract changelog does not open with the version wit/policy.wit declares"
    );
}
