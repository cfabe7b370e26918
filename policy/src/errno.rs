//! Linux errno numbers the policy names in copy. The policy never reads
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
    (36, "ENAMETOOLONG", "file name too long"),
    (37, "ENOLCK", "no locks available"),
    (40, "ELOOP", "too many levels of symbolic links"),
    (95, "EOPNOTSUPP", "operation not supported"),
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
