//! Which processes hold a file open, from `/proc/<pid>/fd`, deleted files
//! included (their link reads `<path> (deleted)`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Holders of some paths, and the processes whose descriptors could not be read.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Holders {
    /// pid -> the watched paths it holds (a ` (deleted)` suffix kept).
    pub by_pid: BTreeMap<u32, Vec<String>>,
    /// Processes whose `/proc/<pid>/fd` could not be read.
    pub unreadable: Vec<u32>,
}

impl Holders {
    pub fn pids(&self) -> Vec<u32> {
        self.by_pid.keys().copied().collect()
    }
    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }
}

/// Scan every process for descriptors on `paths`. `skip_self` leaves this
/// process out.
pub fn scan(paths: &[PathBuf], skip_self: bool) -> std::io::Result<Holders> {
    let wanted: Vec<String> = paths
        .iter()
        .map(|p| {
            std::fs::canonicalize(p)
                .unwrap_or_else(|_| absolute(p))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let me = std::process::id();
    let mut out = Holders::default();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if skip_self && pid == me {
            continue;
        }
        let fd_dir = entry.path().join("fd");
        let fds = match std::fs::read_dir(&fd_dir) {
            Ok(d) => d,
            // The process exited while we looked: it holds nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => {
                out.unreadable.push(pid);
                continue;
            }
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let t = target.to_string_lossy();
            let base = t.strip_suffix(" (deleted)").unwrap_or(&t);
            if wanted.iter().any(|w| w == base) {
                let list = out.by_pid.entry(pid).or_default();
                if !list.contains(&t.to_string()) {
                    list.push(t.into_owned());
                }
            }
        }
    }
    Ok(out)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The db and its sidecars.
pub fn db_files(db: &Path) -> Vec<PathBuf> {
    crate::guard::Part::ALL
        .iter()
        .map(|p| crate::guard::path_of(db, *p))
        .collect()
}

/// When process `pid` started, in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`): with the pid, it names one process, since a pid
/// may be reused by a later one.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process that was `pid`, started at `started` (when known),
/// is still running.
pub fn alive(pid: u32, started: Option<u64>) -> bool {
    match (start_time(pid), started) {
        (None, _) => false,
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
    }
}
