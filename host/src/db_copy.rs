//! A copy of a SQLite database and its `-wal` and `-shm`, taken while
//! another process may still write to them: each file is read whole and
//! its inode, size and mtime compared before and after, so a copy that
//! raced a writer is refused rather than kept torn.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("no database at {0} (a db file, or a capture folder holding state.db)")]
    NoSource(PathBuf),
    #[error("{0} changed while it was being copied; try again when no process writes to it")]
    Changed(PathBuf),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CopyError {
    let context = context.into();
    move |source| CopyError::Io { context, source }
}

/// The source's main file and which sidecars exist.
fn source_files(source: &Path) -> Result<Vec<(PathBuf, &'static str)>, CopyError> {
    let main = if source.is_dir() {
        source.join("state.db")
    } else {
        source.to_path_buf()
    };
    if !main.is_file() {
        return Err(CopyError::NoSource(source.to_path_buf()));
    }
    let mut out = vec![(main.clone(), "state.db")];
    for (suffix, name) in [("-wal", "state.db-wal"), ("-shm", "state.db-shm")] {
        let mut p = main.as_os_str().to_owned();
        p.push(suffix);
        let p = PathBuf::from(p);
        if p.is_file() {
            out.push((p, name));
        }
    }
    Ok(out)
}

/// A file's inode, size and mtime: any write or replacement changes it.
pub(crate) type Fingerprint = (u64, u64, i64, i64);

pub(crate) fn fingerprint(p: &Path) -> Result<Fingerprint, CopyError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).map_err(io_err(format!("stat {}", p.display())))?;
    Ok((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// Copy the source into `work`, checking nothing changed during the copy.
pub fn copy_source(source: &Path, work: &Path) -> Result<Vec<Value>, CopyError> {
    let mut copied = Vec::new();
    for (path, name) in source_files(source)? {
        let before = fingerprint(&path)?;
        let data = std::fs::read(&path).map_err(io_err(format!("read {}", path.display())))?;
        let after = fingerprint(&path)?;
        if before != after || data.len() as u64 != after.1 {
            return Err(CopyError::Changed(path));
        }
        std::fs::write(work.join(name), &data).map_err(io_err(format!("copy {name}")))?;
        copied.push(
            json!({ "file": name, "from": path.to_string_lossy(), "size": data.len(),
                            "sha256": hex::encode(Sha256::digest(&data)) }),
        );
    }
    Ok(copied)
}
