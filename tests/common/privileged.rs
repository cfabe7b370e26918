//! Fixtures that need root: an immutable file (`chattr +i`) and a small
//! tmpfs mount. Each undoes itself in `Drop`, which also runs while a
//! failing test unwinds. When the machine cannot do it, `new` says why, and
//! `skip_unless!` hands that reason to `turnsafe_tests::require`: a failure
//! under `CI=true`, otherwise a skip that the test command counts.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {:?}: {}",
            args,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `chattr +i` on a path, undone on drop.
pub struct Immutable {
    path: PathBuf,
}

impl Immutable {
    pub fn new(path: &Path) -> Result<Immutable, String> {
        run("chattr", &["+i".as_ref(), path.as_os_str()])?;
        Ok(Immutable {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = run("chattr", &["-i".as_ref(), self.path.as_os_str()]);
    }
}

/// A tmpfs of `size` mounted at `dir`, unmounted on drop.
pub struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    pub fn new(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        // The folder is the harness's own: failing to make it is a failure.
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let opts = format!("size={size},mode=0700");
        run(
            "mount",
            &[
                "-t".as_ref(),
                "tmpfs".as_ref(),
                "-o".as_ref(),
                opts.as_ref(),
                "tmpfs".as_ref(),
                dir.as_os_str(),
            ],
        )?;
        Ok(Tmpfs { dir: dir.to_path_buf() })
    }
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run("umount", &["-l".as_ref(), self.dir.as_os_str()]);
    }
}

/// Fill the filesystem holding `dir` until a write fails with ENOSPC.
pub fn fill(dir: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

/// The fixture, or a failure in CI, or a recorded skip (see `turnsafe_tests::require`).
#[macro_export]
macro_rules! skip_unless {
    ($e:expr) => {
        turnsafe_tests::require!($e)
    };
}
