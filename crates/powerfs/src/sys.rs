//! Thin, safe wrappers over the `*at` system calls the passthrough needs.
//!
//! Every call works relative to a descriptor the model holds for an inode,
//! never on a path under the mount: the FS must not call into itself.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)`.
pub fn openat(dir: RawFd, name: &OsStr, flags: i32, mode: u32) -> io::Result<File> {
    let name = cstr(name)?;
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn lstatat(dir: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let name = cstr(name)?;
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

/// `fstat(fd)`; works on `O_PATH` descriptors too.
pub fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let empty = c"";
    check(unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            empty.as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

pub fn mkdirat(dir: RawFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let name = cstr(name)?;
    check(unsafe { libc::mkdirat(dir, name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

pub fn mknodat(dir: RawFd, name: &OsStr, mode: u32, rdev: u64) -> io::Result<()> {
    let name = cstr(name)?;
    check(unsafe { libc::mknodat(dir, name.as_ptr(), mode as libc::mode_t, rdev) }).map(drop)
}

pub fn unlinkat(dir: RawFd, name: &OsStr, flags: i32) -> io::Result<()> {
    let name = cstr(name)?;
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(olddir: RawFd, old: &OsStr, newdir: RawFd, new: &OsStr, flags: u32) -> io::Result<()> {
    let old = cstr(old)?;
    let new = cstr(new)?;
    check(unsafe { libc::renameat2(olddir, old.as_ptr(), newdir, new.as_ptr(), flags) }).map(drop)
}

/// A new name for the inode behind `fd` (`AT_EMPTY_PATH` needs
/// CAP_DAC_READ_SEARCH, which root has). Fails with ENOENT for an inode
/// whose link count is zero, as `link(2)` does.
pub fn link_fd(fd: RawFd, newdir: RawFd, new: &OsStr) -> io::Result<()> {
    let new = cstr(new)?;
    let empty = c"";
    check(unsafe { libc::linkat(fd, empty.as_ptr(), newdir, new.as_ptr(), libc::AT_EMPTY_PATH) }).map(drop)
}

pub fn symlinkat(target: &OsStr, dir: RawFd, name: &OsStr) -> io::Result<()> {
    let target = cstr(target)?;
    let name = cstr(name)?;
    check(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) }).map(drop)
}

pub fn readlinkat(dir: RawFd, name: &OsStr) -> io::Result<OsString> {
    let name = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// `fchownat(fd, "", AT_EMPTY_PATH)`: works on every kind of descriptor.
pub fn fchown(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let empty = c"";
    let uid = uid.unwrap_or(u32::MAX);
    let gid = gid.unwrap_or(u32::MAX);
    check(unsafe {
        libc::fchownat(
            fd,
            empty.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// `fchmod`: works on files and on directories opened read-only (not on
/// `O_PATH` descriptors, which is why symlinks and specials skip it).
pub fn fchmod(fd: RawFd, mode: u32) -> io::Result<()> {
    check(unsafe { libc::fchmod(fd, (mode & 0o7777) as libc::mode_t) }).map(drop)
}

/// `futimens`; `None` leaves a time as it is.
pub fn futimens(fd: RawFd, atime: Option<libc::timespec>, mtime: Option<libc::timespec>) -> io::Result<()> {
    let omit = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    let times = [atime.unwrap_or(omit), mtime.unwrap_or(omit)];
    check(unsafe { libc::futimens(fd, times.as_ptr()) }).map(drop)
}

pub fn fstatvfs(fd: RawFd) -> io::Result<libc::statvfs> {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatvfs(fd, &mut st) })?;
    Ok(st)
}

/// The names in the directory behind `fd` (without `.` and `..`), sorted so
/// that a mount scans, and a seed draws, in the same order every time.
pub fn list_dir(fd: RawFd) -> io::Result<Vec<OsString>> {
    let mut names: Vec<OsString> = std::fs::read_dir(format!("/proc/self/fd/{fd}"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    Ok(names)
}

pub fn umount2(path: &std::path::Path, flags: i32) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    check(unsafe { libc::umount2(p.as_ptr(), flags) }).map(drop)
}

pub fn mount_fusectl(target: &std::path::Path) -> io::Result<()> {
    let t = cstr(target.as_os_str())?;
    check(unsafe {
        libc::mount(
            c"fusectl".as_ptr(),
            t.as_ptr(),
            c"fusectl".as_ptr(),
            0,
            std::ptr::null(),
        )
    })
    .map(drop)
}
