//! The WAL-generation guard.
//!
//! In WAL mode SQLite reports no error when `state.db`, `-wal` or `-shm` is
//! deleted, moved or replaced under a live connection; committed frames
//! are then lost silently. The guard records, at open, the identity of the
//! three files, the descriptors that hold them, and the generation stamped
//! in the header (`application_id`, bytes 68-71), and compares them before
//! every write (under the write lock) and before close.
//!
//! Probes use only what the process already holds or needs no descriptor:
//! `statx` (identity and link count only, see [`IDENTITY`], and the main
//! file's `ctime`) on the paths and the held descriptors, `readlink` and
//! `pread` on the held descriptors, and `SQLITE_FCNTL_HAS_MOVED` when
//! SQLite's descriptor of the main file was not found. Listing
//! `/proc/self/fd` needs one transient descriptor and happens only when a
//! file is first recorded. A probe that fails is reported as such; the
//! store then fails closed as `disk`.
//!
//! The header is read again only when the main file's `ctime` moved since
//! a read that found it intact, or was too young then to prove anything
//! ([`crate::stamps`]): an overwrite in place (same inode, same size)
//! moves the `ctime`, which no process can set. A commit in WAL mode
//! never writes the main file, so almost every check is six `statx`.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use turnsafe_policy::Evidence;

/// A file's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// One recorded file: its identity and the descriptor that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub id: FileId,
    pub fd: Option<RawFd>,
}

/// Which file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Wal,
    Shm,
}

impl Part {
    pub const ALL: [Part; 3] = [Part::Main, Part::Wal, Part::Shm];
    pub fn suffix(self) -> &'static str {
        match self {
            Part::Main => "",
            Part::Wal => "-wal",
            Part::Shm => "-shm",
        }
    }
}

/// What the guard found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Intact,
    /// The evidence for the policy, and what exactly differed (for logs).
    Mismatch {
        evidence: Evidence,
        detail: String,
    },
}

#[derive(Debug, thiserror::Error)]
#[error("guard probe `{probe}` failed: {source}")]
pub struct ProbeError {
    pub probe: &'static str,
    #[source]
    pub source: io::Error,
}

fn probe<T>(probe: &'static str, r: io::Result<T>) -> Result<T, ProbeError> {
    r.map_err(|source| ProbeError { probe, source })
}

/// The record of one handle's files.
#[derive(Debug, Clone)]
pub struct Guard {
    db_path: PathBuf,
    files: [Option<Held>; 3],
    generation: [u8; 4],
    /// The main file's `ctime` when its header was last read intact, if
    /// that `ctime` was old enough then to prove a later change moves it.
    header_quiet: Option<i128>,
    racy: std::time::Duration,
    header_reads: u64,
}

/// The path of one of the db's files.
pub fn path_of(db: &Path, part: Part) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(part.suffix());
    PathBuf::from(s)
}

/// What the guard asks of a file: its identity and link count, never its
/// times. On a filesystem with multigrain timestamps (ext4 and others since
/// Linux 6.13) a `stat` that returns the times marks them as read, and the
/// next write must then stamp a fine-grained, always-new mtime: the inode is
/// dirtied by every commit, and `fdatasync` writes it out each time, one
/// more synchronous write per batch. `statx` with only `STATX_INO` and
/// `STATX_NLINK` asks for no time, so the WAL's mtime stays coarse.
const IDENTITY: rustix::fs::StatxFlags = rustix::fs::StatxFlags::INO.union(rustix::fs::StatxFlags::NLINK);

fn identity(st: &rustix::fs::Statx) -> (FileId, u64) {
    (
        FileId {
            dev: rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
        },
        u64::from(st.stx_nlink),
    )
}

fn stat_id(path: &Path) -> io::Result<Option<FileId>> {
    match rustix::fs::statx(rustix::fs::CWD, path, rustix::fs::AtFlags::empty(), IDENTITY) {
        Ok(st) => Ok(Some(identity(&st).0)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        // A kernel without statx (before 4.11).
        Err(rustix::io::Errno::NOSYS) => match rustix::fs::stat(path) {
            Ok(st) => Ok(Some(FileId {
                dev: st.st_dev,
                ino: st.st_ino,
            })),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

fn fd_stat(fd: RawFd) -> io::Result<(FileId, u64)> {
    // SAFETY: the descriptor is held open by this process's SQLite connection.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    match rustix::fs::statx(b, "", rustix::fs::AtFlags::EMPTY_PATH, IDENTITY) {
        Ok(st) => Ok(identity(&st)),
        Err(rustix::io::Errno::NOSYS) => {
            let st = rustix::fs::fstat(b)?;
            Ok((
                FileId {
                    dev: st.st_dev,
                    ino: st.st_ino,
                },
                st.st_nlink,
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// The identity, link count and `ctime` of the main file through its
/// descriptor. Asking for the main file's times costs no commit: in WAL
/// mode only a checkpoint writes it.
fn fd_stat_ctime(fd: RawFd) -> io::Result<(FileId, u64, Option<i128>)> {
    // SAFETY: the descriptor is held open by this process's SQLite connection.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let want = IDENTITY.union(rustix::fs::StatxFlags::CTIME);
    match rustix::fs::statx(b, "", rustix::fs::AtFlags::EMPTY_PATH, want) {
        Ok(st) => {
            let (id, nlink) = identity(&st);
            let ctime =
                (st.stx_mask & rustix::fs::StatxFlags::CTIME.bits() != 0).then(|| crate::stamps::ns(st.stx_ctime));
            Ok((id, nlink, ctime))
        }
        Err(rustix::io::Errno::NOSYS) => fd_stat(fd).map(|(id, nlink)| (id, nlink, None)),
        Err(e) => Err(e.into()),
    }
}

/// Header bytes 68-71 (`application_id`) read through a descriptor.
fn header_generation(fd: RawFd) -> io::Result<[u8; 4]> {
    // SAFETY: as above.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut buf = [0u8; 4];
    let n = rustix::io::pread(b, &mut buf, 68)?;
    if n != 4 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short header read"));
    }
    Ok(buf)
}

/// The descriptors of this process whose link target is `path` (or
/// `path (deleted)`) and whose identity is `id`.
fn find_fd(path: &Path, id: FileId) -> io::Result<Option<RawFd>> {
    let want = path.as_os_str().to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse::<RawFd>().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        let target = target.strip_suffix(" (deleted)").unwrap_or(&target);
        if target == want && fd_stat(fd).is_ok_and(|(fid, _)| fid == id) {
            return Ok(Some(fd));
        }
    }
    Ok(None)
}

impl Guard {
    /// Record the files as they are now. `db_path` should be absolute.
    pub fn record(db_path: &Path, conn: &Connection) -> Result<Guard, ProbeError> {
        let db_path = probe("canonicalize", std::fs::canonicalize(db_path))?;
        let racy = crate::stamps::racy_for(&db_path);
        let mut g = Guard {
            db_path,
            files: [None; 3],
            generation: [0; 4],
            header_quiet: None,
            racy,
            header_reads: 0,
        };
        for part in Part::ALL {
            g.record_part(part)?;
        }
        let main_fd = g.files[0].and_then(|h| h.fd);
        g.generation = match main_fd {
            Some(fd) => probe("pread header", header_generation(fd))?,
            None => {
                let id: i32 = probe(
                    "application_id",
                    conn.query_row("PRAGMA application_id", [], |r| r.get(0))
                        .map_err(io::Error::other),
                )?;
                id.to_be_bytes()
            }
        };
        Ok(g)
    }

    fn record_part(&mut self, part: Part) -> Result<(), ProbeError> {
        let path = path_of(&self.db_path, part);
        if let Some(id) = probe("stat", stat_id(&path))? {
            let fd = probe("scan /proc/self/fd", find_fd(&path, id))?;
            self.files[part as usize] = Some(Held { id, fd });
        }
        Ok(())
    }

    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    pub fn held(&self, part: Part) -> Option<Held> {
        self.files[part as usize]
    }

    /// Trust a `ctime` only once it is `racy` old (by default the window
    /// of the database's filesystem, [`crate::stamps::racy_for`]).
    pub fn with_racy(mut self, racy: std::time::Duration) -> Guard {
        self.racy = racy;
        self
    }

    /// Forget the quiet header, so the next check reads it (as the first
    /// check after a checkpoint does).
    pub fn forget_quiet(&mut self) {
        self.header_quiet = None;
    }

    /// How many checks read the header.
    pub fn header_reads(&self) -> u64 {
        self.header_reads
    }

    pub fn generation(&self) -> i32 {
        i32::from_be_bytes(self.generation)
    }

    /// Compare the record with the paths, the held descriptors, SQLite's
    /// own view, and the header. Call under the write lock.
    pub fn check(&mut self, conn: &Connection) -> Result<Verdict, ProbeError> {
        let replaced = |detail: String| {
            Ok(Verdict::Mismatch {
                evidence: Evidence::DbReplaced,
                detail,
            })
        };
        let deleted = |detail: String| {
            Ok(Verdict::Mismatch {
                evidence: Evidence::DeletedWalGeneration,
                detail,
            })
        };

        // The main file.
        let Some(main) = self.held(Part::Main) else {
            return replaced("state.db was not there when the handle opened".into());
        };
        match probe("stat state.db", stat_id(&self.db_path))? {
            None => return replaced("state.db is gone from its path".into()),
            Some(id) if id != main.id => {
                return replaced(format!("state.db at the path is inode {} not {}", id.ino, main.id.ino));
            }
            Some(_) => {}
        }
        if let Some(fd) = main.fd {
            let read_at = std::time::SystemTime::now();
            let (id, nlink, ctime) = probe("fstat state.db", fd_stat_ctime(fd))?;
            if id != main.id {
                return replaced(format!("descriptor {fd} no longer holds state.db"));
            }
            if nlink == 0 {
                return replaced("the held state.db has no links left".into());
            }
            if ctime.is_none() || ctime != self.header_quiet {
                self.header_quiet = None;
                self.header_reads += 1;
                if probe("pread header", header_generation(fd))? != self.generation {
                    return replaced("the header's generation changed (the file was overwritten)".into());
                }
                // The ctime was read before the header: any change after
                // it moves it, once it was old enough then to prove that.
                self.header_quiet = ctime.filter(|&c| crate::stamps::settled(c, read_at, self.racy));
            }
        } else if sqlite_says_moved(conn) {
            // Without SQLite's descriptor, its own look at the path. With
            // it, the identities compared above already cover this.
            return replaced("SQLite reports the database file has moved".into());
        }

        // The sidecars.
        for part in [Part::Wal, Part::Shm] {
            let path = path_of(&self.db_path, part);
            let now = probe("stat sidecar", stat_id(&path))?;
            match (self.held(part), now) {
                (None, None) => {}
                // A sidecar appeared since open: record it now.
                (None, Some(_)) => self.record_part(part)?,
                (Some(h), None) => {
                    return deleted(format!(
                        "state.db{} is gone from its path (held inode {})",
                        part.suffix(),
                        h.id.ino
                    ));
                }
                (Some(h), Some(id)) if id != h.id => {
                    return deleted(format!(
                        "state.db{} at the path is inode {} not {}",
                        part.suffix(),
                        id.ino,
                        h.id.ino
                    ));
                }
                (Some(h), Some(_)) => {
                    if let Some(fd) = h.fd {
                        let (id, nlink) = probe("fstat sidecar", fd_stat(fd))?;
                        if id != h.id || nlink == 0 {
                            return deleted(format!("the held state.db{} was unlinked", part.suffix()));
                        }
                    }
                }
            }
        }
        Ok(Verdict::Intact)
    }
}

/// `SQLITE_FCNTL_HAS_MOVED`: whether SQLite finds its file gone from its
/// path or another inode there.
fn sqlite_says_moved(conn: &Connection) -> bool {
    let mut moved: std::ffi::c_int = 0;
    // SAFETY: a valid connection handle and an int out-parameter, as
    // SQLITE_FCNTL_HAS_MOVED expects.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_HAS_MOVED,
            (&mut moved as *mut std::ffi::c_int).cast(),
        )
    };
    rc == rusqlite::ffi::SQLITE_OK && moved != 0
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
