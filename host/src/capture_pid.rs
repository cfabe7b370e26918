//! `turnsafe capture --pid`: copy the retired generation a live writer
//! still holds, through `/proc/<pid>/fd/`, into a capture folder with the
//! same manifest and receipt as the writer's own capture.
//!
//! When a writer's own capture failed, the retired main file, WAL and shm
//! exist only in that process's open descriptors; stopping it destroys
//! them. This is how an operator keeps them first.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::capture::{self, Capture, CaptureError, HeldFile, Why};
use crate::guard::FileId;

/// How many times the files are read again when the writer changed one
/// while it was being read.
const READ_TRIES: u32 = 5;

/// One descriptor of the writer on a file of the home's database.
#[derive(Debug, Clone)]
struct Held {
    name: &'static str,
    fd: i32,
    id: FileId,
    /// The file at the path is another one (or none): this one is retired.
    retired: bool,
}

fn failed(operation: &'static str, message: String) -> CaptureError {
    CaptureError {
        operation,
        file: None,
        errno: None,
        message,
    }
}

fn io_failed(operation: &'static str, file: Option<&str>, e: &io::Error) -> CaptureError {
    CaptureError {
        operation,
        file: file.map(String::from),
        errno: e.raw_os_error().map(i64::from),
        message: e.to_string(),
    }
}

/// The descriptors `pid` holds on `home`'s `state.db`, `-wal` and `-shm`
/// (deleted ones included), each marked retired when the file at the path
/// is not the one held.
fn held_files(pid: u32, home: &Path) -> Result<Vec<Held>, CaptureError> {
    let home = std::fs::canonicalize(home).map_err(|e| io_failed("read", None, &e))?;
    let fd_dir = PathBuf::from(format!("/proc/{pid}/fd"));
    let entries = std::fs::read_dir(&fd_dir).map_err(|e| io_failed("read", None, &e))?;
    let mut out: Vec<Held> = Vec::new();
    for entry in entries.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        let path = target.strip_suffix(" (deleted)").unwrap_or(&target);
        let Some(name) = ["state.db", "state.db-wal", "state.db-shm"]
            .into_iter()
            .find(|n| Path::new(path) == home.join(n))
        else {
            continue;
        };
        // stat through the link: the held inode, whatever its name now.
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let at_path = std::fs::metadata(home.join(name)).ok().map(|m| FileId {
            dev: m.dev(),
            ino: m.ino(),
        });
        let held = Held {
            name,
            fd,
            id,
            retired: at_path != Some(id),
        };
        // One descriptor per file: a retired one is the one to keep.
        match out.iter_mut().find(|h| h.name == name) {
            Some(h) if !h.retired && held.retired => *h = held,
            Some(_) => {}
            None => out.push(held),
        }
    }
    out.sort_by_key(|h| h.name);
    Ok(out)
}

/// Read one held file whole through `/proc/<pid>/fd/<fd>`, checking that
/// its size and change time did not move while it was read.
fn read_held(pid: u32, h: &Held) -> io::Result<Vec<u8>> {
    let link = PathBuf::from(format!("/proc/{pid}/fd/{}", h.fd));
    let stamp = |m: &std::fs::Metadata| (m.size(), m.mtime(), m.mtime_nsec(), m.ctime_nsec());
    for _ in 0..READ_TRIES {
        let before = std::fs::metadata(&link)?;
        let data = std::fs::read(&link)?;
        let after = std::fs::metadata(&link)?;
        if stamp(&before) == stamp(&after) && data.len() as u64 == after.size() {
            return Ok(data);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(io::Error::other(format!(
        "{} changed on every read: the writer is still writing it",
        h.name
    )))
}

/// Capture what `pid` holds of `home`'s database. Fails, and writes
/// nothing it would call a capture, when the process holds no retired
/// file of it, or when any file cannot be read whole.
pub fn capture_pid(pid: u32, home: &Path) -> Result<Capture, CaptureError> {
    if pid == std::process::id() {
        return Err(failed("read", "refusing to capture this process itself".into()));
    }
    if !crate::holders::alive(pid, None) {
        return Err(failed("read", format!("no process {pid} is running")));
    }
    let held = held_files(pid, home)?;
    if held.is_empty() {
        return Err(failed(
            "read",
            format!("pid {pid} holds no state.db, -wal or -shm of {}", home.display()),
        ));
    }
    if !held.iter().any(|h| h.retired) {
        return Err(failed(
            "read",
            format!(
                "pid {pid} holds only the files now at {}'s paths: there is no retired generation to capture",
                home.display()
            ),
        ));
    }
    let main_retired = held.iter().any(|h| h.name == "state.db" && h.retired);
    let (cause, evidence) = if main_retired {
        (turnsafe_policy::Cause::Replaced, turnsafe_policy::Evidence::DbReplaced)
    } else {
        (
            turnsafe_policy::Cause::DeletedWal,
            turnsafe_policy::Evidence::DeletedWalGeneration,
        )
    };
    let mut files = Vec::new();
    for h in &held {
        let data = read_held(pid, h).map_err(|e| io_failed("read", Some(h.name), &e))?;
        files.push(HeldFile {
            name: h.name.to_string(),
            data,
            id: h.id,
            fd: h.fd,
        });
    }
    let why = Why {
        trigger: format!("turnsafe capture --pid {pid}"),
        cause,
        evidence: vec![evidence],
    };
    capture::write_capture(&home.join("state.db"), pid, None, &why, files)
}
