//! The long multi-writer crash torture (`scripts/multi-writer-torture`):
//! four writers at once on one home, two on one session, SIGKILL at every
//! crash point (`torture::multi`). 2,000 iterations unless
//! `TORTURE_ITERATIONS`; a seed from the clock unless `TORTURE_SEED`.
//! Fails (exit 101) on any lost or duplicated message, any other broken
//! invariant, or a crash point never reached.
#[path = "../tests/torture/mod.rs"]
mod torture;

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`:
    // build them there, but run the long torture only when asked.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let iterations = std::env::var("TORTURE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let stats = torture::multi::run(iterations, torture::seed_from_env());
    torture::multi::check(&stats, iterations);
}
