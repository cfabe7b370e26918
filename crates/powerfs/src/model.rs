//! The inode table and the durability model behind the mount.
//!
//! Every inode the FS has seen keeps a descriptor on its backing object for
//! the life of the mount, so an open handle, an unlinked file and a renamed
//! file all stay reachable by inode, never by name. Inode numbers are the
//! FS's own, handed out in order and never reused during a mount.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use crate::fault::{Armed, FaultOp};
use crate::log::{DirChange, DirLog, DirOp, FileLog};
use crate::sys;

pub(crate) use crate::log::Ino;
pub(crate) const ROOT: Ino = 1;

/// What kind of sync request a [`SyncPoint`] was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncKind {
    /// `fsync(2)` on a file.
    Fsync,
    /// `fdatasync(2)` on a file.
    Fdatasync,
    /// `fsync(2)` on a directory.
    DirSync,
}

/// One sync request the FS received, numbered from 1 in arrival order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncPoint {
    pub n: u64,
    /// The path relative to the mount, as the FS last saw it.
    pub path: PathBuf,
    pub kind: SyncKind,
}

impl std::fmt::Display for SyncPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sync #{} {:?} {}", self.n, self.kind, self.path.display())
    }
}

#[derive(Debug)]
pub(crate) enum Kind {
    File(FileLog),
    Dir(DirLog),
    Symlink(OsString),
    /// FIFOs, sockets, devices: names only, no content.
    Special,
}

#[derive(Debug)]
pub(crate) struct Node {
    /// Read-write for files, read-only for directories, `O_PATH` otherwise.
    pub file: File,
    /// The last name the FS saw for the inode (for paths in faults and logs).
    pub parent: Ino,
    pub name: OsString,
    pub kind: Kind,
}

/// A directory listing taken at `opendir`, served by offset.
pub(crate) type Listing = Vec<(Ino, libc::mode_t, OsString)>;

#[derive(Debug, Default)]
pub(crate) struct Model {
    pub nodes: BTreeMap<Ino, Node>,
    /// Backing (dev, ino) to FS inode. A backing inode is never reused
    /// while a descriptor on it is held, and every node holds one.
    by_backing: HashMap<(u64, u64), Ino>,
    next_ino: Ino,
    pub syncs: Vec<SyncPoint>,
    pub cut_at: Option<u64>,
    pub frozen_at: Option<u64>,
    pub faults: Vec<Armed>,
    pub listings: HashMap<u64, Listing>,
    next_fh: u64,
    next_op: u64,
}

pub(crate) fn kind_of(mode: libc::mode_t) -> libc::mode_t {
    mode & libc::S_IFMT
}

/// Opens the backing object `name` in `dir` the way its node keeps it.
fn open_node(dir: &File, name: &OsStr, st: &libc::stat) -> io::Result<(File, Kind)> {
    let fd = dir.as_raw_fd();
    match kind_of(st.st_mode) {
        libc::S_IFREG => {
            let file = sys::openat(fd, name, libc::O_RDWR | libc::O_NOFOLLOW, 0)
                .or_else(|_| sys::openat(fd, name, libc::O_RDONLY | libc::O_NOFOLLOW, 0))?;
            Ok((file, Kind::File(FileLog::new(st.st_size as u64, false))))
        }
        libc::S_IFDIR => {
            let file = sys::openat(fd, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?;
            Ok((file, Kind::Dir(DirLog::new(BTreeMap::new(), false))))
        }
        libc::S_IFLNK => {
            let target = sys::readlinkat(fd, name)?;
            let file = sys::openat(fd, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            Ok((file, Kind::Symlink(target)))
        }
        _ => {
            let file = sys::openat(fd, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            Ok((file, Kind::Special))
        }
    }
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

impl Model {
    /// The model of a backing folder at mount time: everything in it is
    /// durable (it is what the last cut left, or what the test put there).
    pub fn scan(root: File) -> io::Result<Model> {
        let mut m = Model {
            next_ino: ROOT + 1,
            next_fh: 1,
            ..Model::default()
        };
        let st = sys::fstat(&root)?;
        m.by_backing.insert((st.st_dev, st.st_ino), ROOT);
        m.nodes.insert(
            ROOT,
            Node {
                file: root,
                parent: ROOT,
                name: OsString::new(),
                kind: Kind::Dir(DirLog::new(BTreeMap::new(), false)),
            },
        );
        let mut stack = vec![ROOT];
        while let Some(dir) = stack.pop() {
            let names = sys::list_dir(m.nodes[&dir].file.as_raw_fd())?;
            let mut durable = BTreeMap::new();
            for name in names {
                let (ino, new) = m.register(dir, &name)?;
                if new && matches!(m.nodes[&ino].kind, Kind::Dir(_)) {
                    stack.push(ino);
                }
                durable.insert(name, ino);
            }
            if let Kind::Dir(log) = &mut m.node_mut(dir)?.kind {
                log.durable = durable;
            }
        }
        Ok(m)
    }

    pub fn node(&self, ino: Ino) -> io::Result<&Node> {
        self.nodes.get(&ino).ok_or_else(enoent)
    }

    pub fn node_mut(&mut self, ino: Ino) -> io::Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or_else(enoent)
    }

    pub fn dir_file(&self, ino: Ino) -> io::Result<&File> {
        let node = self.node(ino)?;
        match node.kind {
            Kind::Dir(_) => Ok(&node.file),
            _ => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }

    fn frozen(&self) -> bool {
        self.frozen_at.is_some()
    }

    /// The inode behind `name` in `dir`, registering it if the FS has not
    /// seen it yet. Returns whether it was new.
    pub fn register(&mut self, dir: Ino, name: &OsStr) -> io::Result<(Ino, bool)> {
        let dir_file = self.dir_file(dir)?;
        let st = sys::lstatat(dir_file.as_raw_fd(), name)?;
        if let Some(&ino) = self.by_backing.get(&(st.st_dev, st.st_ino)) {
            return Ok((ino, false));
        }
        let (file, kind) = open_node(dir_file, name, &st)?;
        Ok((self.insert(file, dir, name, kind)?, true))
    }

    /// Adds a node for an object the FS just created (a new inode).
    pub fn insert(&mut self, file: File, parent: Ino, name: &OsStr, mut kind: Kind) -> io::Result<Ino> {
        let st = sys::fstat(&file)?;
        let frozen = self.frozen();
        match &mut kind {
            Kind::File(log) => log.frozen_len = frozen.then_some(0),
            Kind::Dir(log) => log.frozen_len = frozen.then_some(0),
            _ => {}
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.by_backing.insert((st.st_dev, st.st_ino), ino);
        self.nodes.insert(
            ino,
            Node {
                file,
                parent,
                name: name.to_owned(),
                kind,
            },
        );
        Ok(ino)
    }

    /// Looks `name` up in `dir` and remembers it as the inode's last name.
    pub fn lookup(&mut self, dir: Ino, name: &OsStr) -> io::Result<Ino> {
        let (ino, _) = self.register(dir, name)?;
        if ino != ROOT {
            let node = self.node_mut(ino)?;
            node.parent = dir;
            node.name = name.to_owned();
        }
        Ok(ino)
    }

    /// The inode `name` in `dir` names now, if any (without registering).
    pub fn peek(&mut self, dir: Ino, name: &OsStr) -> io::Result<Option<Ino>> {
        match self.register(dir, name) {
            Ok((ino, _)) => Ok(Some(ino)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The path of an inode relative to the mount, by the names last seen.
    pub fn path(&self, mut ino: Ino) -> PathBuf {
        let mut parts = Vec::new();
        // The chain is finite unless a rename loop confused it; bound it.
        for _ in 0..4096 {
            if ino == ROOT {
                break;
            }
            let Some(node) = self.nodes.get(&ino) else {
                break;
            };
            parts.push(node.name.clone());
            ino = node.parent;
        }
        parts.iter().rev().collect()
    }

    /// Records a pending change to a directory's entries; returns its id.
    pub fn dir_change(&mut self, dir: Ino, change: DirChange) -> io::Result<u64> {
        self.dir_change_paired(dir, change, None)
    }

    /// Records a pending change that is the source half of a rename whose
    /// destination half is `pair`.
    pub fn dir_change_paired(&mut self, dir: Ino, change: DirChange, pair: Option<u64>) -> io::Result<u64> {
        let id = self.next_op;
        match &mut self.node_mut(dir)?.kind {
            Kind::Dir(log) => log.ops.push(DirOp { id, change, pair }),
            _ => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
        self.next_op += 1;
        Ok(id)
    }

    /// The errno a fault makes this call fail with, if one fires.
    pub fn fault(&mut self, op: FaultOp, ino: Ino) -> Option<i32> {
        if self.faults.is_empty() {
            return None;
        }
        let path = self.path(ino);
        let mut errno = None;
        // Every matching fault counts the call, even when an earlier one fires.
        for armed in &mut self.faults {
            if let Some(e) = armed.check(op, &path) {
                errno.get_or_insert(e);
            }
        }
        errno
    }

    /// Freezes the durable state: nothing pending now or later becomes
    /// durable any more.
    fn freeze(&mut self, n: u64) {
        self.frozen_at = Some(n);
        for node in self.nodes.values_mut() {
            match &mut node.kind {
                Kind::File(log) => log.frozen_len = Some(log.ops.len()),
                Kind::Dir(log) => log.frozen_len = Some(log.ops.len()),
                _ => {}
            }
        }
    }

    /// A sync request on `ino`: counts it, freezes at the planned sync
    /// point, fails it if a fault says so, and otherwise makes the inode's
    /// pending state durable. Returns the errno to fail with.
    pub fn sync(&mut self, ino: Ino, kind: SyncKind) -> Result<(), i32> {
        let n = self.syncs.len() as u64 + 1;
        let path = self.path(ino);
        self.syncs.push(SyncPoint { n, path, kind });
        if self.cut_at == Some(n) && !self.frozen() {
            // The power fails while this sync is in flight: it, and every
            // later one, makes nothing durable.
            self.freeze(n);
        }
        let op = match kind {
            SyncKind::Fsync => FaultOp::Fsync,
            SyncKind::Fdatasync => FaultOp::Fdatasync,
            SyncKind::DirSync => FaultOp::DirSync,
        };
        let fault = self.fault(op, ino);
        let node = self.node_mut(ino).map_err(|_| libc::ENOENT)?;
        let io = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
        match (&mut node.kind, fault) {
            (Kind::File(log), Some(errno)) => {
                log.poison(&node.file).map_err(io)?;
                Err(errno)
            }
            (Kind::Dir(log), Some(errno)) => {
                log.poison();
                Err(errno)
            }
            (Kind::File(log), None) => log.commit().map_err(io),
            (Kind::Dir(log), None) => {
                log.commit();
                Ok(())
            }
            (_, Some(errno)) => Err(errno),
            (_, None) => Ok(()),
        }
    }

    /// A directory listing for `opendir`: a snapshot, so offsets stay valid.
    pub fn open_listing(&mut self, dir: Ino) -> io::Result<u64> {
        let names = sys::list_dir(self.dir_file(dir)?.as_raw_fd())?;
        let parent = self.node(dir)?.parent;
        let mut listing: Listing = vec![
            (dir, libc::S_IFDIR, OsString::from(".")),
            (parent, libc::S_IFDIR, OsString::from("..")),
        ];
        for name in names {
            let (ino, _) = self.register(dir, &name)?;
            let mode = kind_of(sys::fstat(&self.node(ino)?.file)?.st_mode);
            listing.push((ino, mode, name));
        }
        let fh = self.next_fh;
        self.next_fh += 1;
        self.listings.insert(fh, listing);
        Ok(fh)
    }
}
