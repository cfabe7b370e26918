//! `powerfs`: a filesystem for tests that forgets what was not synced.
//!
//! A FUSE passthrough over a backing folder, served by a child process the
//! test forks (an in-process daemon can deadlock against `munmap` of a
//! shared mapping on the mount; see `daemon.rs`). The backing folder
//! holds the *live* view (everything the flow wrote, synced or not), so
//! reads and shared `mmap` are plain passthrough. Beside it the FS keeps a strict durability model:
//!
//! - a file's written data and size changes are *pending* until that file
//!   is synced (`fsync` or `fdatasync`: both make data and size durable);
//! - a directory entry change (create, mkdir, mknod, symlink, link,
//!   unlink, rmdir, rename) is pending until that directory is synced; a
//!   new folder's own entries need its own sync *and* its name's durable
//!   entry in its parent;
//! - nothing else makes anything durable: no `syncfs`/`sync(2)`, no
//!   `close`, no rename heuristics (ext4's `auto_da_alloc`), no journal
//!   ordering between two files or two folders. This is stricter than any
//!   one local filesystem, on purpose.
//!
//! [`PowerFs::cut`] is the power loss: it unmounts, then rebuilds the
//! backing folder from the durable state plus whatever the [`CutMode`]
//! keeps of the pending state (nothing, everything, a torn prefix, or a
//! per-file all-or-nothing choice, drawn from a seed). A new mount then sees
//! only that.
//!
//! Handles follow inodes, not names: a file unlinked while open stays
//! readable and writable through its handle and `fstat` says `nlink == 0`;
//! inode numbers are the FS's own, stable for the life of a mount, and a
//! file replaced by a rename has a new one. Locks are the kernel's own
//! local locks. Faults ([`Fault`]) fail chosen syncs, writes and truncates
//! with an errno; every sync request is counted and logged, and
//! [`PowerFs::cut_at_sync`] freezes the durable state at sync point N.
//!
//! Needs root and `/dev/fuse` ([`PowerFs::available`] says why not). See
//! `docs/POWERFS.md` for the full contract and an example.

mod cut;
mod daemon;
mod fault;
mod fs;
mod log;
mod model;
mod sys;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

pub use cut::{CutMode, CutReport};
pub use fault::{Fault, FaultId, FaultOp, PathMatch, When};
pub use model::{SyncKind, SyncPoint};

use daemon::Daemon;

/// How long a mount, an unmount (with its rebuild) or one question to the
/// daemon may take before the FS says it hung.
const SESSION_END: Duration = Duration::from_secs(10);

/// What went wrong mounting, cutting or unmounting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("powerfs: {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "powerfs: the backing folder {} and the mount point {} must not be one inside the other",
        backing.display(), mountpoint.display()
    )]
    Nested { backing: PathBuf, mountpoint: PathBuf },
    #[error("powerfs: {0} is not mounted")]
    NotMounted(PathBuf),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error + use<> {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
}

/// A mounted powerfs (or one between a cut and its remount).
///
/// The FUSE daemon runs in a child process (see `daemon.rs` for why: an
/// in-process daemon can deadlock against `munmap` of a shared mapping).
/// Dropping a `PowerFs` unmounts (lazily, and aborting the FUSE connection,
/// if files are still open) without a cut: the backing folder keeps the
/// live view.
pub struct PowerFs {
    backing: PathBuf,
    mountpoint: PathBuf,
    daemon: Mutex<Option<Daemon>>,
    /// The FUSE connection's number under `/sys/fs/fuse/connections`.
    conn: u64,
}

impl std::fmt::Debug for PowerFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerFs")
            .field("backing", &self.backing)
            .field("mountpoint", &self.mountpoint)
            .field("mounted", &self.is_mounted())
            .finish()
    }
}

impl PowerFs {
    /// Whether this process can mount a powerfs: `Err` says why not (not
    /// root, no `/dev/fuse`, or the mount itself failed and with what).
    /// The answer is worked out once per process, by a real mount.
    pub fn available() -> Result<(), String> {
        static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
        ANSWER.get_or_init(probe).clone()
    }

    /// Mounts a powerfs at `mountpoint` over `backing` (both created if
    /// missing). Everything already in `backing` counts as durable.
    pub fn mount(backing: impl AsRef<Path>, mountpoint: impl AsRef<Path>) -> Result<PowerFs, Error> {
        let (backing, mountpoint) = (backing.as_ref(), mountpoint.as_ref());
        for dir in [backing, mountpoint] {
            std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        }
        let backing = backing.canonicalize().map_err(io_err("resolve", backing))?;
        let mountpoint = mountpoint.canonicalize().map_err(io_err("resolve", mountpoint))?;
        if backing.starts_with(&mountpoint) || mountpoint.starts_with(&backing) {
            return Err(Error::Nested { backing, mountpoint });
        }
        let mut fs = PowerFs {
            backing,
            mountpoint,
            daemon: Mutex::new(None),
            conn: 0,
        };
        fs.start()?;
        Ok(fs)
    }

    fn start(&mut self) -> Result<(), Error> {
        let daemon =
            Daemon::spawn(&self.backing, &self.mountpoint, SESSION_END).map_err(io_err("mount", &self.mountpoint))?;
        *self.daemon.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(daemon);
        let st = std::fs::File::open(&self.mountpoint)
            .and_then(|f| sys::fstat(&f))
            .map_err(io_err("stat", &self.mountpoint))?;
        // fusectl names a connection by the kernel's dev_t: (major << 20) | minor.
        self.conn = (u64::from(libc::major(st.st_dev)) << 20) | u64::from(libc::minor(st.st_dev));
        Ok(())
    }

    /// Where the FS is mounted: run the flow under this folder.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The backing folder (the live view while mounted, the durable image
    /// after a cut). Do not touch it while mounted.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    pub fn is_mounted(&self) -> bool {
        self.daemon.lock().map(|d| d.is_some()).unwrap_or(false)
    }

    /// Asks the daemon something. A question to a mount that is gone, or a
    /// daemon that stopped answering, is a bug in the test: it panics.
    fn ask<T>(&self, what: &str, f: impl FnOnce(&mut Daemon) -> io::Result<T>) -> T {
        let mut guard: MutexGuard<'_, Option<Daemon>> = self.daemon.lock().unwrap_or_else(|p| p.into_inner());
        let Some(daemon) = guard.as_mut() else {
            panic!("powerfs: {what}: {} is not mounted", self.mountpoint.display());
        };
        f(daemon).unwrap_or_else(|e| {
            panic!(
                "powerfs: {what}: the daemon for {} failed: {e}",
                self.mountpoint.display()
            )
        })
    }

    /// Plans a power loss at sync point `n` (1-based, in arrival order):
    /// the durable state freezes right before sync `n` takes effect, so
    /// neither it nor anything after it becomes durable. Every later
    /// request is still served (the flow runs on, unknowing) until
    /// [`PowerFs::cut`]. Reset by a remount.
    pub fn cut_at_sync(&self, n: u64) {
        self.ask("cut_at_sync", |d| d.cut_at_sync(n))
    }

    /// How many sync requests (fsync, fdatasync, directory fsync) this
    /// mount has received so far.
    pub fn sync_count(&self) -> u64 {
        self.ask("sync_count", Daemon::sync_count)
    }

    /// Every sync request this mount received, in order.
    pub fn sync_points(&self) -> Vec<SyncPoint> {
        self.ask("sync_points", Daemon::sync_points)
    }

    /// The sync point the durable state froze at, once reached.
    pub fn frozen_at(&self) -> Option<SyncPoint> {
        self.ask("frozen_at", Daemon::frozen_at)
    }

    /// Arms a fault for this mount (reset by a remount).
    pub fn inject(&self, fault: Fault) -> FaultId {
        FaultId(self.ask("inject", |d| d.inject(&fault)))
    }

    /// How many calls the fault has failed so far.
    pub fn fault_fired(&self, id: FaultId) -> u64 {
        self.ask("fault_fired", |d| d.fault_fired(id.0))
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.ask("clear_faults", Daemon::clear_faults)
    }

    /// The power loss: unmounts (open handles on the mount fail from now
    /// on) and rebuilds the backing folder from the durable state plus what
    /// `mode` keeps of the pending state. [`PowerFs::remount`] then shows
    /// what survived.
    pub fn cut(&mut self, mode: CutMode) -> Result<CutReport, Error> {
        if !self.is_mounted() {
            return Err(Error::NotMounted(self.mountpoint.clone()));
        }
        self.ask("cut", |d| d.plan_cut(mode));
        let report = self.stop()?;
        report.ok_or_else(|| Error::Io {
            what: "rebuild",
            path: self.backing.clone(),
            source: io::Error::other("the daemon ended without a report"),
        })
    }

    /// Mounts again over the same backing folder, with a fresh model (all
    /// of the backing folder durable, no faults, no planned cut, sync count
    /// zero). Inode numbers start again.
    pub fn remount(&mut self) -> Result<(), Error> {
        if self.is_mounted() {
            self.stop()?;
        }
        self.start()
    }

    /// Unmounts without a cut: the backing folder keeps the live view.
    pub fn unmount(&mut self) -> Result<(), Error> {
        if !self.is_mounted() {
            return Err(Error::NotMounted(self.mountpoint.clone()));
        }
        self.stop().map(drop)
    }

    /// Unmounts and waits for the daemon's last word and exit. A busy
    /// mount (a file still open) is detached and its connection aborted, as
    /// a power loss would: the open handles then fail with ENOTCONN.
    fn stop(&mut self) -> Result<Option<CutReport>, Error> {
        let Some(daemon) = self.daemon.get_mut().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(None);
        };
        match sys::umount2(&self.mountpoint, 0) {
            Ok(()) => {}
            // EINVAL: no longer mounted (someone unmounted it already).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(_) => {
                let _ = sys::umount2(&self.mountpoint, libc::MNT_DETACH);
                let _ = abort_connection(self.conn);
            }
        }
        daemon.finish(SESSION_END).map_err(io_err("unmount", &self.mountpoint))
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("{e}");
            // Last resort: do not leave a mount behind.
            let _ = sys::umount2(&self.mountpoint, libc::MNT_DETACH);
        }
    }
}

/// Writes to `/sys/fs/fuse/connections/<conn>/abort`, mounting fusectl
/// there first if it is not.
fn abort_connection(conn: u64) -> io::Result<()> {
    let base = Path::new("/sys/fs/fuse/connections");
    let abort = base.join(conn.to_string()).join("abort");
    if !abort.exists() {
        let _ = sys::mount_fusectl(base);
    }
    std::fs::write(abort, b"1")
}

fn probe() -> Result<(), String> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("powerfs needs root (it mounts FUSE with mount(2))".into());
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Err(format!("powerfs needs /dev/fuse: {e}"));
    }
    let dir = std::env::temp_dir().join(format!("powerfs-probe-{}", std::process::id()));
    let result = (|| {
        let mut fs = PowerFs::mount(dir.join("backing"), dir.join("mnt")).map_err(|e| e.to_string())?;
        let probe = fs.path().join("probe");
        std::fs::write(&probe, b"probe")
            .and_then(|_| std::fs::File::open(&probe)?.sync_all())
            .map_err(|e| format!("powerfs: a write on the probe mount failed: {e}"))?;
        fs.unmount().map_err(|e| e.to_string())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
