//! Faults on demand: a system call on a matching path fails with an errno.

use std::path::Path;

/// Which request a [`Fault`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// `fsync(2)` on a file (the FUSE fsync request without `datasync`).
    Fsync,
    /// `fdatasync(2)` on a file (the FUSE fsync request with `datasync`).
    Fdatasync,
    /// Either of [`FaultOp::Fsync`] and [`FaultOp::Fdatasync`].
    FileSync,
    /// `fsync(2)` on a directory (the FUSE fsyncdir request).
    DirSync,
    /// `write(2)`, `pwrite(2)`, and page-cache writeback of `mmap` writes.
    Write,
    /// A size change: `ftruncate(2)`, `truncate(2)`, `open(O_TRUNC)`.
    Truncate,
}

impl FaultOp {
    pub(crate) fn matches(self, op: FaultOp) -> bool {
        self == op || (self == FaultOp::FileSync && matches!(op, FaultOp::Fsync | FaultOp::Fdatasync))
    }
}

/// Which paths a [`Fault`] applies to. A path is relative to the mount
/// (`"db/state.db"`, the root is `""`) and is the name the FS last saw for
/// the inode (a file unlinked while open keeps its last name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    /// Every path.
    Any,
    /// Exactly this relative path.
    Exact(String),
    /// Paths that end with this string (`"-wal"`, `"state.db"`).
    Suffix(String),
    /// Paths that contain this string anywhere.
    Contains(String),
}

impl PathMatch {
    pub fn exact(s: impl Into<String>) -> Self {
        PathMatch::Exact(s.into())
    }
    pub fn suffix(s: impl Into<String>) -> Self {
        PathMatch::Suffix(s.into())
    }
    pub fn contains(s: impl Into<String>) -> Self {
        PathMatch::Contains(s.into())
    }

    pub(crate) fn matches(&self, path: &Path) -> bool {
        let p = path.to_string_lossy();
        match self {
            PathMatch::Any => true,
            PathMatch::Exact(s) => p == s.as_str(),
            PathMatch::Suffix(s) => p.ends_with(s.as_str()),
            PathMatch::Contains(s) => p.contains(s.as_str()),
        }
    }
}

/// When a [`Fault`] fires among the calls that match it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Only the Nth matching call (1-based).
    Nth(u64),
    /// Every matching call from the Nth on (1-based).
    From(u64),
    /// Every matching call.
    Every,
}

/// A planned failure: `op` on a path matching `path` fails with `errno`
/// at the calls chosen by `when`.
///
/// What a failure does besides returning the errno:
/// - a failed file sync drops the file's pending data for good (see the
///   crate docs: as Linux marks the pages clean after a writeback error);
/// - a failed directory sync drops the directory's pending entry changes;
/// - a failed write or truncate changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub op: FaultOp,
    pub path: PathMatch,
    pub when: When,
    pub errno: i32,
}

impl Fault {
    /// `op` fails with EIO on every call on a matching path.
    pub fn new(op: FaultOp, path: PathMatch) -> Self {
        Fault {
            op,
            path,
            when: When::Every,
            errno: libc::EIO,
        }
    }
    /// Fail only the Nth matching call (1-based).
    pub fn nth(mut self, n: u64) -> Self {
        self.when = When::Nth(n);
        self
    }
    /// Fail every matching call from the Nth on (1-based).
    pub fn from_nth(mut self, n: u64) -> Self {
        self.when = When::From(n);
        self
    }
    /// Fail with this errno (`libc::ENOSPC`, ...) instead of EIO.
    pub fn errno(mut self, errno: i32) -> Self {
        self.errno = errno;
        self
    }
}

/// The handle [`crate::PowerFs::inject`] returns, to ask how often a fault fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultId(pub(crate) usize);

#[derive(Debug)]
pub(crate) struct Armed {
    pub fault: Fault,
    pub seen: u64,
    pub fired: u64,
}

impl Armed {
    /// Counts a call that matches op and path; returns whether it fails.
    pub fn check(&mut self, op: FaultOp, path: &Path) -> Option<i32> {
        if !self.fault.op.matches(op) || !self.fault.path.matches(path) {
            return None;
        }
        self.seen += 1;
        let fire = match self.fault.when {
            When::Nth(n) => self.seen == n,
            When::From(n) => self.seen >= n,
            When::Every => true,
        };
        if fire {
            self.fired += 1;
            Some(self.fault.errno)
        } else {
            None
        }
    }
}
