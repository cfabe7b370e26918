//! The FUSE request handlers: a passthrough to the backing folder that
//! records, in the model, every change and every sync.
//!
//! Locks (`flock`, POSIX `fcntl`) are deliberately not implemented: the
//! kernel then keeps them locally, exactly as on a local filesystem.
//! Opens keep the page cache (no `direct_io`), so shared `mmap` works; the
//! writeback cache is not requested, so every `write(2)` reaches the FS
//! before it returns.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::fault::FaultOp;
use crate::log::{DirLog, FileLog};
use crate::model::{Ino, Kind, Model, ROOT, SyncKind, kind_of};
use crate::sys;

/// How long the kernel may cache entries and attributes. Every change goes
/// through this FS, so the kernel's own invalidation keeps them right.
const TTL: Duration = Duration::from_secs(1);

pub(crate) struct PowerFsImpl {
    pub model: Arc<Mutex<Model>>,
}

fn errno(e: io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH
    }
}

fn file_type(mode: libc::mode_t) -> FileType {
    match kind_of(mode) {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn attr_of(model: &Model, ino: Ino) -> io::Result<FileAttr> {
    let st = sys::fstat(&model.node(ino)?.file)?;
    Ok(FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    })
}

fn timespec(t: TimeOrNow) -> libc::timespec {
    match t {
        TimeOrNow::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        TimeOrNow::SpecificTime(t) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            }
        }
    }
}

impl PowerFsImpl {
    fn lock(&self) -> MutexGuard<'_, Model> {
        // A panic in one handler must not wedge the mount for the test.
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, m: &Model, ino: Ino, reply: ReplyEntry) {
        match attr_of(m, ino) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Creates a regular file `name` in `parent`; `Ok(None)` if it exists.
    fn create_file(m: &mut Model, parent: Ino, name: &OsStr, mode: u32) -> io::Result<Option<Ino>> {
        let dir = m.dir_file(parent)?.as_raw_fd();
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW;
        let file = match sys::openat(dir, name, flags, mode) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(None),
            Err(e) => return Err(e),
        };
        let ino = m.insert(file, parent, name, Kind::File(FileLog::new(0, false)))?;
        m.dir_change(parent, vec![(name.to_owned(), Some(ino))])?;
        Ok(Some(ino))
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, flags: i32, reply: ReplyEmpty) {
        let mut m = self.lock();
        let r = (|| {
            let dir = m.dir_file(parent.0)?.as_raw_fd();
            sys::unlinkat(dir, name, flags)?;
            m.dir_change(parent.0, vec![(name.to_owned(), None)]).map(drop)
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn sync(&self, ino: INodeNo, kind: SyncKind, reply: ReplyEmpty) {
        match self.lock().sync(ino.0, kind) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }
}

impl Filesystem for PowerFsImpl {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut m = self.lock();
        match m.lookup(parent.0, name) {
            Ok(ino) => self.entry(&m, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = self.lock();
        match attr_of(&m, ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut m = self.lock();
        let r = (|| {
            if let Some(size) = size {
                if let Some(e) = m.fault(FaultOp::Truncate, ino.0) {
                    return Err(io::Error::from_raw_os_error(e));
                }
                let node = m.node_mut(ino.0)?;
                match &mut node.kind {
                    Kind::File(log) => log.set_len(&node.file, size)?,
                    Kind::Dir(_) => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
                    _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
                }
            }
            let node = m.node(ino.0)?;
            let fd = node.file.as_raw_fd();
            let has_content = matches!(node.kind, Kind::File(_) | Kind::Dir(_));
            if let (Some(mode), true) = (mode, has_content) {
                sys::fchmod(fd, mode)?;
            }
            if uid.is_some() || gid.is_some() {
                sys::fchown(fd, uid, gid)?;
            }
            if (atime.is_some() || mtime.is_some()) && has_content {
                sys::futimens(fd, atime.map(timespec), mtime.map(timespec))?;
            }
            attr_of(&m, ino.0)
        })();
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let m = self.lock();
        match m.node(ino.0).map(|n| &n.kind) {
            Ok(Kind::Symlink(target)) => {
                use std::os::unix::ffi::OsStrExt;
                reply.data(target.as_bytes())
            }
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mut m = self.lock();
        let perm = mode & !umask & 0o7777;
        let r = (|| {
            if kind_of(mode as libc::mode_t) == libc::S_IFREG {
                return Self::create_file(&mut m, parent.0, name, perm)?
                    .ok_or_else(|| io::Error::from_raw_os_error(libc::EEXIST));
            }
            let dir = m.dir_file(parent.0)?.as_raw_fd();
            sys::mknodat(dir, name, (mode & libc::S_IFMT) | perm, rdev as u64)?;
            let file = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            let ino = m.insert(file, parent.0, name, Kind::Special)?;
            m.dir_change(parent.0, vec![(name.to_owned(), Some(ino))])?;
            Ok(ino)
        })();
        match r {
            Ok(ino) => self.entry(&m, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut m = self.lock();
        let r = (|| {
            let dir = m.dir_file(parent.0)?.as_raw_fd();
            sys::mkdirat(dir, name, mode & !umask & 0o7777)?;
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            let file = sys::openat(dir, name, flags, 0)?;
            // A new directory's own entries start empty and pending.
            let kind = Kind::Dir(DirLog::new(Default::default(), false));
            let ino = m.insert(file, parent.0, name, kind)?;
            m.dir_change(parent.0, vec![(name.to_owned(), Some(ino))])?;
            Ok(ino)
        })();
        match r {
            Ok(ino) => self.entry(&m, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, 0, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, libc::AT_REMOVEDIR, reply)
    }

    fn symlink(&self, _req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        let mut m = self.lock();
        let r = (|| {
            let dir = m.dir_file(parent.0)?.as_raw_fd();
            sys::symlinkat(target.as_os_str(), dir, link_name)?;
            let file = sys::openat(dir, link_name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            let kind = Kind::Symlink(target.as_os_str().to_owned());
            let ino = m.insert(file, parent.0, link_name, kind)?;
            m.dir_change(parent.0, vec![(link_name.to_owned(), Some(ino))])?;
            Ok(ino)
        })();
        match r {
            Ok(ino) => self.entry(&m, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut m = self.lock();
        let r = (|| {
            let (p, np) = (parent.0, newparent.0);
            let src = m
                .peek(p, name)?
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
            let dst = m.peek(np, newname)?;
            let (pfd, npfd) = (m.dir_file(p)?.as_raw_fd(), m.dir_file(np)?.as_raw_fd());
            sys::renameat2(pfd, name, npfd, newname, flags.bits())?;
            if dst == Some(src) && !flags.contains(RenameFlags::RENAME_EXCHANGE) {
                // Two names of one inode: rename(2) does nothing.
                return Ok(());
            }
            let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
            let back = if exchange { dst } else { None };
            if p == np {
                // Within one directory a rename is one atomic change.
                m.dir_change(p, vec![(name.to_owned(), back), (newname.to_owned(), Some(src))])?;
            } else {
                let added = m.dir_change(np, vec![(newname.to_owned(), Some(src))])?;
                m.dir_change_paired(p, vec![(name.to_owned(), back)], Some(added))?;
            }
            let node = m.node_mut(src)?;
            node.parent = np;
            node.name = newname.to_owned();
            if let (true, Some(d)) = (exchange, dst) {
                let node = m.node_mut(d)?;
                node.parent = p;
                node.name = name.to_owned();
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let mut m = self.lock();
        let r = (|| {
            let fd = m.node(ino.0)?.file.as_raw_fd();
            let dir = m.dir_file(newparent.0)?.as_raw_fd();
            sys::link_fd(fd, dir, newname)?;
            m.dir_change(newparent.0, vec![(newname.to_owned(), Some(ino.0))])
                .map(drop)
        })();
        match r {
            Ok(()) => self.entry(&m, ino.0, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let m = self.lock();
        match m.node(ino.0) {
            // Handles are tokens: all I/O goes through the inode's own
            // descriptor, so a handle follows its inode whatever its names.
            // KEEP_CACHE: every change goes through here, so the page cache
            // stays right, and mmap'd pages survive another open.
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let m = self.lock();
        let r = m
            .node(ino.0)
            .and_then(|n| crate::log::read_up_to(&n.file, offset, size as usize));
        match r {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut m = self.lock();
        let r = (|| {
            if let Some(e) = m.fault(FaultOp::Write, ino.0) {
                return Err(io::Error::from_raw_os_error(e));
            }
            let node = m.node_mut(ino.0)?;
            match &mut node.kind {
                Kind::File(log) => log.write(&node.file, offset, data),
                _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        })();
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lo: LockOwner, reply: ReplyEmpty) {
        reply.ok()
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let kind = if datasync { SyncKind::Fdatasync } else { SyncKind::Fsync };
        self.sync(ino, kind, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // A real handle, so the kernel sends fsyncdir for it.
        match self.lock().open_listing(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let m = self.lock();
        let Some(listing) = m.listings.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, mode, name)) in listing.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, file_type(*mode), name) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.lock().listings.remove(&fh.0);
        reply.ok()
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync(ino, SyncKind::DirSync, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let m = self.lock();
        let r = m.node(ROOT).and_then(|n| sys::fstatvfs(n.file.as_raw_fd()));
        match r {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Mounted with default_permissions: the kernel checks modes itself.
        reply.ok()
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut m = self.lock();
        let r = (|| {
            if let Some(ino) = Self::create_file(&mut m, parent.0, name, mode & !umask & 0o7777)? {
                return Ok(ino);
            }
            if flags & libc::O_EXCL != 0 {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            // O_CREAT on a name that exists: an open of that file.
            m.lookup(parent.0, name)
        })();
        match r.and_then(|ino| Ok((ino, attr_of(&m, ino)?))) {
            Ok((_, attr)) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Only plain preallocation: it may extend the size, which is then
        // a pending size change like any other.
        if mode != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let mut m = self.lock();
        let r = (|| {
            let node = m.node_mut(ino.0)?;
            match &mut node.kind {
                Kind::File(log) if offset + length > log.size => log.set_len(&node.file, offset + length),
                Kind::File(_) => Ok(()),
                _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }
}
