//! SIGKILL at every effect boundary with four writers at once on one home,
//! two of them on one session (`torture::multi` says what each iteration
//! does and checks). The short run here takes every crash point four times
//! (seed 1 unless `TORTURE_SEED` gives another). The long run is the
//! bench's: `scripts/multi-writer-torture` (2,000 iterations unless
//! `TORTURE_ITERATIONS` says otherwise, a seed from the clock unless
//! `TORTURE_SEED`), which runs `benches/multi_writer_torture.rs`.
mod torture;

use torture::POINTS;
use torture::multi::check;

#[test]
fn four_writers_lose_and_duplicate_nothing_across_kills() {
    let iterations = 4 * POINTS.len() as u64;
    assert!(iterations >= 50);
    let stats = torture::multi::run(iterations, torture::seed_from_env_or(1));
    check(&stats, iterations);
}
