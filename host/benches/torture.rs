//! The crash torture at scale: `cargo bench -p turnsafe-host --bench torture`
//! (10,000 iterations; `TORTURE_ITERATIONS`, `TORTURE_SEED` to change).
#[path = "../tests/torture/mod.rs"]
mod torture;

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`:
    // build them there, but only measure under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let iterations = std::env::var("TORTURE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let started = std::time::Instant::now();
    let stats = torture::run(iterations, torture::seed_from_env());
    println!("took {:.1} s", started.elapsed().as_secs_f64());
    for f in stats.failures.iter().take(20) {
        println!("FAILURE {f}");
    }
    if !stats.failures.is_empty() {
        std::process::exit(1);
    }
}
