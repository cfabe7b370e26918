//! Capture of a retired WAL generation: the files the handle still holds
//! (main image, WAL, shm) are copied through the held descriptors, chosen
//! by identity, never by path, into
//! `<home>/state.db.retired-<yyyymmddThhmmssZ>-<pid>/` with a manifest.
//! Each file goes to a temporary name, is fsynced and renamed; then the
//! folder is fsynced. Nothing is ever merged back automatically.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};
use turnsafe_policy::CapturedFile;

use crate::divert::sync_dir;
use crate::guard::{Guard, Part};

/// A finished capture: the policy's receipt type, so the copy can name it.
pub use turnsafe_policy::CaptureReceipt as Capture;

/// Why a capture was made, as its manifest records it: `doctor`, replay's
/// refusal and every copy that names the capture take its cause from
/// there, never from a guess.
#[derive(Debug, Clone)]
pub struct Why {
    /// The failure or the check that asked for it (for the operator).
    pub trigger: String,
    /// The policy's cause: `deleted_wal`, `replaced`, or the sticky cause
    /// (`corrupt`) of a handle that closed.
    pub cause: turnsafe_policy::Cause,
    /// The typed evidence the cause rests on (none for a code).
    pub evidence: Vec<turnsafe_policy::Evidence>,
}

/// A capture that did not finish. `operation` is one of the policy's
/// [`turnsafe_policy::KNOWN_CAPTURE_OPS`]; `file` names the captured file
/// the step was working on, never a path.
#[derive(Debug, Clone, thiserror::Error)]
#[error("capture of the retired generation failed at {operation}{}: {message}", file.as_deref().map(|f| format!(" {f}")).unwrap_or_default())]
pub struct CaptureError {
    pub operation: &'static str,
    pub file: Option<String>,
    pub errno: Option<i64>,
    pub message: String,
}

impl CaptureError {
    fn io(operation: &'static str, file: Option<&str>, e: &io::Error) -> CaptureError {
        CaptureError {
            operation,
            file: file.map(String::from),
            errno: e.raw_os_error().map(i64::from),
            message: e.to_string(),
        }
    }

    /// What the copy may say of it: the step and the errno.
    pub fn to_failure(&self) -> turnsafe_policy::CaptureFailure {
        turnsafe_policy::CaptureFailure {
            operation: self.operation.to_string(),
            errno: self.errno,
        }
    }

    /// The outcome's `capture` object for a failed capture.
    pub fn to_value(&self) -> serde_json::Value {
        json!({
            "error": self.to_string(),
            "operation": self.operation,
            "errno": self.errno,
        })
    }
}

fn err(operation: &'static str, file: Option<&str>) -> impl FnOnce(io::Error) -> CaptureError {
    let file = file.map(String::from);
    move |e| CaptureError::io(operation, file.as_deref(), &e)
}

/// Read a whole file through a held descriptor. A short read is an error.
fn read_through(fd: RawFd) -> io::Result<Vec<u8>> {
    // SAFETY: the descriptor is held by this process's SQLite connection.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let size = rustix::fs::fstat(b)?.st_size as usize;
    read_exactly(fd, size)
}

/// Read `size` bytes from offset 0, or fail loudly: a capture that is
/// shorter than the file it claims to hold must never be written.
fn read_exactly(fd: RawFd, size: usize) -> io::Result<Vec<u8>> {
    // SAFETY: as above; the caller holds the descriptor open.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        let n = rustix::io::pread(b, &mut buf[done..], done as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short read: {done} of {size} bytes through fd {fd}"),
            ));
        }
        done += n;
    }
    Ok(buf)
}

fn write_durably(dir: &Path, name: &str, data: &[u8]) -> Result<(), CaptureError> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(err("create", Some(name)))?;
    f.write_all(data).map_err(err("write", Some(name)))?;
    f.sync_all().map_err(err("fsync", Some(name)))?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name)).map_err(err("rename", Some(name)))
}

/// Make `state.db.retired-<UTC>-<holder>/`. Two captures of one holder in
/// the same second (`turnsafe capture --pid`, then the writer's own at
/// close) get `<UTC>.<n>-<holder>`: a folder that exists is never reused.
fn new_capture_dir(parent: &Path, holder: u32) -> Result<PathBuf, CaptureError> {
    let stamp = utc_stamp();
    let mut last = None;
    for n in 1..=64u32 {
        let name = match n {
            1 => format!("state.db.retired-{stamp}-{holder}"),
            n => format!("state.db.retired-{stamp}.{n}-{holder}"),
        };
        let dir = parent.join(name);
        match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(CaptureError::io("mkdir", None, &e)),
        }
    }
    let e = last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists));
    Err(CaptureError::io("mkdir", None, &e))
}

/// UTC now as `yyyymmddThhmmssZ`, for the dated names of set-aside files.
pub(crate) fn utc_stamp() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .replace(['-', ':'], "")
}

/// One file of a capture, read through a descriptor that holds it.
pub(crate) struct HeldFile {
    /// `state.db`, `state.db-wal` or `state.db-shm`.
    pub name: String,
    pub data: Vec<u8>,
    pub id: crate::guard::FileId,
    /// The descriptor it was read through, in the holder's process.
    pub fd: RawFd,
}

/// Capture what the guard recorded into a new folder next to the db. The
/// receipt exists only once every file, the manifest and both folders
/// were fsynced.
pub fn capture(guard: &Guard, why: &Why) -> Result<Capture, CaptureError> {
    let mut files = Vec::new();
    for part in Part::ALL {
        let Some(held) = guard.held(part) else { continue };
        let Some(fd) = held.fd else { continue };
        let name = format!("state.db{}", part.suffix());
        let data = read_through(fd).map_err(err("read", Some(&name)))?;
        files.push(HeldFile {
            name,
            data,
            id: held.id,
            fd,
        });
    }
    let pid = std::process::id();
    write_capture(guard.db_path(), pid, Some(guard.generation()), why, files)
}

/// Write `files` into `<db's folder>/state.db.retired-<UTC>-<holder>/`,
/// each to a temporary name, fsynced and renamed, then the manifest (what
/// it holds that the database now at `db` lacks, why it was made, who held
/// the frames), then both folders fsynced. `holder` is the process whose
/// descriptors hold the retired generation.
pub(crate) fn write_capture(
    db: &Path,
    holder: u32,
    generation: Option<i32>,
    why: &Why,
    files: Vec<HeldFile>,
) -> Result<Capture, CaptureError> {
    let parent = db.parent().unwrap_or(Path::new("."));
    crate::failpoint::hit("capture.before_mkdir");
    let dir = new_capture_dir(parent, holder)?;
    let mut receipt_files = Vec::new();
    let mut manifest_files = Vec::new();
    for f in &files {
        crate::failpoint::hit("capture.before_write");
        write_durably(&dir, &f.name, &f.data)?;
        manifest_files.push(json!({
            "name": f.name,
            "dev": f.id.dev,
            "ino": f.id.ino,
            "fd": f.fd,
            "size": f.data.len(),
            "sha256": hex::encode(Sha256::digest(&f.data)),
        }));
        receipt_files.push(CapturedFile {
            name: f.name.clone(),
            size: f.data.len() as u64,
        });
    }
    drop(files);
    // Which sessions this capture holds rows of that the database now at
    // the path lacks: a pending capture stops exactly their history.
    let missing = crate::capture_holds::missing_rows(&dir, db);
    let (missing_rows, missing_error) = match &missing {
        Ok(by_session) => (json!(by_session), serde_json::Value::Null),
        Err(e) => (serde_json::Value::Null, json!(e)),
    };
    let manifest = json!({
        "format": 1,
        "trigger": why.trigger,
        "cause": why.cause.label(),
        "evidence": why.evidence.iter().map(|e| e.label()).collect::<Vec<_>>(),
        "source": db.to_string_lossy(),
        "generation": generation,
        "pid": holder,
        "pid_start": crate::holders::start_time(holder),
        "captured_by": std::process::id(),
        "missing_rows": missing_rows,
        "missing_rows_error": missing_error,
        "captured_at": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        "files": manifest_files,
        "versions": {
            "turnsafe": env!("CARGO_PKG_VERSION"),
            "sqlite": rusqlite::version(),
        },
    });
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| err("manifest", None)(io::Error::other(e)))?;
    write_durably(&dir, "manifest.json", &text)?;
    sync_dir(&dir).map_err(err("fsync_dir", None))?;
    sync_dir(parent).map_err(err("fsync_dir", None))?;
    let abs = std::path::absolute(&dir).unwrap_or(dir);
    Ok(Capture {
        path: abs.to_string_lossy().into_owned(),
        files: receipt_files,
        manifest_sha256: hex::encode(Sha256::digest(&text)),
    })
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_short_read_aborts_loudly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 5000]).unwrap();
        let f = File::open(&path).unwrap();
        assert_eq!(read_exactly(f.as_raw_fd(), 5000).unwrap().len(), 5000);
        // The file is shorter than the size the capture expects (it was
        // truncated after fstat): an error, never a short copy.
        let err = read_exactly(f.as_raw_fd(), 8192).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("short read: 5000 of 8192"), "{err}");
    }
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod more_tests;
