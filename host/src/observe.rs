//! Turning what the host saw into the policy's observation.

use rusqlite::Connection;
use turnsafe_policy::{Evidence, Observation, Operation};

/// The codes and message of a rusqlite error, if it came from SQLite.
pub fn sqlite_parts(err: &rusqlite::Error) -> (Option<i64>, Option<i64>, String) {
    match err {
        rusqlite::Error::SqliteFailure(e, msg) => {
            let ext = i64::from(e.extended_code);
            let message = msg.clone().unwrap_or_else(|| e.to_string());
            (Some(ext & 0xff), Some(ext), message)
        }
        other => (None, None, other.to_string()),
    }
}

/// The OS errno SQLite last saw on this connection (0 means none).
pub fn system_errno(conn: &Connection) -> Option<i64> {
    // SAFETY: the handle is valid for the life of `conn`; the call only
    // reads the connection's saved errno.
    let e = unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) };
    (e != 0).then_some(i64::from(e))
}

/// Build an observation of a failed SQLite call, with the evidence the
/// caller's own probes and knowledge of the statement establish.
pub fn observation(
    operation: Operation,
    err: &rusqlite::Error,
    errno: Option<i64>,
    evidence: Vec<Evidence>,
    attempt: u32,
    elapsed_ms: u64,
    seed: u64,
) -> Observation {
    let (code, extended_code, message) = sqlite_parts(err);
    // `fts_scope` is the caller's to add: only it knows whether the statement
    // it ran touched the index. A message naming the index proves nothing.
    let mut evidence = evidence;
    evidence.sort();
    evidence.dedup();
    Observation {
        operation,
        engine: turnsafe_policy::Engine::Sqlite,
        sqlstate: None,
        code,
        extended_code,
        message,
        errno,
        evidence,
        attempt,
        elapsed_ms,
        seed,
        lease: None,
    }
}

/// The policy's cause for a failed SQLite call outside a flush (a read,
/// an edit): what a caller is told alongside the error.
pub fn cause_of(operation: Operation, err: &rusqlite::Error) -> turnsafe_policy::Cause {
    let obs = observation(operation, err, None, Vec::new(), 1, 0, 0);
    turnsafe_policy::decide(&obs).classification.cause
}
