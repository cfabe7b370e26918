//! Small files written so a crash leaves either the old file or the whole
//! new one: a temporary name in the same folder, fsync, rename, fsync the
//! folder. Mode 0600, never through a symlink.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Create `dir` and its missing parents with `mode`, and make the path
/// durable: the parent of every folder created here is fsynced (an error
/// if it cannot be), and the parent of `dir` itself, whoever created it,
/// is fsynced too (best effort when `dir` was there already: its creator
/// may have died before its own fsync). Without it a power cut takes a
/// new home's entry in its parent, and every commit inside it with it:
/// SQLite fsyncs the folder its journal is in, never that folder's parent.
pub fn create_dir_all(dir: &Path, mode: u32) -> io::Result<()> {
    let parent_of = |p: &Path| match p.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let mut created = Vec::new();
    let mut p = dir;
    while std::fs::symlink_metadata(p).is_err() {
        created.push(p);
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent,
            _ => break,
        }
    }
    DirBuilder::new().recursive(true).mode(mode).create(dir)?;
    if created.is_empty() {
        let _ = crate::divert::sync_dir(&parent_of(dir));
    }
    for made in created.iter().rev() {
        crate::divert::sync_dir(&parent_of(made))?;
    }
    Ok(())
}

/// Write `data` to `path` atomically and durably.
pub fn write_file(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a file path needs a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    // A temporary file left by a crashed run of this same pid is stale.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    crate::divert::sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn replaces_whole_files_with_mode_0600_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("SETTLED");
        write_file(&path, b"first").unwrap();
        write_file(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["SETTLED"]);
    }

    #[test]
    fn creates_missing_folders_with_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("a/b/home");
        create_dir_all(&home, 0o700).unwrap();
        for p in [dir.path().join("a"), dir.path().join("a/b"), home.clone()] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", p.display());
        }
        // An existing folder is fine (its parent is fsynced again).
        create_dir_all(&home, 0o700).unwrap();
    }

    #[test]
    fn a_symlink_at_the_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep").unwrap();
        let path = dir.path().join("f");
        std::os::unix::fs::symlink(&target, dir.path().join(format!(".f.{}.tmp", std::process::id()))).unwrap();
        write_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }
}

#[cfg(test)]
#[path = "durable_tests.rs"]
mod more_tests;
