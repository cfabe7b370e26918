//! A power cut: rebuild the backing folder from the durable state alone.
//!
//! Runs after the mount is gone, on the plain backing folder. The plan is
//! drawn first (one seeded generator, inodes in number order, so a seed
//! gives the same cut every time), then:
//! 1. each directory's entries after the cut are its durable entries plus
//!    the changes the mode keeps; walking them from the root gives every
//!    name that survives (an inode reachable by no surviving name is gone);
//! 2. each surviving file's content is set to its durable content plus the
//!    writes the mode keeps, in place through the descriptor the model
//!    holds (so it works for a file unlinked in the live view too);
//! 3. the surviving tree is built in a staging folder of hard links (a copy
//!    where the inode has no name left), the old entries are removed, and
//!    the staged ones moved in.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, lchown};
use std::path::{Path, PathBuf};

use crate::log::{FileLog, Keep, read_up_to};
use crate::model::{Ino, Kind, Model, ROOT, SyncPoint};
use crate::sys;

/// What survives of the pending state (not yet synced) at a cut. Durable
/// state always survives; what was frozen out by [`crate::PowerFs::cut_at_sync`]
/// never does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutMode {
    /// Nothing pending survives: every unsynced write, size change and
    /// directory change is lost. The strictest and the default to test with.
    DropPending,
    /// Everything pending survives (a clean shutdown; a baseline).
    KeepPending,
    /// Each file keeps a random prefix of its pending writes in order, and
    /// the first write it does not keep whole may be torn at a 512-byte
    /// sector boundary (its first sectors kept). Each directory keeps a
    /// random prefix of its pending entry changes.
    TornPrefix { seed: u64 },
    /// Each file and each directory independently keeps all or none of
    /// its pending changes: one file's writes survive while another's,
    /// issued earlier, are lost.
    Reorder { seed: u64 },
}

/// What a cut kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CutReport {
    /// The sync point the durable state was frozen at, if one was planned
    /// and reached.
    pub frozen_at: Option<SyncPoint>,
    /// How many sync requests the mount received.
    pub syncs: u64,
    /// Pending file operations (writes, size changes) kept whole.
    pub file_ops_kept: usize,
    /// Pending file operations dropped (a torn one counts as dropped).
    pub file_ops_dropped: usize,
    /// Writes kept only in part (torn at a sector boundary).
    pub torn_writes: usize,
    /// Pending directory changes kept.
    pub dir_changes_kept: usize,
    /// Pending directory changes dropped.
    pub dir_changes_dropped: usize,
    /// Names in the rebuilt tree (files, folders, links), root excluded.
    pub names: usize,
}

fn rng(mode: CutMode) -> fastrand::Rng {
    match mode {
        CutMode::TornPrefix { seed } | CutMode::Reorder { seed } => fastrand::Rng::with_seed(seed),
        CutMode::DropPending | CutMode::KeepPending => fastrand::Rng::with_seed(0),
    }
}

fn plan_file(mode: CutMode, rng: &mut fastrand::Rng, log: &FileLog) -> Keep {
    let n = log.candidates();
    if n == 0 {
        return Keep::default();
    }
    match mode {
        CutMode::DropPending => Keep::default(),
        CutMode::KeepPending => Keep { ops: n, torn: None },
        CutMode::Reorder { .. } => Keep {
            ops: if rng.bool() { n } else { 0 },
            torn: None,
        },
        CutMode::TornPrefix { .. } => {
            let ops = rng.usize(0..=n);
            let torn = match log.ops.get(ops) {
                Some(op) if ops < n => {
                    let points = op.tear_points();
                    if !points.is_empty() && rng.bool() {
                        Some(points[rng.usize(0..points.len())])
                    } else {
                        None
                    }
                }
                _ => None,
            };
            Keep { ops, torn }
        }
    }
}

fn plan_dir(mode: CutMode, rng: &mut fastrand::Rng, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    match mode {
        CutMode::DropPending => 0,
        CutMode::KeepPending => n,
        CutMode::Reorder { .. } => {
            if rng.bool() {
                n
            } else {
                0
            }
        }
        CutMode::TornPrefix { .. } => rng.usize(0..=n),
    }
}

fn staging_name(root: &BTreeMap<OsString, Ino>) -> OsString {
    (0u32..)
        .map(|i| OsString::from(format!(".powerfs-cut.{}.{i}", std::process::id())))
        .find(|n| !root.contains_key(n))
        .expect("a free staging name")
}

pub(crate) fn rebuild(model: &Model, backing: &Path, mode: CutMode) -> io::Result<CutReport> {
    let mut report = CutReport {
        syncs: model.syncs.len() as u64,
        frozen_at: model.frozen_at.and_then(|n| model.syncs.get(n as usize - 1).cloned()),
        ..CutReport::default()
    };
    let mut rng = rng(mode);
    let mut keeps: HashMap<Ino, Keep> = HashMap::new();
    let mut dir_keeps: HashMap<Ino, usize> = HashMap::new();
    for (&ino, node) in &model.nodes {
        match &node.kind {
            Kind::File(log) => {
                keeps.insert(ino, plan_file(mode, &mut rng, log));
            }
            Kind::Dir(log) => {
                let keep = plan_dir(mode, &mut rng, log.candidates());
                report.dir_changes_kept += keep;
                report.dir_changes_dropped += log.ops.len() - keep;
                dir_keeps.insert(ino, keep);
            }
            _ => {}
        }
    }
    // The ids of every pending directory change the cut drops, so that the
    // source half of a rename goes only with its destination half.
    let mut dropped = HashSet::new();
    for (ino, &keep) in &dir_keeps {
        if let Kind::Dir(log) = &model.nodes[ino].kind {
            dropped.extend(log.ops[keep..].iter().map(|op| op.id));
        }
    }
    let mut entries: HashMap<Ino, BTreeMap<OsString, Ino>> = HashMap::new();
    for (ino, &keep) in &dir_keeps {
        if let Kind::Dir(log) = &model.nodes[ino].kind {
            entries.insert(*ino, log.after_cut(keep, &dropped));
        }
    }

    // 1. Every surviving name, each folder before what it holds.
    let mut items: Vec<(PathBuf, Ino)> = Vec::new();
    let mut seen_dirs: HashSet<Ino> = HashSet::from([ROOT]);
    let mut stack = vec![(PathBuf::new(), ROOT)];
    while let Some((path, dir)) = stack.pop() {
        for (name, &ino) in &entries[&dir] {
            let Some(node) = model.nodes.get(&ino) else {
                continue;
            };
            let p = path.join(name);
            if let Kind::Dir(_) = node.kind {
                // A folder has one place; a second surviving name for it
                // (a cross-folder rename half kept) is ignored, and so is a loop.
                if seen_dirs.insert(ino) {
                    items.push((p.clone(), ino));
                    stack.push((p, ino));
                }
            } else {
                items.push((p, ino));
            }
        }
    }
    report.names = items.len();

    // 2. Contents.
    let mut done = HashSet::new();
    for (_, ino) in &items {
        let node = &model.nodes[ino];
        if let Kind::File(log) = &node.kind
            && done.insert(*ino)
        {
            let keep = keeps[ino];
            report.file_ops_kept += keep.ops;
            report.file_ops_dropped += log.ops.len() - keep.ops;
            report.torn_writes += usize::from(keep.torn.is_some());
            log.apply_cut(&node.file, keep)?;
        }
    }

    // 3. Names.
    let staging = backing.join(staging_name(&entries[&ROOT]));
    std::fs::create_dir(&staging)?;
    let mut first: HashMap<Ino, PathBuf> = HashMap::new();
    let mut dirs = Vec::new();
    for (path, ino) in &items {
        let node = &model.nodes[ino];
        let target = staging.join(path);
        let st = sys::fstat(&node.file)?;
        let mode = st.st_mode & 0o7777;
        if let Some(other) = first.get(ino) {
            std::fs::hard_link(other, &target)?;
            continue;
        }
        match &node.kind {
            Kind::Dir(_) => {
                std::fs::create_dir(&target)?;
                dirs.push((target.clone(), mode));
            }
            Kind::File(log) => {
                let fd = node.file.as_raw_fd();
                match sys::link_fd(fd, libc::AT_FDCWD, target.as_os_str()) {
                    Ok(()) => {}
                    // No name left in the live view: copy the content.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        let size = sys::fstat(&node.file)?.st_size as usize;
                        let data = read_up_to(&node.file, 0, size.max(log.size as usize))?;
                        std::fs::write(&target, data)?;
                        std::fs::set_permissions(&target, PermissionsExt::from_mode(mode))?;
                    }
                    Err(e) => return Err(e),
                }
            }
            Kind::Symlink(to) => std::os::unix::fs::symlink(to, &target)?,
            Kind::Special => {
                let name = std::ffi::CString::new(target.as_os_str().as_bytes())?;
                let rc = unsafe { libc::mknod(name.as_ptr(), st.st_mode, st.st_rdev) };
                if rc < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        lchown(&target, Some(st.st_uid), Some(st.st_gid))?;
        first.insert(*ino, target);
    }
    for (dir, mode) in dirs {
        std::fs::set_permissions(dir, PermissionsExt::from_mode(mode))?;
    }
    for entry in std::fs::read_dir(backing)? {
        let entry = entry?;
        let path = entry.path();
        if path == staging {
            continue;
        }
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    for entry in std::fs::read_dir(&staging)? {
        let entry = entry?;
        std::fs::rename(entry.path(), backing.join(entry.file_name()))?;
    }
    std::fs::remove_dir(&staging)?;
    Ok(report)
}
