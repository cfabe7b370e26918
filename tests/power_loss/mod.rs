//! The power-loss torture: each flow of turnsafe that makes a claim (an
//! append into a new home, the many-session group commit, a divert into a
//! new file and into an existing one, replay, the capture of a deleted WAL,
//! `recover --install` and `--dismiss`, the v2→v3 migration, LangGraph's
//! checkpoints, a clear with pending lines) runs on powerfs, the filesystem
//! that forgets what was not fsynced, and the power is cut at each of its
//! sync points in turn, with each mode of cut, and at random points.
//! Shared by `tests/power_loss_torture.rs` (every sync point of every
//! flow, in the test command) and the long run
//! (`benches/power_loss_torture.rs`, `scripts/power-loss-torture`).
//!
//! A flow starts from a home built off the mount (its *setup*, durable from
//! the start, with the claims made while building it) and records each
//! claim it makes only while the power is still on (no sync point frozen
//! yet: in a real power loss the process would not have lived to make a
//! later one). It keeps every record it sends as it sent it (a message's
//! object, a checkpoint's or a write's fields), and an outcome must name
//! exactly the uids it sent. After the cut and a remount, the test's own
//! readers (`content`: a read-only rusqlite connection and its own
//! queries, its own JSONL parsing and sha256; the capture folders'
//! manifests), never turnsafe's, check:
//!
//! - every record claimed in `state.db` (an outcome said `persisted`,
//!   replay or an install returned) is there exactly once with the bytes
//!   sent (a message's `item`; a checkpoint's blob, type, parent and
//!   metadata; a write's value, channel, type and task path; neither
//!   marked deleted); a persisted message of a generation retired under
//!   its writer (its WAL deleted) is in `state.db` or in a capture folder,
//!   with its bytes;
//! - every receipt's byte range, at its path or where replay or a clear
//!   moved the file, hashes to its sha256 and is its lines, each the
//!   record sent under its uid; every receipted line is still somewhere:
//!   pending (a divert file, `settling/`), stored or archived;
//! - a line a clear may have taken is never both stored and cleared (a
//!   copy still pending after a cut between the clear's COMMIT and its
//!   settling is settled `cleared` by replay, checked after replay), and
//!   one the clear returned with is archived;
//! - every capture receipt's folder holds its manifest (sha256) and files;
//!   every capture claimed settled has its `SETTLED`; every file replay
//!   settled is in `settled/` with its ledger lines;
//! - `PRAGMA integrity_check` is ok;
//! - `doctor` finds nothing wrong, or only captures left to settle.
//!
//! Then, as an operator would, every pending capture is settled (installed
//! with `recover --install` when it has its manifest, dismissed otherwise)
//! and `replay` runs: every acknowledged record (persisted, receipted, or
//! in the setup) must be stored exactly once with the bytes sent (or, for
//! what a clear took, archived instead), nothing stored that was never
//! sent, nothing at all twice, `integrity_check` ok and `doctor` clean.
#![allow(dead_code)]

pub mod content;
pub mod flows;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use powerfs::{CutMode, PowerFs, SyncPoint};
use serde_json::{Value, json};
use sha2::Digest;
use turnsafe_host::capture::Capture;
use turnsafe_host::divert::Receipt;
use turnsafe_host::graph::GraphBatch;
use turnsafe_host::message::Message;
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::replay::{FileReport, ReplayOptions};
use turnsafe_host::store::SessionId;

pub use content::{Key, Sent};

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

/// What a flow sent, and what it claimed while the power was on (and what
/// its setup had sent and claimed before it started).
#[derive(Debug, Clone, Default)]
pub struct Claims {
    /// Every record sent, as the test sent it, by key.
    pub sent: BTreeMap<Key, Sent>,
    /// Every acknowledged record: persisted, in a receipt, or in the
    /// setup's database. Once settled and replayed, each is stored exactly
    /// once, with the bytes sent.
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
    /// Each receipt, with the keys of the batch it was given for.
    pub receipts: Vec<(Receipt, Vec<Key>)>,
    pub captures: Vec<Capture>,
    /// Capture folders claimed settled (`SETTLED` written).
    pub settled: Vec<PathBuf>,
    /// Files replay settled: the file's name in `settled/`, its lines.
    pub ledger: Vec<(String, u64)>,
    /// Acknowledged messages a clear started on may have taken: each is in
    /// exactly one place, stored or archived (reason `clear`), never both,
    /// and never pending while archived.
    pub clearable: BTreeSet<Key>,
    /// Messages a clear returned with: archived (reason `clear`), neither
    /// stored nor pending.
    pub cleared: BTreeSet<Key>,
    /// What the code under test got wrong while the flow ran (an outcome
    /// naming other uids than the test sent).
    pub problems: Vec<String>,
}

impl Claims {
    /// An outcome of the batch `sent`: its uids must be the ones sent, one
    /// per record. If the power is still on, a persisted batch is
    /// acknowledged and in `state.db`; a diverted one is acknowledged by
    /// its receipt; a capture receipt is a claim of its own.
    pub fn outcome(&mut self, sent: &[(Key, Sent)], out: &FlushOutcome, power: &Power<'_>) {
        let keys: Vec<Key> = sent.iter().map(|(k, _)| k.clone()).collect();
        if !out.uids.iter().eq(keys.iter().map(|k| &k.1)) {
            self.problems.push(format!(
                "an outcome names the uids {:?}; the test sent {} records, {:?}",
                out.uids,
                keys.len(),
                keys.iter().map(|k| &k.1).collect::<Vec<_>>()
            ));
        }
        for (k, s) in sent {
            self.sent.insert(k.clone(), s.clone());
        }
        if !power.on() {
            return;
        }
        if out.persisted {
            self.acked.extend(keys.iter().cloned());
            self.in_db.extend(keys.iter().cloned());
        }
        if let Some(r) = &out.receipt {
            if r.count as usize != keys.len() {
                self.problems.push(format!(
                    "a receipt covers {} lines of a batch of {}: {r:?}",
                    r.count,
                    keys.len()
                ));
            }
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

    /// A clear of `session` is about to start, with the power on: from now
    /// on its acknowledged messages (stored, or pending lines) may be
    /// archived instead of stored.
    pub fn clearing(&mut self, session: &str, power: &Power<'_>) {
        if !power.on() {
            return;
        }
        let taken: Vec<Key> = self
            .acked
            .iter()
            .filter(|k| k.0 == session && matches!(self.sent.get(*k), Some(Sent::Message(_))))
            .cloned()
            .collect();
        for k in taken {
            self.acked.remove(&k);
            self.in_db.remove(&k);
            self.clearable.insert(k);
        }
    }

    /// The clear returned: what it may have taken is archived.
    pub fn cleared(&mut self, power: &Power<'_>) {
        if power.on() {
            self.cleared.append(&mut self.clearable);
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

    /// A replay of every pending file returned: every receipted record
    /// (but what a clear took) is in `state.db`, and every file it settled
    /// is in `settled/` with its ledger lines.
    pub fn replayed(&mut self, files: &[FileReport], power: &Power<'_>) {
        if !power.on() {
            return;
        }
        for (_, keys) in &self.receipts {
            let live = keys
                .iter()
                .filter(|k| !self.clearable.contains(*k) && !self.cleared.contains(*k));
            self.in_db.extend(live.cloned());
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

    /// How many of each claim, for a message.
    pub fn summary(&self) -> String {
        format!(
            "{} sent, {} acknowledged, {} in state.db, {} retired, {} at risk, {} receipts, {} captures, \
             {} clearable, {} cleared, problems {:?}",
            self.sent.len(),
            self.acked.len(),
            self.in_db.len(),
            self.retired.len(),
            self.at_risk.len(),
            self.receipts.len(),
            self.captures.len(),
            self.clearable.len(),
            self.cleared.len(),
            self.problems
        )
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

/// A batch of messages as the test sends it: the records it keeps, and the
/// messages handed to the store, made from the same objects.
pub struct Batch {
    pub session: SessionId,
    pub sent: Vec<(Key, Sent)>,
    pub messages: Vec<Message>,
}

/// `n` messages of `session`, of about 200 bytes, with uids `<tag>-<i>`.
pub fn batch(session: &str, tag: &str, n: usize) -> Batch {
    let mut sent = Vec::new();
    let mut messages = Vec::new();
    for i in 0..n {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let object = json!({
            "role": role,
            "content": format!("{tag} message {i}: {}", "lorem ipsum ".repeat(16)),
        });
        let uid = format!("{tag}-{i}");
        if let Value::Object(item) = &object {
            messages.push(Message::from_item(item.clone()).with_uid(&uid));
        }
        sent.push(((session.to_string(), uid), Sent::Message(object)));
    }
    Batch {
        session: sid(session),
        sent,
        messages,
    }
}

/// The records of a LangGraph batch, as the test sends them.
pub fn graph_sent(g: &GraphBatch) -> Vec<(Key, Sent)> {
    match g {
        GraphBatch::Checkpoint(c) => vec![(content::checkpoint_key(c), Sent::Checkpoint(c.clone()))],
        GraphBatch::Writes(ws) => ws
            .iter()
            .map(|w| (content::write_key(w), Sent::Write(w.clone())))
            .collect(),
    }
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
    /// A hole of the code under test this flow is known to find: the
    /// problems it explains are counted apart (`Tally::known`), every
    /// other one still fails. The test command requires it to be found,
    /// so the day it is closed the flow is made strict again.
    pub known: Option<KnownHole>,
}

/// A hole a flow finds, described, with the problems it explains.
#[derive(Clone, Copy)]
pub struct KnownHole {
    pub why: &'static str,
    pub explains: fn(&str) -> bool,
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
    /// Acknowledged records stored (or archived) with other bytes than sent.
    pub changed: u64,
    pub duplicated: u64,
    pub problems: Vec<String>,
    /// The problems the flow's known hole explains.
    pub known: Vec<String>,
}

/// A change made to what a cut left (the files under the home, or the
/// claims recorded) before it is checked: how the tests show the recount
/// failing on a stored byte changed, a stale blob, a receipt off by one.
pub type Tamper<'t> = &'t dyn Fn(&Path, &mut Claims);

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
        let (cut, points, claims) = prepared.cut_with(None, CutMode::DropPending, None);
        (flow.expect)(&claims).map_err(|e| format!("{}: a run without a cut: {e}: {}", flow.name, claims.summary()))?;
        Ok((Prepared { points, ..prepared }, cut))
    }

    pub fn sync_points(&self) -> u64 {
        self.points.len() as u64
    }

    /// Mount a fresh copy of the setup, plan the cut at sync point `at`
    /// (none: after the flow), run the flow, cut with `mode`, remount,
    /// check, settle, replay, recount.
    pub fn cut(&self, at: Option<u64>, mode: CutMode) -> Cut {
        self.cut_with(at, mode, None).0
    }

    /// [`Prepared::cut`], with `tamper` applied after the remount, before
    /// anything is checked.
    pub fn cut_tampered(&self, at: Option<u64>, mode: CutMode, tamper: Tamper<'_>) -> Cut {
        self.cut_with(at, mode, Some(tamper)).0
    }

    fn cut_with(&self, at: Option<u64>, mode: CutMode, tamper: Option<Tamper<'_>>) -> (Cut, Vec<SyncPoint>, Claims) {
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
        let home = home(&root);
        if let Some(tamper) = tamper {
            tamper(&home, &mut claims);
        }
        let mut cut = Cut {
            frozen: frozen.map(|p| p.to_string()),
            ..Cut::default()
        };
        for p in check(&home, &claims, mode) {
            cut.problems
                .push(format!("{}: {what}: after the cut: {p}", self.flow.name));
        }
        let settled = settle(&root, &home);
        if let Err(p) = &settled {
            cut.problems.push(format!("{}: {what}: settling: {p}", self.flow.name));
        }
        let counted = recount(&home, &claims, mode);
        cut.acked = counted.acked;
        cut.lost = counted.lost;
        cut.changed = counted.changed;
        cut.duplicated = counted.duplicated;
        for p in counted.problems {
            cut.problems
                .push(format!("{}: {what}: once settled and replayed: {p}", self.flow.name));
        }
        if let Some(hole) = self.flow.known {
            let (known, problems) = cut.problems.into_iter().partition(|p| (hole.explains)(p));
            cut.known = known;
            cut.problems = problems;
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

/// What every capture folder under `home` holds (read from a copy, with
/// the test's own reader).
fn held_by_captures(home: &Path) -> content::Stored {
    let mut held = content::Stored::default();
    for c in turnsafe_host::captures::list(home).unwrap_or_default() {
        let Ok(work) = tempfile::tempdir() else { continue };
        if turnsafe_host::recover::copy_source(&c.path, work.path()).is_ok()
            && let Ok(rows) = content::read(&work.path().join("state.db"))
        {
            held.extend(rows);
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

/// Whether every copy of `k` in `stored` holds the record sent under it.
fn holds(claims: &Claims, stored: &content::Stored, k: &Key) -> Result<(), String> {
    let sent = claims.sent.get(k).ok_or("the test has no record of sending it")?;
    stored.holds(k, sent)
}

/// How many of the pending lines of `k` hold the record sent; the first
/// that does not, as an error.
fn pending_copies(claims: &Claims, pending: &BTreeMap<Key, Vec<(Value, String)>>, k: &Key) -> Result<u64, String> {
    let Some(sent) = claims.sent.get(k) else {
        return Err("the test has no record of sending it".into());
    };
    let mut n = 0;
    for (line, session) in pending.get(k).into_iter().flatten() {
        content::line_holds(line, k, session, sent)?;
        n += 1;
    }
    Ok(n)
}

/// Where each receipted line and each message a clear may have taken is,
/// right after a cut: a receipted line is pending, stored or archived,
/// never nowhere; what a clear may have taken is never both stored and
/// cleared (a copy still pending is settled `cleared` by replay), and what it returned with is
/// archived (reason `clear`) and nowhere else. Every copy holds the bytes
/// sent.
fn places(claims: &Claims, stored: &content::Stored, pending: &BTreeMap<Key, Vec<(Value, String)>>) -> Vec<String> {
    let mut bad = Vec::new();
    let receipted = claims.receipts.iter().flat_map(|(_, keys)| keys);
    let taken: BTreeSet<&Key> = claims.clearable.iter().chain(&claims.cleared).collect();
    let every: BTreeSet<&Key> = receipted.chain(taken.iter().copied()).collect();
    for k in every {
        let pend = pending_copies(claims, pending, k).unwrap_or_else(|d| {
            bad.push(format!("a pending line of {k:?} holds other bytes than sent: {d}"));
            1
        });
        let live = stored.count(k);
        let archived = stored.archived(k, "clear");
        if let Some(sent) = claims.sent.get(k) {
            for row in &archived {
                if let Err(d) = content::row_holds(row, sent) {
                    bad.push(format!("{k:?} is archived with other bytes than sent: {d}"));
                }
            }
        }
        let archived = archived.len() as u64;
        if pend + live + archived == 0 {
            bad.push(format!(
                "{k:?} was acknowledged and is neither pending, nor stored, nor archived"
            ));
        }
        if !taken.contains(k) {
            continue;
        }
        // Archived and still pending is a clear cut after its archive's
        // COMMIT and before its settling: replay finds the line archived
        // by the clear with its bytes and settles it `cleared`, which the
        // recount after replay checks (never both stored and cleared).
        if archived > 0 && live > 0 {
            bad.push(format!("{k:?} is both stored and cleared"));
        }
        if archived > 1 {
            bad.push(format!("{k:?} is archived {archived} times"));
        }
        if claims.cleared.contains(k) && (archived, live, pend) != (1, 0, 0) {
            bad.push(format!(
                "{k:?} was cleared, and is archived {archived} times, stored {live}, pending {pend}"
            ));
        }
    }
    bad
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
    bad.extend(claims.problems.iter().map(|p| format!("while the flow ran: {p}")));
    let stored = content::read(&db).unwrap_or_else(|e| {
        bad.push(e);
        content::Stored::default()
    });
    for k in &claims.in_db {
        match stored.count(k) {
            1 => {
                if let Err(d) = holds(claims, &stored, k) {
                    bad.push(format!("{k:?} is in state.db with other bytes than sent: {d}"));
                }
            }
            0 => bad.push(format!("{k:?} was claimed in state.db and is not there")),
            n => bad.push(format!("{k:?} is in state.db {n} times")),
        }
    }
    let retired = claims.retired_after(mode);
    let missing: Vec<&Key> = retired.iter().filter(|k| stored.count(k) == 0).collect();
    if !missing.is_empty() {
        let held = held_by_captures(home);
        for k in missing {
            if held.count(k) == 0 {
                bad.push(format!(
                    "{k:?} was persisted, and is neither in state.db nor in a capture"
                ));
            } else if let Err(d) = holds(claims, &held, k) {
                bad.push(format!("{k:?} is in a capture with other bytes than sent: {d}"));
            }
        }
    }
    for (r, keys) in &claims.receipts {
        if let Err(e) = content::receipt_holds(home, r, keys, &claims.sent) {
            bad.push(format!(
                "receipt {} [{}, +{}) of {} lines: {e}",
                r.path, r.offset, r.length, r.count
            ));
        }
    }
    let pending = content::pending(home).unwrap_or_else(|e| {
        bad.push(e);
        BTreeMap::new()
    });
    bad.extend(places(claims, &stored, &pending));
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

/// What a recount found.
#[derive(Debug, Default)]
pub struct Counted {
    pub acked: u64,
    pub lost: u64,
    pub changed: u64,
    pub duplicated: u64,
    pub problems: Vec<String>,
}

/// After settling and replaying: every acknowledged record stored exactly
/// once with the bytes sent (what a clear may have taken: stored or
/// archived, exactly once; what it returned with: archived), nothing
/// stored twice, nothing stored that was never sent, integrity ok, doctor
/// clean.
pub fn recount(home: &Path, claims: &Claims, mode: CutMode) -> Counted {
    let acked = claims.acked_after(mode);
    let taken: BTreeSet<&Key> = claims.clearable.iter().chain(&claims.cleared).collect();
    let mut c = Counted {
        acked: (acked.len() + taken.len()) as u64,
        ..Counted::default()
    };
    let db = home.join("state.db");
    if let Err(e) = integrity(&db) {
        c.problems.push(e);
    }
    let stored = match content::read(&db) {
        Ok(stored) => stored,
        Err(e) => {
            c.lost += c.acked;
            c.problems.push(e);
            return c;
        }
    };
    for k in &acked {
        match stored.count(k) {
            0 => {
                c.lost += 1;
                c.problems.push(format!("acknowledged {k:?} is lost"));
            }
            1 => {
                if let Err(d) = holds(claims, &stored, k) {
                    c.changed += 1;
                    c.problems
                        .push(format!("acknowledged {k:?} is stored with other bytes than sent: {d}"));
                }
            }
            n => {
                c.duplicated += 1;
                c.problems.push(format!("acknowledged {k:?} is stored {n} times"));
            }
        }
    }
    for k in &taken {
        let live = stored.count(k);
        let archived = stored.archived(k, "clear");
        let sent = claims.sent.get(*k);
        match (live, archived.as_slice()) {
            (0, []) => {
                c.lost += 1;
                c.problems.push(format!(
                    "{k:?}, which a clear may have taken, is neither stored nor archived"
                ));
            }
            (1, []) if claims.cleared.contains(*k) => {
                c.problems
                    .push(format!("{k:?} was cleared, and is stored, not archived"));
            }
            (1, []) => {
                if let Err(d) = holds(claims, &stored, k) {
                    c.changed += 1;
                    c.problems
                        .push(format!("acknowledged {k:?} is stored with other bytes than sent: {d}"));
                }
            }
            (0, [row]) => {
                if let Err(d) = sent.map_or(Err("never sent".into()), |s| content::row_holds(row, s)) {
                    c.changed += 1;
                    c.problems
                        .push(format!("cleared {k:?} is archived with other bytes than sent: {d}"));
                }
            }
            (1, [_]) => c.problems.push(format!("{k:?} is both stored and cleared")),
            (n, archived) => {
                c.duplicated += 1;
                c.problems.push(format!(
                    "{k:?} is stored {n} times and archived {} times by a clear",
                    archived.len()
                ));
            }
        }
    }
    for (k, rows) in &stored.rows {
        if !claims.sent.contains_key(k) {
            c.problems.push(format!("{k:?} is stored and was never sent"));
        }
        if rows.len() > 1 && !acked.contains(k) && !taken.contains(k) {
            c.duplicated += 1;
            c.problems.push(format!("{k:?} is stored {} times", rows.len()));
        }
    }
    if home.is_dir() {
        c.problems.extend(doctor_errors(home, false));
    }
    c
}

/// What a series of cuts of one flow added up to.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub cuts: u64,
    pub by_mode: BTreeMap<&'static str, u64>,
    pub acked: u64,
    pub lost: u64,
    pub changed: u64,
    pub duplicated: u64,
    pub problems: Vec<String>,
    /// Problems a flow's known hole explains.
    pub known: Vec<String>,
    pub seconds: f64,
}

impl Tally {
    pub fn add(&mut self, mode: CutMode, cut: Cut) {
        self.cuts += 1;
        *self.by_mode.entry(mode_name(mode)).or_default() += 1;
        self.acked += cut.acked;
        self.lost += cut.lost;
        self.changed += cut.changed;
        self.duplicated += cut.duplicated;
        self.problems.extend(cut.problems);
        self.known.extend(cut.known);
    }
    pub fn merge(&mut self, other: &Tally) {
        self.cuts += other.cuts;
        for (m, n) in &other.by_mode {
            *self.by_mode.entry(m).or_default() += n;
        }
        self.acked += other.acked;
        self.lost += other.lost;
        self.changed += other.changed;
        self.duplicated += other.duplicated;
        self.problems.extend(other.problems.iter().cloned());
        self.known.extend(other.known.iter().cloned());
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
        "power loss: {name}: {points} sync points, {} cuts {:?}, {} acknowledged records, {} lost, {} changed, {} duplicated, {} known, {:.1} s",
        t.cuts,
        t.by_mode,
        t.acked,
        t.lost,
        t.changed,
        t.duplicated,
        t.known.len(),
        t.seconds
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
            let changed: u64 = per_flow.values().map(|t| t.changed).sum();
            let problems: usize = per_flow.values().map(|t| t.problems.len()).sum();
            println!(
                "power loss: {} of {iterations} cuts, {lost} lost, {changed} changed, {problems} problems, {:.0} s",
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
