//! History edits on a filesystem that forgets what was not fsynced
//! (powerfs): `pop`, `clear`, `restore`, `fork` and `prune` one after the
//! other, with the power cut at every sync point they make (each mode of
//! cut), and once after them.
//!
//! The edits run in order, so after a cut each session must be exactly as
//! the last edit acknowledged before the cut left it, or as the edit in
//! flight at the cut leaves it (its COMMIT may have reached the disk
//! before its caller heard back), and never anything in between: no edit
//! half applied, nothing an acknowledged edit did undone, no row lost or
//! doubled between the transcript and the archive. `PRAGMA
//! integrity_check` must say `ok`. The states to compare with come from a
//! run without a cut; times, edit ids and lease holders are left out.
mod common;
use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use powerfs::{CutMode, PowerFs};
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::history::{Keep, PruneOptions, Reason, Selector};
use turnsafe_host::store::{SessionStore, StoreOptions};

/// A session as a reader sees it: its rows, its archive, its lineage.
type SessionState = (
    Vec<(String, i64, String)>,
    Vec<(String, i64, String, String)>,
    Option<(Option<String>, Option<i64>)>,
);
type HomeState = BTreeMap<String, SessionState>;

fn state(home: &Path) -> Result<HomeState, String> {
    let c = rusqlite::Connection::open_with_flags(home.join("state.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("open state.db: {e}"))?;
    let read = |e: rusqlite::Error| format!("read state.db: {e}");
    let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).map_err(read)?;
    if ok != "ok" {
        return Err(format!("integrity_check: {ok}"));
    }
    let mut out = HomeState::new();
    let mut s = c
        .prepare("SELECT id, forked_from, forked_at_seq FROM sessions")
        .map_err(read)?;
    let rows = s
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)))
        .map_err(read)?;
    for r in rows {
        let (id, from, at) = r.map_err(read)?;
        out.entry(id).or_default().2 = Some((from, at));
    }
    let mut s = c
        .prepare("SELECT session_id, uid, seq, item FROM messages ORDER BY session_id, seq, id")
        .map_err(read)?;
    let rows = s
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .map_err(read)?;
    for r in rows {
        let (session, uid, seq, item) = r.map_err(read)?;
        out.entry(session).or_default().0.push((uid, seq, item));
    }
    let mut s = c
        .prepare("SELECT session_id, uid, seq, item, reason FROM archive ORDER BY session_id, seq, uid, id")
        .map_err(read)?;
    let rows = s
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .map_err(read)?;
    for r in rows {
        let (session, uid, seq, item, reason) = r.map_err(read)?;
        out.entry(session).or_default().1.push((uid, seq, item, reason));
    }
    Ok(out)
}

/// The home every run starts from: `s1` with 6 rows, `s2` with 4.
fn setup(home: &Path) {
    let mut store = SessionStore::create(home, StoreOptions::default()).expect("create the home");
    assert!(store.append_batch(&sid("s1"), &batch("a", 6)).persisted);
    assert!(store.append_batch(&sid("s2"), &batch("b", 4)).persisted);
}

/// The edits, in order; each returns whether it succeeded.
const EDITS: usize = 6;

fn edit(store: &mut SessionStore, k: usize) -> bool {
    match k {
        0 => store.pop_last(&sid("s1")).is_ok_and(|p| p.is_some()),
        1 => store.pop_last(&sid("s1")).is_ok_and(|p| p.is_some()),
        2 => store.clear_archiving(&sid("s2"), &[]).is_ok(),
        3 => store
            .restore(
                &sid("s1"),
                &Selector::Reason {
                    reason: Reason::Pop,
                    since_ms: None,
                },
            )
            .is_ok_and(|r| r.restored.len() == 2),
        4 => store
            .fork(&sid("s1"), 3, &sid("s3"))
            .is_ok_and(|r| r.is_ok_and(|f| f.copied == 3)),
        _ => store
            .prune(&PruneOptions {
                keep: Keep::Last(2),
                archived_only: false,
                session: None,
                dry_run: false,
            })
            .is_ok_and(|r| r.skipped.is_empty()),
    }
}

/// Run the edits; return how many were acknowledged while the power was on.
fn run(home: &Path, fs: Option<&PowerFs>, states: Option<&mut Vec<HomeState>>) -> usize {
    let on = || fs.is_none_or(|fs| fs.frozen_at().is_none());
    let mut store = SessionStore::new(home, StoreOptions::default());
    let mut acked = 0;
    let mut states = states;
    for k in 0..EDITS {
        let done = edit(&mut store, k);
        if let Some(states) = states.as_deref_mut() {
            assert!(done, "edit {k} succeeds without a cut");
            states.push(state(home).expect("a readable home"));
        }
        if done && on() {
            acked = k + 1;
        }
    }
    acked
}

fn mount(dir: &Path) -> PowerFs {
    PowerFs::mount(dir.join("backing"), dir.join("mnt")).expect("mount powerfs")
}

#[test]
fn no_edit_is_half_applied_or_undone_by_a_power_cut() {
    turnsafe_tests::require!(PowerFs::available());
    // Without a planned cut: the state after each edit, and the sync
    // points of the setup and of the edits.
    let dir = tempfile::tempdir().unwrap();
    let mut fs = mount(dir.path());
    let home = fs.path().join("home");
    setup(&home);
    let setup_syncs = fs.sync_points().len() as u64;
    let mut states = vec![state(&home).expect("the setup's home")];
    assert_eq!(run(&home, Some(&fs), Some(&mut states)), EDITS);
    let total = fs.sync_points().len() as u64;
    fs.cut(CutMode::DropPending).unwrap();
    fs.remount().unwrap();
    let mut failures = Vec::new();
    match state(&home) {
        Ok(s) if s == states[EDITS] => {}
        Ok(s) => failures.push(format!("cut after every edit: {s:?}")),
        Err(e) => failures.push(format!("cut after every edit: {e}")),
    }
    drop(fs);
    assert!(
        total > setup_syncs + EDITS as u64,
        "each edit syncs: {setup_syncs} then {total}"
    );
    eprintln!("the edits make {} sync requests", total - setup_syncs);

    for n in setup_syncs + 1..=total {
        for mode in [CutMode::DropPending, CutMode::TornPrefix { seed: n }] {
            let dir = tempfile::tempdir().unwrap();
            let mut fs = mount(dir.path());
            let home = fs.path().join("home");
            setup(&home);
            fs.cut_at_sync(n);
            let acked = run(&home, Some(&fs), None);
            let at = fs
                .frozen_at()
                .map_or_else(|| format!("sync #{n} (not reached)"), |p| p.to_string());
            fs.cut(mode).unwrap();
            fs.remount().unwrap();
            let got = match state(&home) {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("{mode:?} at {at}: {e}"));
                    continue;
                }
            };
            // Each session as the last acknowledged edit left it, or as
            // the one in flight did.
            let allowed = [&states[acked], &states[(acked + 1).min(EDITS)]];
            let names: std::collections::BTreeSet<&String> =
                got.keys().chain(allowed[0].keys()).chain(allowed[1].keys()).collect();
            for name in names {
                let g = got.get(name);
                if !allowed.iter().any(|s| s.get(name) == g) {
                    failures.push(format!(
                        "{mode:?} at {at}, {acked} edit(s) acknowledged: session {name} is {g:?}, \
                         not {:?} nor {:?}",
                        allowed[0].get(name),
                        allowed[1].get(name)
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "edits a power cut broke:\n{}", failures.join("\n"));
}
