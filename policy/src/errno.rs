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

const TABLE: &[(i64, &str, &str)] = &[
    (1, "EPERM", "operation not permitted"),
    (2, "ENOENT", "no such file or directory"),
    (4, "EINTR", "interrupted system call"),
    (5, "EIO", "input/output error"),
    (9, "EBADF", "bad file descriptor"),
    (11, "EAGAIN", "resource temporarily unavailable"),
    (12, "ENOMEM", "out of memory"),
    (13, "EACCES", "permission denied"),
    (16, "EBUSY", "device or resource busy"),
    (17, "EEXIST", "file exists"),
    (18, "EXDEV", "invalid cross-device link"),
    (20, "ENOTDIR", "not a directory"),
    (21, "EISDIR", "is a directory"),
    (22, "EINVAL", "invalid argument"),
    (23, "ENFILE", "too many open files in system"),
    (24, "EMFILE", "too many open files"),
    (26, "ETXTBSY", "text file busy"),
    (27, "EFBIG", "file too large"),
    (28, "ENOSPC", "no space left on device"),
    (30, "EROFS", "read-only file system"),
    (31, "EMLINK", "too many links"),
    (32, "EPIPE", "broken pipe"),
    (36, "ENAMETOOLONG", "file name too long"),
    (37, "ENOLCK", "no locks available"),
    (40, "ELOOP", "too many levels of symbolic links"),
    (95, "EOPNOTSUPP", "operation not supported"),
    (101, "ENETUNREACH", "network is unreachable"),
    (104, "ECONNRESET", "connection reset by peer"),
    (110, "ETIMEDOUT", "connection timed out"),
    (111, "ECONNREFUSED", "connection refused"),
    (113, "EHOSTUNREACH", "no route to host"),
    (116, "ESTALE", "stale file handle"),
    (122, "EDQUOT", "disk quota exceeded"),
];

/// `(symbolic name, description)` of a known errno.
pub fn describe(errno: i64) -> Option<(&'static str, &'static str)> {
    TABLE
        .iter()
        .find(|(n, _, _)| *n == errno)
        .map(|(_, name, text)| (*name, *text))
}

/// The errno a symbolic name (`"EMFILE"`) stands for.
pub fn from_name(name: &str) -> Option<i64> {
    TABLE
        .iter()
        .find(|(_, n, _)| n.eq_ignore_ascii_case(name))
        .map(|(n, _, _)| *n)
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
        for (n, name, text) in TABLE {
            assert_eq!(from_name(name), Some(*n), "{name}");
            assert_eq!(human(*n), cat(&[text, " (", name, ")"]));
        }
        let mut numbers: Vec<i64> = TABLE.iter().map(|(n, _, _)| *n).collect();
        numbers.dedup();
        assert_eq!(numbers.len(), TABLE.len(), "numbers in order, none twice");
        assert!(numbers.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_network_errors_a_connection_meets_are_named() {
        assert_eq!(human(111), "connection refused (ECONNREFUSED)");
        assert_eq!(human(104), "connection reset by peer (ECONNRESET)");
        assert_eq!(human(110), "connection timed out (ETIMEDOUT)");
        assert_eq!(human(999), "errno 999");
    }
}
