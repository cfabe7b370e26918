//! The power-loss torture in the test command: each flow of
//! `power_loss::flows` is cut at every one of its sync points with
//! `DropPending`, `TornPrefix` and `Reorder` (seeded), at a few random
//! points, and after the flow; every cut is checked, settled, replayed and
//! recounted by the bytes of every record sent (`power_loss/mod.rs` says
//! what is checked). Each test prints its flow's sync points, cuts,
//! acknowledged records, lost, changed, duplicated and seconds. About 750
//! cuts, under a minute on the 2-core CI machine.
//!
//! `POWER_LOSS_SEED` picks the cut seeds and the random points (default:
//! a fixed seed, so a failure replays), `POWER_LOSS_EVERY` which points
//! also get the torn and reordered cuts (default 1: every point; 3: every
//! third, at a seeded offset) and
//! `POWER_LOSS_RANDOM` how many random cuts per flow (default 4). The long
//! run with random points and modes is `scripts/power-loss-torture`.
mod power_loss;

use power_loss::{Flow, Plan, Prepared, every_point, flows, summary};
use powerfs::{CutMode, PowerFs, SyncKind};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn plan() -> Plan {
    Plan {
        seed: env("POWER_LOSS_SEED", 32),
        every: env("POWER_LOSS_EVERY", 1),
        random: env("POWER_LOSS_RANDOM", 4),
    }
}

/// One flow at a time: a mount forks its FUSE daemon, which holds the
/// descriptors it inherits (another test's open `state.db`) until it
/// closes them, and `doctor` and `recover --install` would see that
/// process as a holder of the other test's database.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn torture(flow: &Flow) {
    turnsafe_tests::require!(PowerFs::available());
    let _one = one_at_a_time();
    let (points, tally) = every_point(flow, plan());
    println!("{}", summary(flow.name, points, &tally));
    assert!(
        tally.problems.is_empty(),
        "{}: {} problem(s) after power cuts:\n{}",
        flow.name,
        tally.problems.len(),
        tally.problems.join("\n")
    );
    assert_eq!((tally.lost, tally.changed, tally.duplicated), (0, 0, 0));
    assert!(points > 0, "{}: the flow made no sync request", flow.name);
    if let Some(hole) = flow.known {
        // Cut at every sync point, the flow finds its hole every time: the
        // day it does not, the hole is closed and the flow is made strict.
        println!(
            "power loss: {}: {} problems of a known hole: {}; for example: {}",
            flow.name,
            tally.known.len(),
            hole.why,
            tally.known.first().map_or("none", String::as_str)
        );
        assert!(
            !tally.known.is_empty(),
            "{}: no cut found the known hole ({}): it is closed, drop `known` from the flow",
            flow.name,
            hole.why
        );
    }
}

#[test]
fn new_home() {
    torture(&flows::NEW_HOME);
}

#[test]
fn group_commit() {
    torture(&flows::GROUP_COMMIT);
}

#[test]
fn divert_into_a_new_file_in_a_new_folder() {
    torture(&flows::DIVERT_NEW_FILE);
}

#[test]
fn divert_appended_to_an_existing_file() {
    torture(&flows::DIVERT_EXISTING_FILE);
}

#[test]
fn replay() {
    torture(&flows::REPLAY);
}

#[test]
fn capture_of_a_deleted_wal() {
    torture(&flows::CAPTURE);
}

#[test]
fn recover_install() {
    torture(&flows::RECOVER_INSTALL);
}

#[test]
fn recover_dismiss() {
    torture(&flows::RECOVER_DISMISS);
}

#[test]
fn migrate_v2_to_v3() {
    torture(&flows::MIGRATE_V2_V3);
}

/// The cuts that found `recover --install` losing the old database's rows
/// from the path. The swap renamed the old file aside, then the new one
/// in, and a cut that kept a torn prefix of the home folder's changes kept
/// only the first rename: no `state.db` at all. Then, with the old file
/// linked aside and staying at the path, a prefix that kept its WAL's move
/// aside but not the new file left the old file without the frames a
/// killed writer had committed (the setup's `s2` rows). Cut at the
/// install's fsync of the home, the first sync of the home folder in the
/// flow, with a torn prefix drawn by each of 32 seeds.
#[test]
fn recover_install_never_leaves_the_path_without_a_database() {
    turnsafe_tests::require!(PowerFs::available());
    let _one = one_at_a_time();
    let (prepared, _) = Prepared::new(&flows::RECOVER_INSTALL).expect("the flow runs");
    let install = prepared
        .points
        .iter()
        .find(|p| p.kind == SyncKind::DirSync && p.path == std::path::Path::new("home"))
        .expect("the install fsyncs the home")
        .n;
    let mut problems = Vec::new();
    for seed in 0..32 {
        problems.extend(prepared.cut(Some(install), CutMode::TornPrefix { seed }).problems);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every flow has its test above.
#[test]
fn every_flow_is_tortured() {
    let names: Vec<&str> = flows::ALL.iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        [
            "new_home",
            "group_commit",
            "divert_new_file",
            "divert_existing_file",
            "replay",
            "capture",
            "recover_install",
            "recover_dismiss",
            "migrate_v2_v3",
            "langgraph",
            "clear"
        ]
    );
}

#[test]
fn langgraph_checkpoints() {
    torture(&flows::LANGGRAPH);
}

#[test]
fn clear_with_pending_message_and_graph_lines() {
    torture(&flows::CLEAR);
}
