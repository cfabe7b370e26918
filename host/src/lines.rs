//! Lines of bytes turnsafe did not write itself (stdin, divert files, the
//! ledger), read with a bound: a line past its limit is never held in
//! memory whole. Its bytes are streamed past and counted, and the caller
//! refuses or quarantines it by that count. Also the one way to open such
//! a file: never through a symlink, never blocking on a FIFO, and only a
//! regular file.
//!
//! The limits, by what they bound (`docs/STORAGE.md`, "Limits"):
//! [`MAX_BATCH_LINE`] for a line of `turnsafe append`'s stdin (one batch),
//! [`MAX_DIVERT_LINE`] for a line of a divert file, which holds one message
//! of such a batch and its envelope, so every line a divert writes is one
//! replay reads back.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The longest line `turnsafe append` reads from stdin (one batch), in
/// bytes, its newline and surrounding whitespace included.
pub const MAX_BATCH_LINE: usize = 32 << 20;

/// Room a divert line's envelope takes beside its message: the version,
/// the session id (128 bytes at most), the uid (256), the seq, the batch
/// id, the cause and the time, with room to spare.
pub const DIVERT_ENVELOPE: usize = 64 << 10;

/// The longest line of a divert file (or of the ledger) a reader takes in,
/// in bytes, its newline included. The divert refuses to write a longer
/// one, so nothing diverted is ever past it.
pub const MAX_DIVERT_LINE: usize = MAX_BATCH_LINE + DIVERT_ENVELOPE;

/// The largest divert file `clear` (and LangGraph's thread delete) takes
/// in whole, in bytes. Replay and doctor stream a file of any size.
pub const MAX_WHOLE_FILE: u64 = 256 << 20;

/// Read all of `f` (its `shown` name for the error), refusing past
/// [`MAX_WHOLE_FILE`] without holding more than that.
pub fn read_whole(f: &mut impl io::Read, shown: &str) -> io::Result<Vec<u8>> {
    let mut data = Vec::new();
    f.take(MAX_WHOLE_FILE + 1).read_to_end(&mut data)?;
    if data.len() as u64 > MAX_WHOLE_FILE {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "{shown} is longer than the {MAX_WHOLE_FILE} bytes read whole; run `turnsafe replay` first, \
                 which streams it"
            ),
        ));
    }
    Ok(data)
}

/// One line read with a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// The line is in the buffer, its newline included when it had one.
    Whole,
    /// The line was longer than the bound: its bytes were read past, and
    /// the buffer holds only the bound's worth of them.
    TooLong,
}

/// Read the next line of `reader` into `buf` (cleared first), holding at
/// most `max` bytes of it. Returns the bytes the line took in the input
/// (newline included) and whether it fitted, or `None` at the end.
pub fn read_line(reader: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> io::Result<Option<(u64, Line)>> {
    buf.clear();
    // std's read_until and skip_until find the newline with its memchr.
    let n = reader.by_ref().take(max as u64).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    if n < max || buf.last() == Some(&b'\n') {
        return Ok(Some((n as u64, Line::Whole)));
    }
    // The bound was reached inside the line: read past the rest of it.
    match reader.skip_until(b'\n')? {
        0 => Ok(Some((n as u64, Line::Whole))),
        more => Ok(Some(((n + more) as u64, Line::TooLong))),
    }
}

/// Why a line past its bound is refused or quarantined, in the words the
/// ledger and the answers use.
pub fn too_long(taken: u64, max: usize) -> String {
    format!("line of {taken} bytes is longer than the limit of {max} bytes")
}

/// Open an outside file for reading: never through a symlink (ELOOP),
/// without blocking should it be a FIFO, and refused unless it is a
/// regular file (a FIFO, a socket, a device or a folder).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let kind = f.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::other(format!("not a regular file ({})", kind_name(kind))));
    }
    Ok(f)
}

/// Each line of the regular file at `path` ([`open_regular`]), read with
/// the bound `max`: `f` gets the line's bytes (at most `max` of them) and
/// whether it fitted.
pub fn each_line_of(path: &Path, max: usize, mut f: impl FnMut(&[u8], Line)) -> io::Result<()> {
    let mut reader = io::BufReader::with_capacity(1 << 16, open_regular(path)?);
    let mut buf = Vec::new();
    while let Some((_, fits)) = read_line(&mut reader, &mut buf, max)? {
        f(&buf, fits);
    }
    Ok(())
}

/// Whether an error reading a file of the home is the home's (a file it
/// may not read, a symlink, a folder or a FIFO where a file belongs), not
/// turnsafe's: the command line answers it as a usage mistake, naming the file.
pub fn is_unreadable_input(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::ELOOP | libc::EISDIR | libc::ENOTDIR)
    ) || (e.kind() == io::ErrorKind::Other && e.to_string().starts_with("not a regular file"))
}

/// What a file that is not a regular one is, for messages.
pub fn kind_name(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a folder"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], max: usize) -> Vec<(Vec<u8>, u64, Line)> {
        // A tiny buffer, so lines span many reads.
        let mut r = io::BufReader::with_capacity(3, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while let Some((n, line)) = read_line(&mut r, &mut buf, max).unwrap() {
            out.push((buf.clone(), n, line));
        }
        out
    }

    #[test]
    fn a_line_at_the_bound_fits_and_one_byte_more_does_not() {
        let got = all(b"abcd\nabcde\nab", 5);
        assert_eq!(got[0], (b"abcd\n".to_vec(), 5, Line::Whole));
        assert_eq!(got[1], (b"abcde".to_vec(), 6, Line::TooLong));
        assert_eq!(got[2], (b"ab".to_vec(), 2, Line::Whole));
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn a_long_line_is_read_past_whole() {
        let mut input = vec![b'x'; 1000];
        input.extend_from_slice(b"\nok\n");
        let got = all(&input, 10);
        assert_eq!((got[0].1, got[0].2, got[0].0.len()), (1001, Line::TooLong, 10));
        assert_eq!(got[1], (b"ok\n".to_vec(), 3, Line::Whole));
    }

    #[test]
    fn only_regular_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = open_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(open_regular(dir.path()).is_err());
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("f"), dir.path().join("l")).unwrap();
        assert_eq!(
            open_regular(&dir.path().join("l")).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        assert!(open_regular(&dir.path().join("f")).is_ok());
    }
}
