//! Shared set-up for powerfs's self-tests.
#![allow(dead_code)]

use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use powerfs::PowerFs;

/// A powerfs mounted over a fresh temporary folder. Fields drop in order:
/// the mount goes before its folder.
pub struct Mounted {
    pub fs: PowerFs,
    pub dir: tempfile::TempDir,
}

impl Deref for Mounted {
    type Target = PowerFs;
    fn deref(&self) -> &PowerFs {
        &self.fs
    }
}

impl DerefMut for Mounted {
    fn deref_mut(&mut self) -> &mut PowerFs {
        &mut self.fs
    }
}

impl Mounted {
    /// A path under the mount.
    pub fn at(&self, rel: &str) -> PathBuf {
        self.fs.path().join(rel)
    }
}

pub fn mount() -> Mounted {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let fs = PowerFs::mount(dir.path().join("backing"), dir.path().join("mnt")).expect("mount");
    Mounted { fs, dir }
}

/// `fsync(2)` on a folder.
pub fn sync_dir(path: &Path) -> std::io::Result<()> {
    File::open(path)?.sync_all()
}

/// Writes a file and fsyncs it (not its folder).
pub fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let f = File::create(path)?;
    std::io::Write::write_all(&mut &f, data)?;
    f.sync_all()
}
