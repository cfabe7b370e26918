//! The pending state of one file and of one directory: what changed since
//! its last successful sync, in order, with enough to take each change back.
//!
//! A file's durable content is kept in one of two ways:
//! - [`Durable::Live`]: the durable content is the live backing file with
//!   the pending operations undone (each write keeps the bytes it
//!   replaced). A sync then costs nothing: it forgets the undo log.
//! - [`Durable::Bytes`]: an explicit copy. A file switches to it when a
//!   sync fails: the pending data is then lost for good while the live
//!   file still shows it, so "live minus pending" no longer describes the
//!   durable content. Later writes are redone onto the copy at each sync.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// An inode number of the model (the log records which inode each name
/// pointed at).
pub(crate) type Ino = u64;

/// Something a file operation can be applied to: the live backing file
/// or an in-memory copy.
pub(crate) trait Image {
    fn write_at(&mut self, off: u64, data: &[u8]) -> io::Result<()>;
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl Image for Vec<u8> {
    fn write_at(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        let off = off as usize;
        let end = off + data.len();
        if self.len() < end {
            self.resize(end, 0);
        }
        self[off..end].copy_from_slice(data);
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.resize(len as usize, 0);
        Ok(())
    }
}

impl Image for &File {
    fn write_at(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        self.write_all_at(data, off)
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
}

/// Reads `[off, off+len)`, stopping early at the end of the file.
pub(crate) fn read_up_to(file: &File, off: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// One change to a file, with what it replaced.
#[derive(Debug, Clone)]
pub(crate) enum FileOp {
    /// `data` written at `off`; `pre` is what `[off, off+data.len())` held
    /// before (shorter where the write went past the end).
    Write {
        off: u64,
        data: Vec<u8>,
        old_size: u64,
        pre: Vec<u8>,
    },
    /// The size set to `len`; `pre` is what `[len, old_size)` held when it
    /// shrank the file.
    SetLen { len: u64, old_size: u64, pre: Vec<u8> },
}

impl FileOp {
    /// Applies the operation, or only its first `keep` bytes (a torn write).
    pub fn redo(&self, img: &mut impl Image, keep: Option<u64>) -> io::Result<()> {
        match self {
            FileOp::Write { off, data, .. } => {
                let n = keep.map_or(data.len(), |k| k as usize);
                img.write_at(*off, &data[..n])
            }
            FileOp::SetLen { len, .. } => img.set_len(*len),
        }
    }

    /// From the state right after this operation, goes back to the state
    /// before it, or (with `keep`) to the state where only its first
    /// `keep` bytes had reached the disk.
    pub fn undo(&self, img: &mut impl Image, keep: Option<u64>) -> io::Result<()> {
        match self {
            FileOp::Write { off, old_size, pre, .. } => {
                let t = keep.unwrap_or(0) as usize;
                if pre.len() > t {
                    img.write_at(off + t as u64, &pre[t..])?;
                }
                img.set_len((*old_size).max(off + t as u64))
            }
            FileOp::SetLen { len, old_size, pre } => {
                img.set_len(*old_size)?;
                if !pre.is_empty() {
                    img.write_at(*len, pre)?;
                }
                Ok(())
            }
        }
    }

    /// The absolute offsets strictly inside a write where it may tear: the
    /// 512-byte sector boundaries it crosses.
    pub fn tear_points(&self) -> Vec<u64> {
        match self {
            FileOp::Write { off, data, .. } => {
                let end = off + data.len() as u64;
                let first = (off / 512 + 1) * 512;
                (first..end).step_by(512).map(|b| b - off).collect()
            }
            FileOp::SetLen { .. } => Vec::new(),
        }
    }
}

/// How a file's durable content is kept (see the module docs).
#[derive(Debug)]
pub(crate) enum Durable {
    Live,
    Bytes(Vec<u8>),
}

/// How much of a pending log survives a cut: the first `ops` operations
/// whole, and of the next one (a write) its first `torn` bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Keep {
    pub ops: usize,
    pub torn: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct FileLog {
    pub durable: Durable,
    pub ops: Vec<FileOp>,
    /// Set while the FS is frozen at a sync point: how many of `ops` were
    /// pending then. Later operations can never become durable.
    pub frozen_len: Option<usize>,
    /// The live size, tracked so that a write needs no `fstat`.
    pub size: u64,
}

impl FileLog {
    pub fn new(size: u64, frozen: bool) -> Self {
        FileLog {
            durable: Durable::Live,
            ops: Vec::new(),
            frozen_len: frozen.then_some(0),
            size,
        }
    }

    pub fn write(&mut self, file: &File, off: u64, data: &[u8]) -> io::Result<()> {
        let pre = match self.durable {
            Durable::Live if off < self.size => {
                let n = (self.size - off).min(data.len() as u64) as usize;
                read_up_to(file, off, n)?
            }
            _ => Vec::new(),
        };
        let op = FileOp::Write {
            off,
            data: data.to_vec(),
            old_size: self.size,
            pre,
        };
        if let Err(e) = file.write_all_at(data, off) {
            // Leave the live file as it was, so the log still describes it.
            let _ = op.undo(&mut &*file, None);
            return Err(e);
        }
        self.size = self.size.max(off + data.len() as u64);
        self.ops.push(op);
        Ok(())
    }

    pub fn set_len(&mut self, file: &File, len: u64) -> io::Result<()> {
        let pre = match self.durable {
            Durable::Live if len < self.size => read_up_to(file, len, (self.size - len) as usize)?,
            _ => Vec::new(),
        };
        file.set_len(len)?;
        self.ops.push(FileOp::SetLen {
            len,
            old_size: self.size,
            pre,
        });
        self.size = len;
        Ok(())
    }

    /// A successful sync: everything pending becomes durable (unless the FS
    /// is frozen, when nothing does).
    pub fn commit(&mut self) -> io::Result<()> {
        if self.frozen_len.is_some() {
            return Ok(());
        }
        if let Durable::Bytes(bytes) = &mut self.durable {
            for op in &self.ops {
                op.redo(bytes, None)?;
            }
        }
        self.ops.clear();
        Ok(())
    }

    /// A failed sync: what was pending is lost for good (it never becomes
    /// durable), while the live file keeps showing it until the cut.
    pub fn poison(&mut self, file: &File) -> io::Result<()> {
        if let Durable::Live = self.durable {
            let mut bytes = read_up_to(file, 0, self.size as usize)?;
            for op in self.ops.iter().rev() {
                op.undo(&mut bytes, None)?;
            }
            self.durable = Durable::Bytes(bytes);
        }
        self.ops.clear();
        if self.frozen_len.is_some() {
            self.frozen_len = Some(0);
        }
        Ok(())
    }

    /// How many operations may survive a cut.
    pub fn candidates(&self) -> usize {
        self.frozen_len.unwrap_or(self.ops.len())
    }

    /// Makes the live file hold its durable content plus what `keep` keeps.
    pub fn apply_cut(&self, file: &File, keep: Keep) -> io::Result<()> {
        match &self.durable {
            Durable::Live => {
                let mut img = file;
                for i in (keep.ops..self.ops.len()).rev() {
                    let partial = if i == keep.ops { keep.torn } else { None };
                    self.ops[i].undo(&mut img, partial)?;
                }
                Ok(())
            }
            Durable::Bytes(bytes) => {
                let mut img = bytes.clone();
                for op in &self.ops[..keep.ops] {
                    op.redo(&mut img, None)?;
                }
                if let (Some(t), Some(op)) = (keep.torn, self.ops.get(keep.ops)) {
                    op.redo(&mut img, Some(t))?;
                }
                file.set_len(0)?;
                file.write_all_at(&img, 0)
            }
        }
    }
}

/// One atomic change to a directory: each name set to an inode or removed.
/// A rename within one directory is one change (atomic); a rename across
/// directories is one change in each.
pub(crate) type DirChange = Vec<(OsString, Option<Ino>)>;

/// A pending directory change, numbered across the whole mount. The
/// source half of a rename across directories names its other half
/// (`pair`): a cut keeps the removal only if it keeps the addition, so a
/// rename never loses its file (a journaling filesystem commits both
/// together; the two names may both survive, as on a filesystem without
/// a journal).
#[derive(Debug)]
pub(crate) struct DirOp {
    pub id: u64,
    pub change: DirChange,
    pub pair: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct DirLog {
    pub durable: BTreeMap<OsString, Ino>,
    pub ops: Vec<DirOp>,
    pub frozen_len: Option<usize>,
}

impl DirLog {
    pub fn new(durable: BTreeMap<OsString, Ino>, frozen: bool) -> Self {
        DirLog {
            durable,
            ops: Vec::new(),
            frozen_len: frozen.then_some(0),
        }
    }

    pub fn commit(&mut self) {
        if self.frozen_len.is_some() {
            return;
        }
        let ops = std::mem::take(&mut self.ops);
        for op in &ops {
            apply(&mut self.durable, &op.change);
        }
    }

    pub fn poison(&mut self) {
        self.ops.clear();
        if self.frozen_len.is_some() {
            self.frozen_len = Some(0);
        }
    }

    pub fn candidates(&self) -> usize {
        self.frozen_len.unwrap_or(self.ops.len())
    }

    /// The entries after a cut that keeps the first `keep` changes, less
    /// the rename halves whose other half the cut drops.
    pub fn after_cut(&self, keep: usize, dropped: &std::collections::HashSet<u64>) -> BTreeMap<OsString, Ino> {
        let mut entries = self.durable.clone();
        for op in &self.ops[..keep] {
            if op.pair.is_some_and(|p| dropped.contains(&p)) {
                continue;
            }
            apply(&mut entries, &op.change);
        }
        entries
    }
}

fn apply(entries: &mut BTreeMap<OsString, Ino>, change: &DirChange) {
    for (name, ino) in change {
        match ino {
            Some(ino) => entries.insert(name.clone(), *ino),
            None => entries.remove(name),
        };
    }
}
