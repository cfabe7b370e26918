//! Linux errno numbers the policy names in copy (files, and the network
//! errors a PostgreSQL connection meets). The policy never reads
//! the environment, so this is a fixed table (x86_64/aarch64 Linux values).

#[allow(unused_imports)]
use crate::prelude::*;
use crate::text::{cat, signed};
pub const ENOENT: i64 = 2;
pub const EACCES: i64 = 13;
pub const EMFILE: i64 = 24;
pub const ENFILE: i64 = 23;
pub const ENOSPC: i64 = 28;
pub const EDQUOT: i64 = 122;

/// The errnos named, in increasing order; each is the number of the line
/// of [`ENTRIES`] at its index.
const NUMBERS: [u8; 33] = [
    1, 2, 4, 5, 9, 11, 12, 13, 16, 17, 18, 20, 21, 22, 23, 24, 26, 27, 28, 30, 31, 32, 36, 37, 40, 95, 101, 104, 110,
    111, 113, 116, 122,
];

/// `NAME description`, one line per errno of [`NUMBERS`]. One string
/// rather than a table of `(number, &str, &str)`: in the component each
/// row of such a table is 24 bytes of pointers besides its text.
const ENTRIES: &str = "\
    EPERM operation not permitted\n\
    ENOENT no such file or directory\n\
    EINTR interrupted system call\n\
    EIO input/output error\n\
    EBADF bad file descriptor\n\
    EAGAIN resource temporarily unavailable\n\
    ENOMEM out of memory\n\
    EACCES permission denied\n\
    EBUSY device or resource busy\n\
    EEXIST file exists\n\
    EXDEV invalid cross-device link\n\
    ENOTDIR not a directory\n\
    EISDIR is a directory\n\
    EINVAL invalid argument\n\
    ENFILE too many open files in system\n\
    EMFILE too many open files\n\
    ETXTBSY text file busy\n\
    EFBIG file too large\n\
    ENOSPC no space left on device\n\
    EROFS read-only file system\n\
    EMLINK too many links\n\
    EPIPE broken pipe\n\
    ENAMETOOLONG file name too long\n\
    ENOLCK no locks available\n\
    ELOOP too many levels of symbolic links\n\
    EOPNOTSUPP operation not supported\n\
    ENETUNREACH network is unreachable\n\
    ECONNRESET connection reset by peer\n\
    ETIMEDOUT connection timed out\n\
    ECONNREFUSED connection refused\n\
    EHOSTUNREACH no route to host\n\
    ESTALE stale file handle\n\
    EDQUOT disk quota exceeded";

/// The errno `number` names, or else the one named `name` (any case):
/// `(number, name, description)`. One search for both, so the component
/// carries it once; one pass over the bytes, with no `char` search (which
/// brings `memchr` into the component).
fn find(number: Option<i64>, name: &str) -> Option<(i64, &'static str, &'static str)> {
    let bytes = ENTRIES.as_bytes();
    // The current line starts at `start`; its first space is at `space`
    // once `space > start`.
    let (mut start, mut space, mut line) = (0, 0, 0);
    // `+ 1`, not `..=`: a `RangeInclusive` costs the component its own iterator.
    for i in 0..bytes.len() + 1 {
        match bytes.get(i) {
            Some(b' ') if space <= start => space = i,
            Some(b'\n') | None => {
                let n = i64::from(*NUMBERS.get(line)?);
                let line_name = ENTRIES.get(start..space)?;
                let hit = match number {
                    Some(wanted) => n == wanted,
                    None => line_name.eq_ignore_ascii_case(name),
                };
                if hit {
                    return Some((n, line_name, ENTRIES.get(space + 1..i)?));
                }
                line += 1;
                start = i + 1;
            }
            Some(_) => {}
        }
    }
    None
}

/// `(symbolic name, description)` of a known errno.
pub fn describe(errno: i64) -> Option<(&'static str, &'static str)> {
    find(Some(errno), "").map(|(_, name, text)| (name, text))
}

/// The errno a symbolic name (`"EMFILE"`) stands for.
pub fn from_name(name: &str) -> Option<i64> {
    find(None, name).map(|(n, _, _)| n)
}

/// Human form used in copy: `"too many open files (EMFILE)"`, or `"errno 999"`.
pub fn human(errno: i64) -> String {
    match describe(errno) {
        Some((name, text)) => cat(&[text, " (", name, ")"]),
        None => cat(&["errno ", &signed(errno)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_unique_and_reads_back() {
        let lines: Vec<&str> = ENTRIES.lines().collect();
        assert_eq!(lines.len(), NUMBERS.len(), "one line per number");
        for (n, line) in NUMBERS.iter().zip(lines) {
            let n = i64::from(*n);
            let (name, text) = line.split_once(' ').unwrap();
            assert!(
                name.starts_with('E') && name.bytes().all(|b| b.is_ascii_uppercase()),
                "{line}"
            );
            assert!(!text.is_empty() && !text.starts_with(' '), "{line}");
            assert_eq!(from_name(name), Some(n), "{name}");
            assert_eq!(describe(n), Some((name, text)));
            assert_eq!(human(n), cat(&[text, " (", name, ")"]));
        }
        assert!(NUMBERS.windows(2).all(|w| w[0] < w[1]), "numbers in order, none twice");
    }

    #[test]
    fn the_network_errors_a_connection_meets_are_named() {
        assert_eq!(human(111), "connection refused (ECONNREFUSED)");
        assert_eq!(human(104), "connection reset by peer (ECONNRESET)");
        assert_eq!(human(110), "connection timed out (ETIMEDOUT)");
        assert_eq!(human(999), "errno 999");
    }
}
