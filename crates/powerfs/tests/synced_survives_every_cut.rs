//! What was written, fsynced and had its folder fsynced survives every
//! kind of cut, for many seeds; what the torn and reordered modes keep of
//! the pending state is always one of the states they promise.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;

use powerfs::{CutMode, PowerFs};
use turnsafe_tests::require;

fn modes(seed: u64) -> [CutMode; 4] {
    [
        CutMode::DropPending,
        CutMode::KeepPending,
        CutMode::TornPrefix { seed },
        CutMode::Reorder { seed },
    ]
}

#[test]
fn synced_data_survives_every_mode_and_seed() {
    require!(PowerFs::available());
    let mut m = common::mount();
    let durable: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    for seed in 0..40u64 {
        for mode in modes(seed) {
            fs::create_dir_all(m.at("d")).unwrap();
            common::write_synced(&m.at("d/f"), &durable).unwrap();
            common::sync_dir(&m.at("d")).unwrap();
            common::sync_dir(m.path()).unwrap();
            // Pending noise on top: an overwrite, an append, a new file.
            let f = OpenOptions::new().write(true).open(m.at("d/f")).unwrap();
            f.write_all_at(&[0xEE; 1500], 100).unwrap();
            drop(f);
            fs::write(m.at("d/noise"), b"pending").unwrap();
            let report = m.cut(mode).unwrap();
            m.remount().unwrap();
            let got = fs::read(m.at("d/f")).unwrap();
            match mode {
                CutMode::KeepPending => {
                    let mut want = durable.clone();
                    want[100..1600].fill(0xEE);
                    assert_eq!(got, want, "{mode:?}");
                }
                CutMode::DropPending => assert_eq!(got, durable, "{mode:?}"),
                _ => {
                    // The durable bytes outside the pending range, and inside
                    // it a prefix of the write up to a sector boundary.
                    assert_eq!(got.len(), durable.len(), "{mode:?} {report:?}");
                    assert_eq!(got[..100], durable[..100]);
                    assert_eq!(got[1600..], durable[1600..]);
                    let kept = got[100..1600].iter().take_while(|&&b| b == 0xEE).count();
                    assert_eq!(got[100 + kept..1600], durable[100 + kept..1600], "{mode:?} {report:?}");
                    assert!(
                        kept == 0 || kept == 1500 || (100 + kept).is_multiple_of(512),
                        "{mode:?}: torn at {} (not a sector boundary)",
                        100 + kept
                    );
                }
            }
            // Start the next round from a clean tree.
            fs::remove_dir_all(m.at("d")).unwrap();
            common::sync_dir(m.path()).unwrap();
        }
    }
}

#[test]
fn torn_mode_tears_and_reorder_mode_reorders() {
    require!(PowerFs::available());
    let mut m = common::mount();
    let (mut torn, mut split) = (0, 0);
    for seed in 0..40u64 {
        for name in ["a", "b"] {
            common::write_synced(&m.at(name), b"").unwrap();
        }
        common::sync_dir(m.path()).unwrap();
        let mut a = OpenOptions::new().append(true).open(m.at("a")).unwrap();
        a.write_all(&[1u8; 4096]).unwrap();
        let mut b = OpenOptions::new().append(true).open(m.at("b")).unwrap();
        b.write_all(&[2u8; 4096]).unwrap();
        drop((a, b));
        let report = m.cut(CutMode::TornPrefix { seed }).unwrap();
        torn += report.torn_writes;
        m.remount().unwrap();
        for name in ["a", "b"] {
            let len = fs::metadata(m.at(name)).unwrap().len();
            assert!(
                len.is_multiple_of(512),
                "seed {seed}: {name} torn off a sector boundary: {len}"
            );
        }
        m.cut(CutMode::DropPending).unwrap();
        m.remount().unwrap();

        let mut a = OpenOptions::new().append(true).open(m.at("a")).unwrap();
        a.write_all(b"first").unwrap();
        let mut b = OpenOptions::new().append(true).open(m.at("b")).unwrap();
        b.write_all(b"second").unwrap();
        drop((a, b));
        m.cut(CutMode::Reorder { seed }).unwrap();
        m.remount().unwrap();
        let a_kept = fs::metadata(m.at("a")).unwrap().len() > 0;
        let b_kept = fs::metadata(m.at("b")).unwrap().len() > 0;
        // The later write survives while the earlier one is lost.
        split += usize::from(b_kept && !a_kept);
        for name in ["a", "b"] {
            fs::remove_file(m.at(name)).unwrap();
        }
        common::sync_dir(m.path()).unwrap();
    }
    assert!(torn > 0, "TornPrefix never tore a write in 40 seeds");
    assert!(split > 0, "Reorder never kept a later write without an earlier one");
}

#[test]
fn the_same_seed_gives_the_same_cut() {
    require!(PowerFs::available());
    let mut m = common::mount();
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let mut f = fs::File::create(m.at("f")).unwrap();
        for i in 0..20u8 {
            f.write_all(&[i; 700]).unwrap();
        }
        drop(f);
        common::sync_dir(m.path()).unwrap();
        m.cut(CutMode::TornPrefix { seed: 7 }).unwrap();
        m.remount().unwrap();
        outcomes.push(fs::read(m.at("f")).unwrap());
        fs::remove_file(m.at("f")).unwrap();
        common::sync_dir(m.path()).unwrap();
    }
    assert_eq!(outcomes[0], outcomes[1]);
}
