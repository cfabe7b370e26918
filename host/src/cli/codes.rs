//! `turnsafe codes`: SQLite result code names and numbers, from the
//! libsqlite3-sys constants this binary is built with. Runtimes whose
//! drivers report codes by name (better-sqlite3) read this table; it is
//! generated, never hand-copied (`examples/sqlite-codes.json`).

use rusqlite::ffi;
use serde_json::{Map, Value};

/// Print the SQLite result code table as one JSON object, name -> number.
#[derive(Debug, clap::Args)]
pub struct Args {}

macro_rules! codes {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), ffi::$name as i64)),*]
    };
}

/// Every primary and extended result code, as libsqlite3-sys defines them.
pub const CODES: &[(&str, i64)] = codes![
    SQLITE_OK,
    SQLITE_ERROR,
    SQLITE_INTERNAL,
    SQLITE_PERM,
    SQLITE_ABORT,
    SQLITE_BUSY,
    SQLITE_LOCKED,
    SQLITE_NOMEM,
    SQLITE_READONLY,
    SQLITE_INTERRUPT,
    SQLITE_IOERR,
    SQLITE_CORRUPT,
    SQLITE_NOTFOUND,
    SQLITE_FULL,
    SQLITE_CANTOPEN,
    SQLITE_PROTOCOL,
    SQLITE_EMPTY,
    SQLITE_SCHEMA,
    SQLITE_TOOBIG,
    SQLITE_CONSTRAINT,
    SQLITE_MISMATCH,
    SQLITE_MISUSE,
    SQLITE_NOLFS,
    SQLITE_AUTH,
    SQLITE_FORMAT,
    SQLITE_RANGE,
    SQLITE_NOTADB,
    SQLITE_NOTICE,
    SQLITE_WARNING,
    SQLITE_ROW,
    SQLITE_DONE,
    SQLITE_ERROR_MISSING_COLLSEQ,
    SQLITE_ERROR_RETRY,
    SQLITE_ERROR_SNAPSHOT,
    SQLITE_IOERR_READ,
    SQLITE_IOERR_SHORT_READ,
    SQLITE_IOERR_WRITE,
    SQLITE_IOERR_FSYNC,
    SQLITE_IOERR_DIR_FSYNC,
    SQLITE_IOERR_TRUNCATE,
    SQLITE_IOERR_FSTAT,
    SQLITE_IOERR_UNLOCK,
    SQLITE_IOERR_RDLOCK,
    SQLITE_IOERR_DELETE,
    SQLITE_IOERR_BLOCKED,
    SQLITE_IOERR_NOMEM,
    SQLITE_IOERR_ACCESS,
    SQLITE_IOERR_CHECKRESERVEDLOCK,
    SQLITE_IOERR_LOCK,
    SQLITE_IOERR_CLOSE,
    SQLITE_IOERR_DIR_CLOSE,
    SQLITE_IOERR_SHMOPEN,
    SQLITE_IOERR_SHMSIZE,
    SQLITE_IOERR_SHMLOCK,
    SQLITE_IOERR_SHMMAP,
    SQLITE_IOERR_SEEK,
    SQLITE_IOERR_DELETE_NOENT,
    SQLITE_IOERR_MMAP,
    SQLITE_IOERR_GETTEMPPATH,
    SQLITE_IOERR_CONVPATH,
    SQLITE_IOERR_VNODE,
    SQLITE_IOERR_AUTH,
    SQLITE_IOERR_BEGIN_ATOMIC,
    SQLITE_IOERR_COMMIT_ATOMIC,
    SQLITE_IOERR_ROLLBACK_ATOMIC,
    SQLITE_IOERR_DATA,
    SQLITE_IOERR_CORRUPTFS,
    SQLITE_LOCKED_SHAREDCACHE,
    SQLITE_LOCKED_VTAB,
    SQLITE_BUSY_RECOVERY,
    SQLITE_BUSY_SNAPSHOT,
    SQLITE_BUSY_TIMEOUT,
    SQLITE_CANTOPEN_NOTEMPDIR,
    SQLITE_CANTOPEN_ISDIR,
    SQLITE_CANTOPEN_FULLPATH,
    SQLITE_CANTOPEN_CONVPATH,
    SQLITE_CANTOPEN_SYMLINK,
    SQLITE_CORRUPT_VTAB,
    SQLITE_CORRUPT_SEQUENCE,
    SQLITE_CORRUPT_INDEX,
    SQLITE_READONLY_RECOVERY,
    SQLITE_READONLY_CANTLOCK,
    SQLITE_READONLY_ROLLBACK,
    SQLITE_READONLY_DBMOVED,
    SQLITE_READONLY_CANTINIT,
    SQLITE_READONLY_DIRECTORY,
    SQLITE_ABORT_ROLLBACK,
    SQLITE_CONSTRAINT_CHECK,
    SQLITE_CONSTRAINT_COMMITHOOK,
    SQLITE_CONSTRAINT_FOREIGNKEY,
    SQLITE_CONSTRAINT_FUNCTION,
    SQLITE_CONSTRAINT_NOTNULL,
    SQLITE_CONSTRAINT_PRIMARYKEY,
    SQLITE_CONSTRAINT_TRIGGER,
    SQLITE_CONSTRAINT_UNIQUE,
    SQLITE_CONSTRAINT_VTAB,
    SQLITE_CONSTRAINT_ROWID,
    SQLITE_CONSTRAINT_PINNED,
    SQLITE_CONSTRAINT_DATATYPE,
    SQLITE_NOTICE_RECOVER_WAL,
    SQLITE_NOTICE_RECOVER_ROLLBACK,
    SQLITE_WARNING_AUTOINDEX,
    SQLITE_AUTH_USER,
    SQLITE_OK_LOAD_PERMANENTLY,
];

/// The table as the JSON object written to `examples/sqlite-codes.json`.
pub fn table() -> Value {
    let mut m = Map::new();
    for (name, code) in CODES {
        m.insert((*name).to_string(), (*code).into());
    }
    Value::Object(m)
}

pub fn run(_: Args) -> i32 {
    let text = serde_json::to_string_pretty(&table()).unwrap_or_default();
    if super::emit(&text) {
        crate::exit::OK
    } else {
        crate::exit::FAILURE
    }
}
