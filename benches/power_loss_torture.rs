//! The long power-loss torture (`scripts/power-loss-torture`): the flows of
//! `tests/power_loss/` cut at random sync points (or after the flow) with
//! random modes (`DropPending`, `TornPrefix`, `Reorder`), each cut checked,
//! settled, replayed and recounted by the records' bytes. 10,000 cuts
//! unless `ITERATIONS`; a seed from the clock unless `SEED`; every flow
//! unless `FLOWS` (names, comma separated). Prints cuts, flows,
//! acknowledged records, lost, changed (stored with other bytes than
//! sent) and duplicated, the problems a flow's known hole explains, and
//! the seed; exits 1 on any loss, change, duplicate or broken claim, 2
//! when powerfs cannot run here.
#[path = "../tests/power_loss/mod.rs"]
mod power_loss;

use std::time::Instant;

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`:
    // build it there, run the long torture only when asked.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if let Err(why) = powerfs::PowerFs::available() {
        eprintln!("power loss: powerfs cannot run here: {why}");
        std::process::exit(2);
    }
    let iterations = std::env::var("ITERATIONS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(10_000);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let seed = power_loss::seed_from_env_or(clock);
    // `FLOWS=a,b`: only these flows (default: every one).
    let only = std::env::var("FLOWS").unwrap_or_default();
    let only: Vec<&str> = only.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let flows: Vec<&power_loss::Flow> = power_loss::flows::ALL
        .iter()
        .filter(|f| only.is_empty() || only.contains(&f.name))
        .collect();
    if let Some(unknown) = only.iter().find(|n| !flows.iter().any(|f| f.name == **n)) {
        eprintln!("power loss: FLOWS names no flow {unknown:?}");
        std::process::exit(2);
    }
    println!(
        "power loss: seed {seed} (replay with SEED={seed}), {iterations} cuts over {}",
        flows.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
    );
    let started = Instant::now();
    let (total, per_flow) = power_loss::long_run(&flows, iterations, seed);
    for (name, t) in &per_flow {
        println!(
            "power loss: {name}: {} cuts {:?}, {} acknowledged, {} lost, {} changed, {} duplicated, {} problems, {} known",
            t.cuts,
            t.by_mode,
            t.acked,
            t.lost,
            t.changed,
            t.duplicated,
            t.problems.len(),
            t.known.len()
        );
    }
    for flow in &flows {
        if let (Some(hole), Some(t)) = (flow.known, per_flow.get(flow.name)) {
            println!(
                "power loss: {}: {} problems of a known hole: {}",
                flow.name,
                t.known.len(),
                hole.why
            );
        }
    }
    for p in total.problems.iter().take(50) {
        println!("power loss: problem: {p}");
    }
    println!(
        "power loss: cuts {}, flows {}, acknowledged records {}, lost {}, changed {}, duplicated {}, problems {}, seed {seed}, {:.0} s",
        total.cuts,
        per_flow.len(),
        total.acked,
        total.lost,
        total.changed,
        total.duplicated,
        total.problems.len(),
        started.elapsed().as_secs_f64()
    );
    if total.lost > 0 || total.changed > 0 || total.duplicated > 0 || !total.problems.is_empty() {
        std::process::exit(1);
    }
}
