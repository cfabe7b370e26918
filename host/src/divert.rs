//! The durable divert: a batch that could not be committed is appended to
//! `<home>/sessions/<session>.jsonl`, one self-describing line per message
//! (format in `docs/DIVERT.md`). The receipt exists only after the file,
//! and for a new file its directory, were fsynced.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use turnsafe_policy::{Cause, DivertResidue};

use crate::message::Message;

/// Version of the divert line format: 2 keeps the message exactly as it
/// was written, with the uid beside it (1 put the uid inside `message`;
/// replay still reads it).
pub const FORMAT_VERSION: u64 = 2;
/// Longest accepted session id, in bytes.
pub use crate::ids::{MAX_SESSION_ID, validate_session_id};

/// Proof that a batch is durably on disk: written, then fsynced. The
/// policy's own type, so the flush machine can carry it into the outcome.
pub use turnsafe_policy::machine::DivertReceipt as Receipt;

/// A divert that did not happen. `path` is for logs only; user copy gets
/// the operation and errno.
#[derive(Debug, thiserror::Error)]
#[error("divert {operation} failed: {message}")]
pub struct DivertError {
    pub operation: &'static str,
    pub errno: Option<i64>,
    pub message: String,
    pub path: Option<PathBuf>,
    /// Set when some of the batch's bytes reached the file and could not be
    /// cut away again: lines from `offset` on may remain.
    pub residue: Option<DivertResidue>,
}

impl DivertError {
    fn io(operation: &'static str, path: &Path, e: &io::Error) -> DivertError {
        DivertError {
            operation,
            errno: e.raw_os_error().map(i64::from),
            message: e.kind().to_string(),
            path: Some(path.to_path_buf()),
            residue: None,
        }
    }

    /// The outcome's `divert_error` object: no path.
    pub fn to_value(&self) -> Value {
        json!({
            "operation": self.operation,
            "errno": self.errno,
            "error": self.errno.map(turnsafe_policy::errno::human).unwrap_or_else(|| self.message.clone()),
        })
    }

    pub fn to_failure(&self) -> turnsafe_policy::DivertFailure {
        turnsafe_policy::DivertFailure {
            operation: self.operation.to_string(),
            errno: self.errno,
        }
    }
}

/// One diverted message, fully described.
pub struct DivertLine<'a> {
    pub uid: &'a str,
    /// The message's place in the transcript, when the handle knows it.
    pub seq: Option<i64>,
    pub message: &'a Message,
}

/// The flush machine's divert step for one batch: its lines from
/// `*next_seq` on (the seq advances past them once the receipt exists),
/// appended under a fresh batch id. Returns the event to feed back, and
/// the host's own error when the divert failed.
pub(crate) fn divert_step(
    dir: &Path,
    session: &str,
    messages: &[Message],
    uids: &[String],
    next_seq: &mut Option<i64>,
    cause: Cause,
) -> (turnsafe_policy::machine::Event, Option<DivertError>) {
    use turnsafe_policy::machine::Event;
    let first_seq = *next_seq;
    let lines: Vec<DivertLine<'_>> = messages
        .iter()
        .zip(uids)
        .enumerate()
        .map(|(i, (message, uid))| DivertLine {
            uid,
            seq: first_seq.map(|s| s + i as i64),
            message,
        })
        .collect();
    let n = lines.len();
    let batch_id = crate::ids::mint();
    match divert(dir, session, &batch_id, cause, &lines) {
        Ok(receipt) => {
            if let Some(s) = first_seq {
                *next_seq = Some(s + n as i64);
            }
            tracing::warn!(session, batch = %batch_id, count = n, cause = cause.label(), "batch diverted");
            (Event::Diverted(receipt), None)
        }
        Err(e) => {
            tracing::error!(
                session,
                path = ?e.path,
                error = %e.message,
                operation = e.operation,
                errno = ?e.errno,
                count = n,
                cause = cause.label(),
                "divert failed; batch handed back"
            );
            let event = Event::DivertFailed {
                failure: e.to_failure(),
                message: e.message.clone(),
                residue: e.residue.clone(),
            };
            (event, Some(e))
        }
    }
}

/// Append `lines` for `session` under `dir`, fsync, and return the receipt.
pub fn divert(
    dir: &Path,
    session: &str,
    batch_id: &str,
    cause: Cause,
    lines: &[DivertLine<'_>],
) -> Result<Receipt, DivertError> {
    let at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let values: Vec<Value> = lines
        .iter()
        .map(|l| {
            json!({
                "v": FORMAT_VERSION,
                "session": session,
                "uid": l.uid,
                "seq": l.seq,
                "batch": batch_id,
                "cause": cause.label(),
                "at": at,
                "message": l.message.item(),
            })
        })
        .collect();
    append_lines(dir, session, &values)
}

/// Append a LangGraph batch's lines (version 3, `kind` `checkpoint` or
/// `write`, blobs as base64) for `session` (the thread's safe id) under
/// `dir`, fsync, and return the receipt.
pub fn divert_graph(
    dir: &Path,
    session: &str,
    batch_id: &str,
    cause: Cause,
    graph: &crate::graph::GraphBatch,
) -> Result<Receipt, DivertError> {
    let at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let values: Vec<Value> = graph
        .lines()
        .into_iter()
        .map(|(kind, uid, payload)| {
            let mut line = json!({
                "v": crate::graph::FORMAT_VERSION,
                "kind": kind,
                "session": session,
                "uid": uid,
                "batch": batch_id,
                "cause": cause.label(),
                "at": at,
            });
            line[kind] = payload;
            line
        })
        .collect();
    append_lines(dir, session, &values)
}

/// The flush machine's divert step for a LangGraph batch.
pub(crate) fn divert_graph_step(
    dir: &Path,
    session: &str,
    graph: &crate::graph::GraphBatch,
    cause: Cause,
) -> (turnsafe_policy::machine::Event, Option<DivertError>) {
    use turnsafe_policy::machine::Event;
    let batch_id = crate::ids::mint();
    match divert_graph(dir, session, &batch_id, cause, graph) {
        Ok(receipt) => {
            tracing::warn!(session, batch = %batch_id, count = graph.len(), cause = cause.label(), "graph batch diverted");
            (Event::Diverted(receipt), None)
        }
        Err(e) => {
            tracing::error!(session, operation = e.operation, errno = ?e.errno, cause = cause.label(), "graph divert failed; batch handed back");
            let event = Event::DivertFailed {
                failure: e.to_failure(),
                message: e.message.clone(),
                residue: e.residue.clone(),
            };
            (event, Some(e))
        }
    }
}

/// Append one JSON line per value to `<dir>/<session>.jsonl` in one
/// write, fsync the file and every folder entry on its path, and return
/// the receipt; on failure, cut the file back to where the lines began.
pub(crate) fn append_lines(dir: &Path, session: &str, values: &[Value]) -> Result<Receipt, DivertError> {
    validate_session_id(session).map_err(|m| DivertError {
        operation: "validate",
        errno: Some(i64::from(libc::EINVAL)),
        message: m,
        path: None,
        residue: None,
    })?;
    // Encoded before anything is made: a batch the line limit refuses
    // leaves no folder or file behind.
    let mut buf = Vec::with_capacity(values.len() * 256);
    for line in values {
        let line_start = buf.len();
        serde_json::to_writer(&mut buf, line).map_err(|e| DivertError {
            operation: "encode",
            errno: None,
            message: e.to_string(),
            path: None,
            residue: None,
        })?;
        buf.push(b'\n');
        // Replay reads no line past this bound: one written past it would
        // be a copy that cannot be read back. Hand the batch back instead.
        let len = buf.len() - line_start;
        if len > crate::lines::MAX_DIVERT_LINE {
            return Err(DivertError {
                operation: "encode",
                errno: None,
                message: format!(
                    "a divert line of {len} bytes is longer than the limit of {} bytes",
                    crate::lines::MAX_DIVERT_LINE
                ),
                path: None,
                residue: None,
            });
        }
    }
    crate::failpoint::hit("divert.before_mkdir");
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(DivertError::io("mkdir", dir, &e)),
    }
    refuse_symlinked_folder(dir)?;
    let path = dir.join(format!("{session}.jsonl"));
    let mut file = open_locked(&path)?;

    // A torn last line from an earlier crash stays detectable: start ours
    // on a fresh line.
    let size = file.metadata().map_err(|e| DivertError::io("stat", &path, &e))?.len();
    let start = usize::from(size > 0 && !ends_with_newline(&file, size));
    if start == 1 {
        buf.insert(0, b'\n');
    }
    let offset = size + start as u64;
    crate::failpoint::hit("divert.before_write");
    let written = crate::failpoint::io_fault("divert.write")
        .map_or_else(|| file.write_all(&buf), Err)
        .map_err(|e| DivertError::io("write", &path, &e))
        .and_then(|()| {
            crate::failpoint::hit("divert.before_fsync");
            crate::failpoint::io_fault("divert.fsync")
                .map_or_else(|| file.sync_all(), Err)
                .map_err(|e| DivertError::io("fsync", &path, &e))
        })
        // Every folder entry on the receipt's path is made durable by every
        // divert, whoever created it: a call that created the file or the
        // folder may have failed before its own folder fsync, and a power
        // cut would then take the entry, and the copy, with it.
        .and_then(|()| {
            crate::failpoint::io_fault("divert.fsync_dir")
                .map_or_else(|| sync_path_entries(dir), Err)
                .map_err(|e| DivertError::io("fsync_dir", dir, &e))
        });
    if let Err(mut e) = written {
        // Bytes of this batch may be in the file, with no receipt to vouch
        // for them. Cut the file back to where the batch began; if even
        // that cannot be made durable, say what may remain where.
        if let Err(cut) = cut_back(&file, size) {
            tracing::error!(path = %path.display(), offset = size, error = %cut, "divert could not be cut back");
            e.residue = Some(DivertResidue {
                path: std::path::absolute(&path)
                    .unwrap_or_else(|_| path.clone())
                    .to_string_lossy()
                    .into_owned(),
                offset,
            });
        }
        return Err(e);
    }
    let sha = hex::encode(Sha256::digest(&buf[start..]));
    let abs = std::path::absolute(&path).unwrap_or(path);
    Ok(Receipt {
        path: abs.to_string_lossy().into_owned(),
        offset,
        length: (buf.len() - start) as u64,
        count: values.len() as u64,
        sha256: sha,
    })
}

/// Truncate `file` to `size` and make that durable.
fn cut_back(file: &File, size: u64) -> io::Result<()> {
    crate::failpoint::io_fault("divert.truncate").map_or_else(|| file.set_len(size), Err)?;
    crate::failpoint::io_fault("divert.truncate_fsync").map_or_else(|| file.sync_all(), Err)
}

/// Divert files are written only into a real folder, never through a
/// symlink put at `sessions/`: the copy would land where nobody made it
/// 0700, and replay and doctor would not look for it there.
fn refuse_symlinked_folder(dir: &Path) -> Result<(), DivertError> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| DivertError::io("stat", dir, &e))?;
    if meta.is_dir() {
        return Ok(());
    }
    let (errno, what) = if meta.file_type().is_symlink() {
        (libc::ELOOP, "a symbolic link")
    } else {
        (libc::ENOTDIR, crate::lines::kind_name(meta.file_type()))
    };
    Err(DivertError {
        operation: "open",
        errno: Some(i64::from(errno)),
        message: format!(
            "{} is {what}, not a folder: divert files are written only into a real folder",
            dir.display()
        ),
        path: Some(dir.to_path_buf()),
        residue: None,
    })
}

/// A divert file another user owns (neither this process's user nor the
/// folder's owner) is never appended to: its owner could read every copy
/// put there, and replay leaves such a file alone.
fn refuse_other_owner(path: &Path, owner: u32) -> Result<(), DivertError> {
    let me = rustix::process::geteuid().as_raw();
    let folder = path
        .parent()
        .and_then(|d| std::fs::symlink_metadata(d).ok())
        .map(|m| m.uid());
    if owner == me || Some(owner) == folder {
        return Ok(());
    }
    Err(DivertError {
        operation: "open",
        errno: Some(i64::from(libc::EPERM)),
        message: format!(
            "{} belongs to uid {owner}, not to this process's user (uid {me}) or the folder's owner",
            path.display()
        ),
        path: Some(path.to_path_buf()),
        residue: None,
    })
}

fn ends_with_newline(file: &File, size: u64) -> bool {
    let mut b = [0u8; 1];
    matches!(rustix::io::pread(file, &mut b, size - 1), Ok(1)) && b[0] == b'\n'
}

/// Open for append without following a symlink; report whether we created it.
/// How often a divert opens its file again when the one it locked was
/// taken from its path meanwhile.
const LOCK_TRIES: usize = 8;

/// Open `path` for appending and lock it, holding the file that is at
/// `path` once the lock is held. Replay and clear take a divert file by
/// renaming it under this same lock: a writer that opened the file before
/// the rename and locked it after would otherwise append to the taken
/// file, behind the reader's back, with a receipt naming `path`.
fn open_locked(path: &Path) -> Result<File, DivertError> {
    for _ in 0..LOCK_TRIES {
        let (file, _created) = open_append(path).map_err(|e| DivertError::io("open", path, &e))?;
        // Only a regular file holds a copy: a FIFO put at the path would
        // take the lines into a pipe (and block a large batch's write for
        // ever), a device anywhere.
        let meta = file.metadata().map_err(|e| DivertError::io("stat", path, &e))?;
        let kind = meta.file_type();
        if !kind.is_file() {
            return Err(DivertError {
                operation: "open",
                errno: None,
                message: format!(
                    "{} is {}, not a regular file",
                    path.display(),
                    crate::lines::kind_name(kind)
                ),
                path: Some(path.to_path_buf()),
                residue: None,
            });
        }
        refuse_other_owner(path, meta.uid())?;
        crate::failpoint::hit("divert.before_lock");
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| DivertError::io("lock", path, &io::Error::from(e)))?;
        let held = file.metadata().map_err(|e| DivertError::io("stat", path, &e))?;
        match std::fs::symlink_metadata(path) {
            Ok(at) if at.dev() == held.dev() && at.ino() == held.ino() => return Ok(file),
            // Taken (or replaced) since it was opened: open what is there now.
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(DivertError::io("stat", path, &e)),
        }
    }
    Err(DivertError::io(
        "lock",
        path,
        &io::Error::other("the divert file was taken from its path at every try"),
    ))
}

fn open_append(path: &Path) -> io::Result<(File, bool)> {
    // O_NONBLOCK: opening a FIFO never waits (regular files ignore it).
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    match OpenOptions::new()
        .read(true)
        .append(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(flags)
            .open(path)
            .map(|f| (f, false)),
        Err(e) => Err(e),
    }
}

/// fsync a directory so a new entry in it survives a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// fsync `dir` (its entries: the file just written) and its parent (the
/// entry of `dir` itself): the whole path of a file turnsafe creates under
/// a home.
pub fn sync_path_entries(dir: &Path) -> io::Result<()> {
    sync_dir(dir)?;
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => sync_dir(Path::new(".")),
    }
}

/// Read back a receipt's byte range and check its checksum and line count.
pub fn verify_receipt(r: &Receipt) -> io::Result<bool> {
    use std::io::{Read, Seek};
    // The path comes from outside (`explain --receipt-json`): only a
    // regular file is read, and only the range, streamed (a receipt may
    // name a file of any size).
    let mut f = crate::lines::open_regular(Path::new(&r.path))?;
    let size = f.metadata()?.len();
    // The numbers come from outside too: a range past the end of u64 is
    // one the file cannot hold.
    match r.offset.checked_add(r.length) {
        Some(end) if end <= size => {}
        _ => return Ok(false),
    }
    f.seek(io::SeekFrom::Start(r.offset))?;
    let mut range = f.take(r.length);
    let (mut hash, mut lines, mut read) = (Sha256::new(), 0u64, 0u64);
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = match range.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hash.update(&chunk[..n]);
        lines += chunk[..n].iter().filter(|b| **b == b'\n').count() as u64;
        read += n as u64;
    }
    // A file cut shorter while it was read holds no such range.
    Ok(read == r.length && hex::encode(hash.finalize()) == r.sha256 && lines == r.count)
}

#[cfg(test)]
#[path = "divert_tests.rs"]
mod tests;
