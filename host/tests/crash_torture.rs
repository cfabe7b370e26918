//! SIGKILL at every effect boundary of flush, divert, capture and replay; after
//! each kill the store is reopened and replayed, and every acknowledged
//! message must be there exactly once, and every crash point the host has
//! must have killed a process at least once. The seed is fixed (1) unless
//! `TORTURE_SEED` gives another; `TORTURE_ITERATIONS` changes the count
//! (default 200).
mod torture;

#[test]
fn no_acknowledged_message_is_lost_or_duplicated_across_kills() {
    let iterations = std::env::var("TORTURE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let stats = torture::run(iterations, torture::seed_from_env_or(1));
    assert!(
        stats.failures.is_empty(),
        "{} failures:\n{}",
        stats.failures.len(),
        stats.failures.join("\n")
    );
    assert_eq!(stats.iterations, iterations);
    assert!(
        stats.kills * 3 >= iterations,
        "too few kills to mean anything: {}",
        stats.kills
    );
    assert!(stats.acknowledged > 0);
    // Every crash point was reached and killed its process at least once.
    let missed: Vec<&str> = torture::POINTS
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
