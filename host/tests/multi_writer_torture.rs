//! SIGKILL at every effect boundary with four writers at once on one home,
//! two of them on one session (`torture::multi` says what each iteration
//! does and checks). The short run here takes every crash point four times
//! (seed 1 unless `TORTURE_SEED` gives another). The long run is the
//! bench's: `scripts/multi-writer-torture` (2,000 iterations unless
//! `TORTURE_ITERATIONS` says otherwise, a seed from the clock unless
//! `TORTURE_SEED`), or this file's ignored test.
mod torture;

use torture::{POINTS, Stats};

fn check(stats: &Stats, iterations: u64) {
    for f in stats.failures.iter().take(30) {
        println!("FAILURE {f}");
    }
    assert!(
        stats.failures.is_empty(),
        "{} failures:\n{}",
        stats.failures.len(),
        stats.failures.join("\n")
    );
    assert_eq!(stats.iterations, iterations);
    assert_eq!((stats.lost, stats.duplicated, stats.quarantined), (0, 0, 0));
    assert!(stats.acknowledged > 0 && stats.resent > 0);
    assert!(stats.fenced > 0, "the writers sharing a session never met the lease");
    assert!(
        stats.kills >= iterations,
        "too few kills to mean anything: {}",
        stats.kills
    );
    // Every crash point was reached and killed a process at least once.
    let missed: Vec<&str> = POINTS
        .iter()
        .copied()
        .filter(|p| !stats.by_point.contains_key(p))
        .collect();
    assert!(
        missed.is_empty(),
        "crash points never hit in {iterations} iterations: {missed:?} (kills by point: {:?})",
        stats.by_point
    );
}

#[test]
fn four_writers_lose_and_duplicate_nothing_across_kills() {
    let iterations = 4 * POINTS.len() as u64;
    assert!(iterations >= 50);
    let stats = torture::multi::run(iterations, torture::seed_from_env_or(1));
    check(&stats, iterations);
}

/// The long run: `cargo test -p turnsafe-host --test multi_writer_torture
/// -- --ignored --nocapture` (or `scripts/multi-writer-torture`).
#[test]
#[ignore = "long: thousands of iterations, for the bench"]
fn long_run() {
    let iterations = std::env::var("TORTURE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let stats = torture::multi::run(iterations, torture::seed_from_env());
    check(&stats, iterations);
}
