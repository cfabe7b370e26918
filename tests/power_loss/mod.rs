//! The power-loss torture: each flow of turnsafe that makes a claim (an
//! append into a new home, the many-session group commit, a divert into a
//! new file and into an existing one, replay, the capture of a deleted WAL,
//! `recover --install` and `--dismiss`, the v2→v3 migration) runs on
//! powerfs, the filesystem that forgets what was not fsynced, and the power
//! is cut at each of its sync points in turn, with each mode of cut, and at
//! random points. Shared by `tests/power_loss_torture.rs` (every sync point
//! of every flow, in the test command) and the long run
//! (`benches/power_loss_torture.rs`, `scripts/power-loss-torture`).
//!
//! A flow starts from a home built off the mount (its *setup*, durable from
//! the start, with the claims made while building it) and records each
//! claim it makes only while the power is still on (no sync point frozen
//! yet: in a real power loss the process would not have lived to make a
//! later one). After the cut and a remount, our own readers (a read-only
//! rusqlite connection, the divert files' bytes, the capture folders'
//! manifests), never `turnsafe show`, check:
//!
//! - every message claimed in `state.db` (an outcome said `persisted`,
//!   replay or an install returned) is there exactly once; a persisted
//!   message of a generation retired under its writer (its WAL deleted) is
//!   in `state.db` or in a capture folder;
//! - every receipt's byte range holds exactly its lines, with its sha256,
//!   at its path or where replay moved the file;
//! - every capture receipt's folder holds its manifest (sha256) and files;
//!   every capture claimed settled has its `SETTLED`; every file replay
//!   settled is in `settled/` with its ledger lines;
//! - `PRAGMA integrity_check` is ok;
//! - `doctor` finds nothing wrong, or only captures left to settle.
//!
//! Then, as an operator would, every pending capture is settled (installed
//! with `recover --install` when it has its manifest, dismissed otherwise)
//! and `replay` runs: every acknowledged message (persisted, receipted, or
//! in the setup) must be stored exactly once, nothing at all twice,
//! `integrity_check` ok and `doctor` clean.
#![allow(dead_code)]

pub mod flows;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use powerfs::{CutMode, PowerFs, SyncPoint};
use serde_json::Value;
use sha2::Digest;
use turnsafe_host::capture::Capture;
use turnsafe_host::divert::Receipt;
use turnsafe_host::message::Message;
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::replay::{FileReport, ReplayOptions};
use turnsafe_host::store::SessionId;

/// A stored message: (session, uid).
pub type Key = (String, String);

/// Whether the power is still on: no sync point frozen yet.
pub struct Power<'a>(Option<&'a PowerFs>);

impl Power<'_> {
    /// Always on: the setup, off the mount.
    pub fn always() -> Power<'static> {
        Power(None)
    }
    pub fn on(&self) -> bool {
        self.0.is_none_or(|fs| fs.frozen_at().is_none())
    }
}

/// What a flow claimed while the power was on (and what its setup had
/// claimed before it started).
#[derive(Debug, Clone, Default)]
pub struct Claims {
    /// Every acknowledged message: persisted, in a receipt, or in the
    /// setup's database. Once settled and replayed, each is stored exactly
    /// once.
    pub acked: BTreeSet<Key>,
    /// Claimed in `state.db` now.
    pub in_db: BTreeSet<Key>,
    /// Persisted to a generation that was retired under its writer (its
    /// sidecars deleted by someone else), and captured with a receipt: in
    /// `state.db` or in a capture folder.
    pub retired: BTreeSet<Key>,
    /// Persisted to a generation retired under its writer, before any
    /// capture of it was claimed. The deletion was someone else's: a
    /// filesystem may make it durable on its own at any moment, so a torn
    /// or reordered cut may take these. Under `DropPending` (only what was
    /// synced survives) they must survive all the same: turnsafe's own
    /// syncs never make the deletion durable before the capture is.
    pub at_risk: BTreeSet<Key>,
    pub receipts: Vec<(Receipt, Vec<Key>)>,
    pub captures: Vec<Capture>,
    /// Capture folders claimed settled (`SETTLED` written).
    pub settled: Vec<PathBuf>,
    /// Files replay settled: the file's name in `settled/`, its lines.
    pub ledger: Vec<(String, u64)>,
}

impl Claims {
    /// An append's outcome, if the power is still on: a persisted batch is
    /// acknowledged and in `state.db`; a diverted one is acknowledged by
    /// its receipt; a capture receipt is a claim of its own.
    pub fn outcome(&mut self, session: &SessionId, out: &FlushOutcome, power: &Power<'_>) {
        if !power.on() {
            return;
        }
        let keys: Vec<Key> = out
            .uids
            .iter()
            .map(|u| (session.as_str().to_string(), u.clone()))
            .collect();
        if out.persisted {
            self.acked.extend(keys.iter().cloned());
            self.in_db.extend(keys.iter().cloned());
        }
        if let Some(r) = &out.receipt {
            assert_eq!(
                r.count as usize,
                keys.len(),
                "a receipt covers the whole batch: {out:?}"
            );
            self.acked.extend(keys.iter().cloned());
            self.receipts.push((r.clone(), keys));
        }
        if let Some(Ok(c)) = &out.capture {
            self.captures.push(c.clone());
            let captured = std::mem::take(&mut self.at_risk);
            self.acked.extend(captured.iter().cloned());
            self.retired.extend(captured);
        }
    }

    /// The sidecars of the generation these messages were committed to
    /// were deleted under the writer (by someone else): at risk until a
    /// capture receipt holds them.
    pub fn retire(&mut self, keys: &[Key]) {
        for k in keys {
            if self.in_db.remove(k) {
                self.acked.remove(k);
                self.at_risk.insert(k.clone());
            }
        }
    }

    /// What must be in `state.db` or a capture after a cut with `mode`.
    fn retired_after(&self, mode: CutMode) -> BTreeSet<Key> {
        let mut keys = self.retired.clone();
        if mode == CutMode::DropPending {
            keys.extend(self.at_risk.iter().cloned());
        }
        keys
    }

    /// What must be stored exactly once, settled and replayed, after a cut
    /// with `mode`.
    fn acked_after(&self, mode: CutMode) -> BTreeSet<Key> {
        let mut keys = self.acked.clone();
        if mode == CutMode::DropPending {
            keys.extend(self.at_risk.iter().cloned());
        }
        keys
    }

    /// A replay of every pending file returned: every receipted message is
    /// in `state.db`, and every file it settled is in `settled/` with its
    /// ledger lines.
    pub fn replayed(&mut self, files: &[FileReport], power: &Power<'_>) {
        if !power.on() {
            return;
        }
        for (_, keys) in &self.receipts {
            self.in_db.extend(keys.iter().cloned());
        }
        for f in files {
            self.ledger.push((f.file.clone(), f.lines));
        }
    }

    /// An install returned: what the capture held and what `state.db` held
    /// are both in the new `state.db`.
    pub fn installed(&mut self, power: &Power<'_>) {
        if !power.on() {
            return;
        }
        let retired = std::mem::take(&mut self.retired);
        self.in_db.extend(retired);
    }

    pub fn settled(&mut self, capture: &Path, power: &Power<'_>) {
        if power.on() {
            self.settled.push(capture.to_path_buf());
        }
    }

    /// The same claims with every path under `from` moved under `to` (the
    /// setup is built in a plain folder, then copied under the mount).
    fn rebase(&self, from: &Path, to: &Path) -> Claims {
        let moved = |p: &str| match Path::new(p).strip_prefix(from) {
            Ok(rest) => to.join(rest).to_string_lossy().into_owned(),
            Err(_) => p.to_string(),
        };
        let mut c = self.clone();
        for (r, _) in &mut c.receipts {
            r.path = moved(&r.path);
        }
        for cap in &mut c.captures {
            cap.path = moved(&cap.path);
        }
        for s in &mut c.settled {
            *s = PathBuf::from(moved(&s.to_string_lossy()));
        }
        c
    }
}

/// `n` messages of about 200 bytes with uids `<tag>-<i>`.
pub fn batch(tag: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            Message::new(role, &format!("{tag} message {i}: {}", "lorem ipsum ".repeat(16)))
                .with_uid(&format!("{tag}-{i}"))
        })
        .collect()
}

pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).expect("valid session id")
}

/// splitmix64: one seed replays a run.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// One of the three modes that lose something, with a fresh seed.
    pub fn mode(&mut self) -> CutMode {
        let seed = self.next();
        match self.below(3) {
            0 => CutMode::DropPending,
            1 => CutMode::TornPrefix { seed },
            _ => CutMode::Reorder { seed },
        }
    }
}

/// `SEED`, or `default`.
pub fn seed_from_env_or(default: u64) -> u64 {
    std::env::var("SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

/// A flow of turnsafe, run under the mount.
pub struct Flow {
    pub name: &'static str,
    /// Builds the home the flow starts from under `root` (a plain folder,
    /// copied into each cut's backing folder, so all of it is durable) and
    /// returns the claims made building it.
    pub setup: fn(&Path) -> Claims,
    /// Runs the flow under `root` (the mount), adding to `claims` (the
    /// setup's) each claim made while the power is on.
    pub run: fn(&Path, &Power<'_>, &mut Claims),
    /// The claims a run without a cut must make: (acknowledged, in_db).
    pub expect: fn(&Claims) -> Result<(), String>,
}

/// The home under a root: a folder of its own, so a new home's entry in
/// its parent is part of what a flow must make durable.
pub fn home(root: &Path) -> PathBuf {
    root.join("home")
}

/// One cut's result.
#[derive(Debug, Default)]
pub struct Cut {
    pub frozen: Option<String>,
    pub acked: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub problems: Vec<String>,
}

/// A flow ready to be cut: its setup built once, its sync points counted.
pub struct Prepared<'a> {
    pub flow: &'a Flow,
    template: tempfile::TempDir,
    base: Claims,
    /// The sync requests of a run without a cut.
    pub points: Vec<SyncPoint>,
}

impl<'a> Prepared<'a> {
    /// Builds the setup and runs the flow once without a planned cut, to
    /// count its sync points and check it makes the claims it should. The
    /// power is then cut after the flow (`DropPending`), and that cut is
    /// checked as well.
    pub fn new(flow: &'a Flow) -> Result<(Prepared<'a>, Cut), String> {
        let template = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let base = (flow.setup)(template.path());
        let prepared = Prepared {
            flow,
            template,
            base,
            points: Vec::new(),
        };
        let (cut, points, claims) = prepared.cut_with(None, CutMode::DropPending);
        (flow.expect)(&claims).map_err(|e| format!("{}: a run without a cut: {e}: {claims:?}", flow.name))?;
        Ok((Prepared { points, ..prepared }, cut))
    }

    pub fn sync_points(&self) -> u64 {
        self.points.len() as u64
    }

    /// Mount a fresh copy of the setup, plan the cut at sync point `at`
    /// (none: after the flow), run the flow, cut with `mode`, remount,
    /// check, settle, replay, recount.
    pub fn cut(&self, at: Option<u64>, mode: CutMode) -> Cut {
        self.cut_with(at, mode).0
    }

    fn cut_with(&self, at: Option<u64>, mode: CutMode) -> (Cut, Vec<SyncPoint>, Claims) {
        let dir = tempfile::tempdir().expect("tempdir");
        let backing = dir.path().join("backing");
        copy_tree(self.template.path(), &backing).expect("copy the setup into the backing folder");
        let mut fs = PowerFs::mount(&backing, dir.path().join("mnt")).expect("mount powerfs");
        let root = fs.path().to_path_buf();
        let mut claims = self.base.rebase(self.template.path(), &root);
        if let Some(n) = at {
            fs.cut_at_sync(n);
        }
        (self.flow.run)(&root, &Power(Some(&fs)), &mut claims);
        let frozen = fs.frozen_at();
        let points = fs.sync_points();
        let what = match (&frozen, at) {
            (Some(p), _) => format!("{mode:?} at {p}"),
            (None, Some(n)) => format!("{mode:?} at sync #{n} (not reached: after the flow)"),
            (None, None) => format!("{mode:?} after the flow"),
        };
        fs.cut(mode).expect("cut");
        fs.remount().expect("remount");
        let mut cut = Cut {
            frozen: frozen.map(|p| p.to_string()),
            ..Cut::default()
        };
        let home = home(&root);
        for p in check(&home, &claims, mode) {
            cut.problems
                .push(format!("{}: {what}: after the cut: {p}", self.flow.name));
        }
        let settled = settle(&root, &home);
        if let Err(p) = &settled {
            cut.problems.push(format!("{}: {what}: settling: {p}", self.flow.name));
        }
        let (acked, lost, duplicated, problems) = recount(&home, &claims, mode);
        cut.acked = acked;
        cut.lost = lost;
        cut.duplicated = duplicated;
        for p in problems {
            cut.problems
                .push(format!("{}: {what}: once settled and replayed: {p}", self.flow.name));
        }
        drop(fs);
        (cut, points, claims)
    }
}

/// Copy a folder tree (regular files and folders, with their modes).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// How many times each (session, uid) is in the database at `db`, read
/// with our own read-only connection. No file, or no schema yet: none.
pub fn stored(db: &Path) -> Result<BTreeMap<Key, u64>, String> {
    if !db.is_file() {
        return Ok(BTreeMap::new());
    }
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("open {} read-only: {e}", db.display()))?;
    c.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let has_table: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'messages'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| format!("read {}: {e}", db.display()))?;
    if has_table == 0 {
        return Ok(BTreeMap::new());
    }
    let mut s = c
        .prepare("SELECT session_id, uid, count(*) FROM messages GROUP BY session_id, uid")
        .map_err(|e| format!("read {}: {e}", db.display()))?;
    let rows = s
        .query_map([], |r| {
            Ok(((r.get::<_, String>(0)?, r.get::<_, String>(1)?), r.get::<_, i64>(2)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("read {}: {e}", db.display()))?;
    let mut counts: BTreeMap<Key, u64> = rows.into_iter().map(|(k, n)| (k, n as u64)).collect();
    // LangGraph's records, keyed as the flush machine keys them: the
    // thread's safe id and the record's uid (unique by their tables' keys).
    let has_graph: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| format!("read {}: {e}", db.display()))?;
    if has_graph > 0 {
        let mut q = c
            .prepare(
                "SELECT thread_id, 'checkpoint:' || checkpoint_ns || ':' || checkpoint_id FROM checkpoints
                 UNION ALL
                 SELECT thread_id, 'write:' || checkpoint_ns || ':' || checkpoint_id || ':' || task_id || ':' || idx
                   FROM checkpoint_writes",
            )
            .map_err(|e| format!("read {}: {e}", db.display()))?;
        let graph = q
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("read {}: {e}", db.display()))?;
        for (thread, uid) in graph {
            *counts
                .entry((turnsafe_host::graph::thread_session(&thread), uid))
                .or_default() += 1;
        }
    }
    Ok(counts)
}

/// `PRAGMA integrity_check` on the database at `db` (none: ok).
pub fn integrity(db: &Path) -> Result<(), String> {
    if !db.is_file() {
        return Ok(());
    }
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("open {} read-only: {e}", db.display()))?;
    let mut s = c.prepare("PRAGMA integrity_check").map_err(|e| e.to_string())?;
    let rows: Vec<String> = s
        .query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| format!("integrity_check: {e}"))?;
    if rows == ["ok"] {
        Ok(())
    } else {
        Err(format!("integrity_check: {}", rows.join("; ")))
    }
}

/// Does the receipt's file (at its path, or where replay moved it) hold
/// the receipt's range with its sha256 and line count?
pub fn receipt_holds(home: &Path, r: &Receipt) -> bool {
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

/// Whether a capture receipt's folder holds its manifest (with the
/// receipt's sha256) and every file the manifest names, whole.
pub fn capture_holds(c: &Capture) -> Result<(), String> {
    let dir = Path::new(&c.path);
    let text = std::fs::read(dir.join("manifest.json")).map_err(|e| format!("{}/manifest.json: {e}", c.path))?;
    if hex::encode(sha2::Sha256::digest(&text)) != c.manifest_sha256 {
        return Err(format!("{}/manifest.json does not match its receipt's sha256", c.path));
    }
    let manifest: Value = serde_json::from_slice(&text).map_err(|e| format!("{}/manifest.json: {e}", c.path))?;
    for f in manifest["files"].as_array().into_iter().flatten() {
        let name = f["name"].as_str().unwrap_or_default();
        let data = std::fs::read(dir.join(name)).map_err(|e| format!("{}/{name}: {e}", c.path))?;
        if Some(data.len() as u64) != f["size"].as_u64()
            || Some(hex::encode(sha2::Sha256::digest(&data)).as_str()) != f["sha256"].as_str()
        {
            return Err(format!("{}/{name} is not the file its manifest names", c.path));
        }
    }
    for f in &c.files {
        let size = std::fs::metadata(dir.join(&f.name)).map(|m| m.len()).ok();
        if size != Some(f.size) {
            return Err(format!(
                "{}/{}: size {size:?}, the receipt says {}",
                c.path, f.name, f.size
            ));
        }
    }
    Ok(())
}

/// The messages every capture folder under `home` holds (read from a copy).
fn held_by_captures(home: &Path) -> BTreeSet<Key> {
    let mut held = BTreeSet::new();
    for c in turnsafe_host::captures::list(home).unwrap_or_default() {
        let Ok(work) = tempfile::tempdir() else { continue };
        if turnsafe_host::recover::copy_source(&c.path, work.path()).is_ok()
            && let Ok(rows) = stored(&work.path().join("state.db"))
        {
            held.extend(rows.into_keys());
        }
    }
    held
}

/// `turnsafe doctor`'s report (what `doctor --json` prints): its error
/// findings other than captures left to settle.
fn doctor_errors(home: &Path, allow_pending_captures: bool) -> Vec<String> {
    let report = turnsafe_host::doctor::report(home);
    if report["ok"] == true {
        return Vec::new();
    }
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] == "error")
        .filter(|f| {
            !(allow_pending_captures && f["kind"] == "captures" && f["message"].to_string().contains("not settled"))
        })
        .map(|f| format!("doctor: [{}] {}", f["kind"], f["message"]))
        .collect()
}

/// A cut during the first open's schema creation (before the switch to
/// WAL) can leave a hot rollback journal, which a read-only connection
/// cannot roll back ("attempt to write a readonly database"). Roll it back
/// as the next writer's open would, before reading.
fn roll_back_hot_journal(db: &Path) -> Result<(), String> {
    let journal = db.with_file_name("state.db-journal");
    if std::fs::metadata(&journal).map_or(true, |m| m.len() == 0) {
        return Ok(());
    }
    let c =
        rusqlite::Connection::open(db).map_err(|e| format!("open {} to roll back its journal: {e}", db.display()))?;
    c.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))
        .map(drop)
        .map_err(|e| format!("roll back {}: {e}", journal.display()))
}

/// Every claim that does not hold right after the cut and remount.
pub fn check(home: &Path, claims: &Claims, mode: CutMode) -> Vec<String> {
    let mut bad = Vec::new();
    let db = home.join("state.db");
    if let Err(e) = roll_back_hot_journal(&db) {
        bad.push(e);
    }
    if let Err(e) = integrity(&db) {
        bad.push(e);
    }
    match stored(&db) {
        Ok(counts) => {
            for k in &claims.in_db {
                match counts.get(k).copied().unwrap_or(0) {
                    1 => {}
                    0 => bad.push(format!("{k:?} was claimed in state.db and is not there")),
                    n => bad.push(format!("{k:?} is in state.db {n} times")),
                }
            }
            let retired = claims.retired_after(mode);
            let missing: Vec<&Key> = retired.iter().filter(|k| !counts.contains_key(*k)).collect();
            if !missing.is_empty() {
                let held = held_by_captures(home);
                for k in missing.into_iter().filter(|k| !held.contains(*k)) {
                    bad.push(format!(
                        "{k:?} was persisted, and is neither in state.db nor in a capture"
                    ));
                }
            }
        }
        Err(e) => bad.push(e),
    }
    for (r, _) in &claims.receipts {
        if !receipt_holds(home, r) {
            bad.push(format!(
                "receipt {} [{}, +{}) does not hold its {} lines",
                r.path, r.offset, r.length, r.count
            ));
        }
    }
    for c in &claims.captures {
        if let Err(e) = capture_holds(c) {
            bad.push(format!("capture receipt: {e}"));
        }
    }
    for s in &claims.settled {
        if !turnsafe_host::captures::status(s).is_settled() {
            bad.push(format!("{} was claimed settled and has no SETTLED marker", s.display()));
        }
    }
    if !claims.ledger.is_empty() {
        let ledger = std::fs::read_to_string(home.join("sessions/ledger.jsonl")).unwrap_or_default();
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        for l in ledger.lines() {
            if let Ok(v) = serde_json::from_str::<Value>(l)
                && let Some(f) = v["file"].as_str()
            {
                *lines.entry(f.to_string()).or_default() += 1;
            }
        }
        for (file, n) in &claims.ledger {
            let have = lines.get(file).copied().unwrap_or(0);
            if have < *n {
                bad.push(format!(
                    "the ledger has {have} of the {n} lines replay settled from {file}"
                ));
            }
            if !home.join("sessions/settled").join(file).is_file() {
                bad.push(format!("{file} was settled and is not in sessions/settled/"));
            }
        }
    }
    if home.is_dir() {
        bad.extend(doctor_errors(home, true));
    }
    bad
}

/// What an operator does after the power comes back: settle every pending
/// capture (install a database rebuilt from it when it has its manifest,
/// as `recover --install`; dismiss it otherwise: it holds nothing whole),
/// then `replay` (forced past the turn leases the dead writers left; no
/// capture is pending by then).
pub fn settle(root: &Path, home: &Path) -> Result<(), String> {
    if !home.is_dir() {
        return Ok(());
    }
    let pending = turnsafe_host::captures::pending(home).map_err(|e| format!("list captures: {e}"))?;
    for (i, c) in pending.iter().enumerate() {
        if c.manifest().is_ok() && c.path.join("state.db").is_file() {
            let installed = rebuild_and_install(&c.path, home, &root.join(format!("settle-{i}.db")))?;
            turnsafe_host::recover::settle_installed(&c.path, &installed).map_err(|e| format!("settle: {e}"))?;
        } else {
            turnsafe_host::recover::dismiss(&c.path, home).map_err(|e| format!("dismiss {}: {e}", c.name))?;
        }
    }
    let left = turnsafe_host::captures::pending(home).map_err(|e| format!("list captures: {e}"))?;
    if !left.is_empty() {
        return Err(format!(
            "captures still pending: {:?}",
            left.iter().map(|c| &c.name).collect::<Vec<_>>()
        ));
    }
    turnsafe_host::replay::replay(
        home,
        &ReplayOptions {
            force: true,
            ..ReplayOptions::default()
        },
    )
    .map_err(|e| format!("replay: {e}"))?;
    Ok(())
}

/// `turnsafe recover --source CAPTURE --output OUTPUT --install --home
/// HOME` up to the install, step by step as the command runs them: copy
/// the capture into a work folder (off the mount, as the command's
/// temporary folder), rebuild into `output`, write the report, install.
/// The command then settles the capture (`recover::settle_installed`).
pub fn rebuild_and_install(
    capture: &Path,
    home: &Path,
    output: &Path,
) -> Result<turnsafe_host::recover::Installed, String> {
    use turnsafe_host::recover;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    recover::copy_source(capture, work.path()).map_err(|e| format!("copy {}: {e}", capture.display()))?;
    let src = work.path().join("state.db");
    let inspected = recover::inspect(&src).map_err(|e| format!("inspect: {e}"))?;
    let rebuilt = recover::rebuild(&src, output).map_err(|e| format!("rebuild: {e}"))?;
    let report = serde_json::json!({ "readable": inspected, "recovered": rebuilt });
    let mut report_path = output.as_os_str().to_owned();
    report_path.push(".report.json");
    turnsafe_host::durable::write_file(Path::new(&report_path), report.to_string().as_bytes())
        .map_err(|e| format!("write the report: {e}"))?;
    recover::install(output, home).map_err(|e| format!("install: {e}"))
}

/// After settling and replaying: every acknowledged message stored exactly
/// once, nothing stored twice, integrity ok, doctor clean. Returns
/// (acknowledged, lost, duplicated, problems).
pub fn recount(home: &Path, claims: &Claims, mode: CutMode) -> (u64, u64, u64, Vec<String>) {
    let acked = claims.acked_after(mode);
    let mut bad = Vec::new();
    let db = home.join("state.db");
    let (mut lost, mut duplicated) = (0, 0);
    if let Err(e) = integrity(&db) {
        bad.push(e);
    }
    match stored(&db) {
        Ok(counts) => {
            for k in &acked {
                match counts.get(k).copied().unwrap_or(0) {
                    1 => {}
                    0 => {
                        lost += 1;
                        bad.push(format!("acknowledged {k:?} is lost"));
                    }
                    n => {
                        duplicated += 1;
                        bad.push(format!("acknowledged {k:?} is stored {n} times"));
                    }
                }
            }
            for (k, n) in &counts {
                if *n > 1 && !acked.contains(k) {
                    duplicated += 1;
                    bad.push(format!("{k:?} is stored {n} times"));
                }
            }
        }
        Err(e) => {
            lost += acked.len() as u64;
            bad.push(e);
        }
    }
    if home.is_dir() {
        bad.extend(doctor_errors(home, false));
    }
    (acked.len() as u64, lost, duplicated, bad)
}

/// What a series of cuts of one flow added up to.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub cuts: u64,
    pub by_mode: BTreeMap<&'static str, u64>,
    pub acked: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub problems: Vec<String>,
    pub seconds: f64,
}

impl Tally {
    pub fn add(&mut self, mode: CutMode, cut: Cut) {
        self.cuts += 1;
        *self.by_mode.entry(mode_name(mode)).or_default() += 1;
        self.acked += cut.acked;
        self.lost += cut.lost;
        self.duplicated += cut.duplicated;
        self.problems.extend(cut.problems);
    }
    pub fn merge(&mut self, other: &Tally) {
        self.cuts += other.cuts;
        for (m, n) in &other.by_mode {
            *self.by_mode.entry(m).or_default() += n;
        }
        self.acked += other.acked;
        self.lost += other.lost;
        self.duplicated += other.duplicated;
        self.problems.extend(other.problems.iter().cloned());
        self.seconds += other.seconds;
    }
}

pub fn mode_name(mode: CutMode) -> &'static str {
    match mode {
        CutMode::DropPending => "DropPending",
        CutMode::KeepPending => "KeepPending",
        CutMode::TornPrefix { .. } => "TornPrefix",
        CutMode::Reorder { .. } => "Reorder",
    }
}

/// How the test command cuts one flow: `DropPending` at every sync point,
/// `TornPrefix` and `Reorder` at every `every`-th point (a seeded offset,
/// so across seeds every point meets every mode), and `random` more cuts
/// at random points with random modes; then each mode once after the flow.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub seed: u64,
    pub every: u64,
    pub random: u64,
}

/// Cut `flow` at every one of its sync points by `plan`.
pub fn every_point(flow: &Flow, plan: Plan) -> (u64, Tally) {
    let started = Instant::now();
    let mut tally = Tally::default();
    let (prepared, first) = match Prepared::new(flow) {
        Ok(p) => p,
        Err(e) => {
            tally.problems.push(e);
            return (0, tally);
        }
    };
    tally.add(CutMode::DropPending, first);
    let points = prepared.sync_points();
    if std::env::var_os("POWER_LOSS_POINTS").is_some() {
        for p in &prepared.points {
            println!("power loss: {}: {p}", flow.name);
        }
    }
    let mut rng = Rng::new(plan.seed ^ fxhash(flow.name));
    let offset = rng.below(plan.every.max(1));
    for n in 1..=points {
        tally.add(CutMode::DropPending, prepared.cut(Some(n), CutMode::DropPending));
        if plan.every > 0 && (n + offset).is_multiple_of(plan.every) {
            let torn = CutMode::TornPrefix { seed: rng.next() };
            tally.add(torn, prepared.cut(Some(n), torn));
            let reorder = CutMode::Reorder { seed: rng.next() };
            tally.add(reorder, prepared.cut(Some(n), reorder));
        }
    }
    for _ in 0..plan.random {
        let n = 1 + rng.below(points + 1);
        let mode = rng.mode();
        tally.add(mode, prepared.cut(Some(n), mode));
    }
    for mode in [
        CutMode::TornPrefix { seed: rng.next() },
        CutMode::Reorder { seed: rng.next() },
    ] {
        tally.add(mode, prepared.cut(None, mode));
    }
    tally.seconds = started.elapsed().as_secs_f64();
    (points, tally)
}

/// A small stable hash of a flow's name, so each flow draws its own points.
fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// One line about a flow's cuts.
pub fn summary(name: &str, points: u64, t: &Tally) -> String {
    format!(
        "power loss: {name}: {points} sync points, {} cuts {:?}, {} acknowledged messages, {} lost, {} duplicated, {:.1} s",
        t.cuts, t.by_mode, t.acked, t.lost, t.duplicated, t.seconds
    )
}

/// The long run: `iterations` cuts over `flows`, each at a random sync
/// point (or after the flow) with a random mode.
pub fn long_run(flows: &[&Flow], iterations: u64, seed: u64) -> (Tally, BTreeMap<&'static str, Tally>) {
    let mut prepared = Vec::new();
    let mut per_flow: BTreeMap<&'static str, Tally> = BTreeMap::new();
    for &flow in flows {
        match Prepared::new(flow) {
            Ok((p, first)) => {
                let t = per_flow.entry(flow.name).or_default();
                t.add(CutMode::DropPending, first);
                println!("power loss: {}: {} sync points", flow.name, p.sync_points());
                prepared.push(p);
            }
            Err(e) => per_flow.entry(flow.name).or_default().problems.push(e),
        }
    }
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    for i in 0..iterations {
        if prepared.is_empty() {
            break;
        }
        let p = &prepared[rng.below(prepared.len() as u64) as usize];
        let n = 1 + rng.below(p.sync_points() + 1);
        let mode = rng.mode();
        let flow_started = Instant::now();
        let cut = p.cut(Some(n), mode);
        let t = per_flow.entry(p.flow.name).or_default();
        for problem in &cut.problems {
            eprintln!("power loss: cut {i} (seed {seed}): {problem}");
        }
        t.add(mode, cut);
        t.seconds += flow_started.elapsed().as_secs_f64();
        if (i + 1).is_multiple_of(500) {
            let lost: u64 = per_flow.values().map(|t| t.lost).sum();
            let problems: usize = per_flow.values().map(|t| t.problems.len()).sum();
            println!(
                "power loss: {} of {iterations} cuts, {lost} lost, {problems} problems, {:.0} s",
                i + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let mut total = Tally::default();
    for t in per_flow.values() {
        total.merge(t);
    }
    (total, per_flow)
}
