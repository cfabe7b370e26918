//! SQLite result codes the policy reads. An extended code's low byte is
//! its primary code, so classification works on `extended_code` first.

#[allow(unused_imports)]
use crate::prelude::*;
pub const ERROR: i64 = 1;
pub const PERM: i64 = 3;
pub const BUSY: i64 = 5;
pub const LOCKED: i64 = 6;
pub const NOMEM: i64 = 7;
pub const READONLY: i64 = 8;
pub const INTERRUPT: i64 = 9;
pub const IOERR: i64 = 10;
pub const CORRUPT: i64 = 11;
pub const FULL: i64 = 13;
pub const CANTOPEN: i64 = 14;
pub const PROTOCOL: i64 = 15;
pub const CONSTRAINT: i64 = 19;
pub const AUTH: i64 = 23;
pub const NOTADB: i64 = 26;
pub const NOLFS: i64 = 22;

pub const BUSY_RECOVERY: i64 = 261;
pub const BUSY_SNAPSHOT: i64 = 517;
pub const BUSY_TIMEOUT: i64 = 773;
pub const CORRUPT_VTAB: i64 = 267;
pub const CORRUPT_SEQUENCE: i64 = 523;
pub const CORRUPT_INDEX: i64 = 779;
pub const IOERR_CORRUPTFS: i64 = 8458;
pub const READONLY_DBMOVED: i64 = 1032;
pub const CONSTRAINT_FOREIGNKEY: i64 = 787;
pub const CONSTRAINT_UNIQUE: i64 = 2067;

/// The primary code of an extended code (its low byte).
pub fn primary_of(code: i64) -> i64 {
    code & 0xff
}

/// Standard name of a primary code, for docs and details.
pub fn primary_name(code: i64) -> Option<&'static str> {
    Some(match code {
        0 => "SQLITE_OK",
        1 => "SQLITE_ERROR",
        2 => "SQLITE_INTERNAL",
        3 => "SQLITE_PERM",
        4 => "SQLITE_ABORT",
        5 => "SQLITE_BUSY",
        6 => "SQLITE_LOCKED",
        7 => "SQLITE_NOMEM",
        8 => "SQLITE_READONLY",
        9 => "SQLITE_INTERRUPT",
        10 => "SQLITE_IOERR",
        11 => "SQLITE_CORRUPT",
        12 => "SQLITE_NOTFOUND",
        13 => "SQLITE_FULL",
        14 => "SQLITE_CANTOPEN",
        15 => "SQLITE_PROTOCOL",
        16 => "SQLITE_EMPTY",
        17 => "SQLITE_SCHEMA",
        18 => "SQLITE_TOOBIG",
        19 => "SQLITE_CONSTRAINT",
        20 => "SQLITE_MISMATCH",
        21 => "SQLITE_MISUSE",
        22 => "SQLITE_NOLFS",
        23 => "SQLITE_AUTH",
        24 => "SQLITE_FORMAT",
        25 => "SQLITE_RANGE",
        26 => "SQLITE_NOTADB",
        27 => "SQLITE_NOTICE",
        28 => "SQLITE_WARNING",
        100 => "SQLITE_ROW",
        101 => "SQLITE_DONE",
        _ => return None,
    })
}
