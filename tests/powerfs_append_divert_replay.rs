//! turnsafe on a filesystem that forgets what was not fsynced (powerfs):
//! an append, a divert and a replay, with the power cut at every sync point
//! of the flow in turn (and once after it). After each cut and a remount,
//! every claim the flow made while the power was still on must hold:
//!
//! - every message of a batch reported `persisted` is in `state.db`;
//! - every receipt's byte range holds its lines with a matching sha256,
//!   at the receipt's path or where replay moved the file
//!   (`sessions/settling/`, `sessions/settled/`);
//! - every message replay reported `replayed` is in `state.db`.
//!
//! A claim made after the frozen sync point is not checked: in a real
//! power loss the process would not have lived to make it.
mod common;
use std::path::{Path, PathBuf};

use common::*;
use powerfs::{CutMode, PowerFs};
use turnsafe_host::backend::Backend;
use turnsafe_host::divert::Receipt;
use turnsafe_host::replay::{ReplayOptions, replay};
use turnsafe_host::store::{SessionStore, StoreOptions};

#[derive(Default, Debug)]
struct Claims {
    persisted: Vec<String>,
    receipts: Vec<Receipt>,
    replayed: Vec<String>,
}

/// The flow; records each claim only if the power was still on when it
/// was made (no sync point frozen yet).
fn flow(home: &Path, fs: &PowerFs) -> Claims {
    let mut claims = Claims::default();
    let on = |fs: &PowerFs| fs.frozen_at().is_none();
    let mut store = SessionStore::new(home, StoreOptions::default());
    let out = store.append_batch(&sid("s1"), &batch("one", 3));
    if out.persisted && on(fs) {
        claims.persisted.extend(out.uids.clone());
    }
    drop(store);
    // The store turns read-only: the next batch is diverted.
    let mut ro = SessionStore::new(
        home,
        StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        },
    );
    let out = ro.append_batch(&sid("s1"), &batch("two", 2));
    if let (Some(r), true) = (out.receipt.clone(), on(fs)) {
        claims.receipts.push(r);
    }
    drop(ro);
    let mut store = SessionStore::new(home, StoreOptions::default());
    let out = store.append_batch(&sid("s1"), &batch("three", 2));
    if out.persisted && on(fs) {
        claims.persisted.extend(out.uids.clone());
    }
    drop(store);
    if let Ok(reports) = replay(home, &ReplayOptions::default())
        && on(fs)
        && reports.iter().map(|r| r.replayed).sum::<u64>() == 2
    {
        claims.replayed.extend(["two-0".to_string(), "two-1".to_string()]);
    }
    claims
}

fn uids_in_db(home: &Path) -> Result<Vec<String>, String> {
    let c = rusqlite::Connection::open_with_flags(home.join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("open state.db: {e}"))?;
    let mut s = c
        .prepare("SELECT uid FROM messages WHERE session_id = 's1'")
        .map_err(|e| format!("read state.db: {e}"))?;
    s.query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect::<Result<Vec<String>, _>>())
        .map_err(|e| format!("read state.db: {e}"))
}

/// Does some file holding the receipt's file (its path, or where replay
/// moved it) have the receipt's range with its sha256 and line count?
fn receipt_holds(home: &Path, r: &Receipt) -> bool {
    let mut candidates = vec![PathBuf::from(&r.path)];
    for dir in ["sessions/settling", "sessions/settled"] {
        if let Ok(entries) = std::fs::read_dir(home.join(dir)) {
            candidates.extend(entries.flatten().map(|e| e.path()));
        }
    }
    candidates.iter().any(|p| {
        let mut moved = r.clone();
        moved.path = p.to_string_lossy().into_owned();
        turnsafe_host::divert::verify_receipt(&moved).unwrap_or(false)
    })
}

/// Every claim that does not hold after the cut, as one line each.
fn check(home: &Path, claims: &Claims) -> Vec<String> {
    let mut bad = Vec::new();
    let wanted: Vec<&String> = claims.persisted.iter().chain(&claims.replayed).collect();
    if !wanted.is_empty() {
        match uids_in_db(home) {
            Ok(uids) => {
                for uid in wanted {
                    if !uids.contains(uid) {
                        bad.push(format!("message {uid} was reported stored but is not in state.db"));
                    }
                }
            }
            Err(e) => bad.push(e),
        }
    }
    for r in &claims.receipts {
        if !receipt_holds(home, r) {
            bad.push(format!(
                "receipt {} [{}, +{}) does not hold its {} lines",
                r.path, r.offset, r.length, r.count
            ));
        }
    }
    bad
}

fn mount(dir: &Path) -> PowerFs {
    PowerFs::mount(dir.join("backing"), dir.join("mnt")).expect("mount powerfs")
}

#[test]
fn every_claim_survives_a_power_cut_at_every_sync_point() {
    turnsafe_tests::require!(PowerFs::available());
    // Once without a planned cut, to count the flow's sync points.
    let dir = tempfile::tempdir().unwrap();
    let mut fs = mount(dir.path());
    let home = fs.path().to_path_buf();
    let claims = flow(&home, &fs);
    assert_eq!(claims.persisted.len(), 5, "{claims:?}");
    assert_eq!(claims.receipts.len(), 1, "{claims:?}");
    assert_eq!(claims.replayed.len(), 2, "{claims:?}");
    let points = fs.sync_points();
    fs.cut(CutMode::DropPending).unwrap();
    fs.remount().unwrap();
    let mut failures: Vec<String> = check(&home, &claims)
        .into_iter()
        .map(|b| format!("cut after the flow: {b}"))
        .collect();
    drop(fs);
    eprintln!("the flow makes {} sync requests", points.len());

    for n in 1..=points.len() as u64 {
        for mode in [CutMode::DropPending, CutMode::TornPrefix { seed: n }] {
            let dir = tempfile::tempdir().unwrap();
            let mut fs = mount(dir.path());
            let home = fs.path().to_path_buf();
            fs.cut_at_sync(n);
            let claims = flow(&home, &fs);
            let at = fs
                .frozen_at()
                .map_or_else(|| format!("sync #{n} (not reached)"), |p| p.to_string());
            fs.cut(mode).unwrap();
            fs.remount().unwrap();
            for b in check(&home, &claims) {
                failures.push(format!("{mode:?}, power cut at {at}: {b}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "claims that did not survive a power cut:\n{}",
        failures.join("\n")
    );
}
