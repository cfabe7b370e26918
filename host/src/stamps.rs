//! Whether a file or folder changed since it was last looked at, told by
//! its change stamps: what lets the probes before a commit skip a read
//! when nothing moved, without ever missing a change.
//!
//! A stamp is a file's identity and link count with its `mtime` and
//! `ctime` (a folder's link count moves with its subfolders even where a
//! filesystem's clock does not). No process
//! can set a `ctime`: any write, rename into or out of a folder, link or
//! attribute change moves it to the kernel's clock. So an equal stamp
//! means nothing changed, with one exception: a change within the same
//! tick of a coarse clock (some kernels and filesystems stamp in jiffies,
//! some in whole seconds) leaves the stamp as it was. A stamp read while
//! it is that young is *racy* and proves nothing; only a stamp older than
//! [`RACY`] when it was read may stand for what was read after it.

use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, StatxFlags};

/// How old a stamp must be, when read, to prove that a later change
/// moves it, on a filesystem this module does not know: above the
/// coarsest timestamp granularity of a local or network filesystem (FAT's
/// two seconds).
pub const RACY: Duration = Duration::from_secs(3);

/// The same on the local filesystems that stamp from the kernel's clock,
/// whose tick is at most 10 ms (`HZ` 100): ext4, XFS, Btrfs, F2FS, tmpfs.
pub const RACY_LOCAL: Duration = Duration::from_millis(50);

/// `statfs` magic numbers of the filesystems [`RACY_LOCAL`] holds for.
const LOCAL: [i64; 5] = [
    0xEF53,      // ext2/3/4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0xF2F5_2010, // F2FS
    0x0102_1994, // tmpfs
];

/// The racy window for stamps of files on the filesystem that holds
/// `path`: [`RACY_LOCAL`] on a filesystem known to stamp from the kernel's
/// clock, [`RACY`] on any other or when it cannot be told.
// `f_type` is an `i64` here and narrower on other targets.
#[allow(clippy::unnecessary_cast)]
pub fn racy_for(path: &Path) -> Duration {
    match rustix::fs::statfs(path) {
        Ok(st) if LOCAL.contains(&(st.f_type as i64)) => RACY_LOCAL,
        _ => RACY,
    }
}

/// A file's identity and change times, nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub nlink: u32,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

const WANT: StatxFlags = StatxFlags::INO
    .union(StatxFlags::NLINK)
    .union(StatxFlags::MTIME)
    .union(StatxFlags::CTIME);

/// A statx timestamp in nanoseconds since the epoch.
pub fn ns(t: rustix::fs::StatxTimestamp) -> i128 {
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

impl Stamp {
    fn of(st: &rustix::fs::Statx) -> Stamp {
        Stamp {
            dev: rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
            nlink: st.stx_nlink,
            mtime_ns: ns(st.stx_mtime),
            ctime_ns: ns(st.stx_ctime),
        }
    }

    /// The stamp of what is at `path` (not following a final symlink:
    /// the link itself is what a folder listing sees), `None` when
    /// nothing is there.
    pub fn at(path: &Path) -> io::Result<Option<Stamp>> {
        match rustix::fs::statx(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW, WANT) {
            Ok(st) => Ok(Some(Stamp::of(&st))),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The stamp of the file `fd` holds.
    pub fn of_fd(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Stamp> {
        let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, WANT)?;
        Ok(Stamp::of(&st))
    }

    /// Whether this stamp, read at `read_at`, was more than `racy` old
    /// then, so that any later change must move it ([`RACY`] but in tests).
    pub fn settled_at(&self, read_at: SystemTime, racy: Duration) -> bool {
        settled(self.mtime_ns.max(self.ctime_ns), read_at, racy)
    }
}

/// Whether a time stamp `stamp_ns`, read at `read_at`, was more than
/// `racy` old then.
pub fn settled(stamp_ns: i128, read_at: SystemTime, racy: Duration) -> bool {
    let now = read_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
    now.saturating_sub(stamp_ns) > i128::try_from(racy.as_nanos()).unwrap_or(i128::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_moves_with_a_write_a_rename_into_its_folder_and_a_chmod() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"a").unwrap();
        let before = (
            Stamp::at(dir.path()).unwrap().unwrap(),
            Stamp::at(&file).unwrap().unwrap(),
        );
        // Past any coarse clock's tick, so each change lands on a later one.
        std::thread::sleep(Duration::from_millis(30));
        std::fs::write(&file, b"b").unwrap();
        assert_ne!(Stamp::at(&file).unwrap().unwrap(), before.1);
        assert_eq!(
            Stamp::at(dir.path()).unwrap().unwrap(),
            before.0,
            "a write moves no folder"
        );
        std::fs::write(dir.path().join("g.tmp"), b"").unwrap();
        std::fs::rename(dir.path().join("g.tmp"), dir.path().join("g")).unwrap();
        assert_ne!(Stamp::at(dir.path()).unwrap().unwrap(), before.0);
        let file_now = Stamp::at(&file).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        assert_ne!(
            Stamp::at(&file).unwrap().unwrap(),
            file_now,
            "an attribute change moves the ctime"
        );
        let folder = Stamp::at(dir.path()).unwrap().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert_eq!(
            Stamp::at(dir.path()).unwrap().unwrap().nlink,
            folder.nlink + 1,
            "a subfolder moves the link count, whatever the clock"
        );
        assert_eq!(Stamp::at(&dir.path().join("absent")).unwrap(), None);
    }

    #[test]
    #[allow(clippy::unnecessary_cast)]
    fn the_racy_window_is_short_only_where_the_filesystem_is_known() {
        let dir = tempfile::tempdir().unwrap();
        let kind = rustix::fs::statfs(dir.path()).unwrap().f_type as i64;
        let want = if LOCAL.contains(&kind) { RACY_LOCAL } else { RACY };
        assert_eq!(racy_for(dir.path()), want);
        if std::path::Path::new("/dev/shm").is_dir()
            && rustix::fs::statfs("/dev/shm").unwrap().f_type as i64 == 0x0102_1994
        {
            assert_eq!(racy_for(Path::new("/dev/shm")), RACY_LOCAL);
        }
        assert_eq!(
            racy_for(&dir.path().join("absent")),
            RACY,
            "what cannot be told is the long window"
        );
        assert_eq!(
            racy_for(Path::new("/proc/self")),
            RACY,
            "procfs is no filesystem of the list"
        );
    }

    #[test]
    fn a_young_stamp_is_racy_and_an_old_one_is_settled() {
        let dir = tempfile::tempdir().unwrap();
        let s = Stamp::at(dir.path()).unwrap().unwrap();
        let now = SystemTime::now();
        assert!(!s.settled_at(now, RACY), "a folder made just now is racy");
        assert!(s.settled_at(now + RACY + Duration::from_millis(10), RACY));
        assert!(
            !s.settled_at(UNIX_EPOCH, RACY),
            "a clock before the stamp settles nothing"
        );
    }
}
