//! Replays, without nightly, what the fuzz targets found worth keeping:
//! every committed seed (`fuzz/corpus/<target>/`) and every reproducer of
//! a past find (`fuzz/regressions/<target>/`), through the same checks the
//! targets run. A target without a corpus folder, or with an empty one,
//! fails: a corpus that went missing must not pass as one that passed.

use std::path::{Path, PathBuf};

use turnsafe_fuzz_checks::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.expect("a readable corpus entry").path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn every_committed_input_passes_its_targets_checks() {
    let mut failures = Vec::new();
    let mut ran = 0usize;
    for (name, check) in TARGETS {
        let corpus = fuzz_dir().join("corpus").join(name);
        let seeds = files(&corpus);
        assert!(
            !seeds.is_empty(),
            "{name}: no committed corpus at {} (regenerate with fuzz/make-seeds)",
            corpus.display()
        );
        let found = files(&fuzz_dir().join("regressions").join(name));
        for path in seeds.iter().chain(&found) {
            let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            ran += 1;
            // A panic is a finding like any other: report them all.
            match std::panic::catch_unwind(|| check(&bytes)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(format!("{name}: {}: {e}", path.display())),
                Err(p) => failures.push(format!("{name}: {}: panicked: {}", path.display(), panic_text(&p))),
            }
        }
    }
    eprintln!("fuzz corpus replay: {ran} inputs over {} targets", TARGETS.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every target named in `fuzz/Cargo.toml` has a check here, and back:
/// a target added on one side only would fuzz or replay nothing.
#[test]
fn the_fuzz_crate_and_the_checks_name_the_same_targets() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut in_manifest: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "turnsafe-fuzz")
        .collect();
    in_manifest.sort();
    let mut here: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    here.sort();
    assert_eq!(in_manifest, here);
}
