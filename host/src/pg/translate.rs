//! PostgreSQL failures in the policy's terms.
//!
//! Every failure reaches the policy as `engine: postgres` with its
//! SQLSTATE. The policy reads the SQLSTATE classes it knows first
//! (`docs/POLICY.md`); for any other it falls back to the SQLite code this
//! module translates the failure onto, the one place that says which code
//! a PostgreSQL failure stands for. A failure that never reached the
//! server has no SQLSTATE from it, so this module gives the one libpq
//! gives: 08001 for a connection never made (or not ready within the
//! connect timeout), 08006 for one lost, 08003 when none is held; a failed
//! TLS handshake (configuration) gets none and stays `disk`. A failed
//! COMMIT carries the evidence `commit_sent`. Every message carries the
//! SQLSTATE, e.g.
//! `postgres SQLSTATE 55P03: canceling statement due to lock timeout`;
//! a handshake that failed for a reason the copy names has it first, e.g.
//! `postgres SQLSTATE none: the server does not offer TLS: error performing
//! TLS handshake: server does not support TLS` (see
//! [`turnsafe_policy::TlsFailure`]).

use turnsafe_policy::codes;
use turnsafe_policy::machine::Failure;

/// What went wrong, as the executor saw it.
pub enum Fault<'a> {
    /// Connecting failed.
    Connect(&'a postgres::Error),
    /// The client or the server said no, on a live connection.
    Client(&'a postgres::Error),
    /// COMMIT was sent and failed: its answer may be lost.
    Commit(&'a postgres::Error),
    /// The server accepted the TCP connection and did not complete the
    /// startup in time (a stopped server, a pooler waiting for its own).
    ConnectStalled { after: std::time::Duration },
    /// No thread could be started for the connection (a process at its
    /// thread limit).
    NoThread(&'a std::io::Error),
    /// The target could not be used at all (unreadable `sslrootcert`).
    Config(&'a super::url::UrlError),
    /// No connection is held (the server dropped it earlier).
    NotConnected,
    /// A uid of the batch is stored with different content.
    UidConflict,
    /// The database was written by a newer turnsafe.
    NewerSchema { found: i64 },
}

/// The SQLite code a failure stands for: `(code, extended_code)`.
///
/// - No SQLSTATE (refused, reset, closed, timed out, TLS), class 08
///   (connection exception) and 57P01-57P03 (the server shutting down or
///   starting): `SQLITE_IOERR` (10), so `disk`: the batch is diverted and
///   the next batch connects again.
/// - 55P03 (lock not available, `lock_timeout`), 40001 (serialization
///   failure), 40P01 (deadlock): `SQLITE_BUSY` (5), so `locked`: retried
///   on the policy's plan.
/// - 25006 (read-only transaction, `default_transaction_read_only`, a hot
///   standby): `SQLITE_READONLY` (8), so `disk`.
/// - 53100 (disk full): `SQLITE_FULL` (13), so `disk_full`.
/// - 3D000 (no such database), 53300 (too many connections):
///   `SQLITE_CANTOPEN` (14), so `disk`.
/// - class 28 (authentication): `SQLITE_AUTH` (23), so `disk`.
/// - XX001, XX002 (data or index corrupted): `SQLITE_CORRUPT` (11), sticky.
/// - 23503 on a message insert (the session row is gone):
///   `SQLITE_CONSTRAINT_FOREIGNKEY` (787), so `session_row_missing`.
/// - a uid stored with different content: `SQLITE_CONSTRAINT_UNIQUE`
///   (2067), so `uid_conflict`, handed back as with SQLite.
/// - anything else: no code, and the policy reads no text beside a
///   SQLSTATE: `unknown` (diverted).
pub fn sqlite_codes(sqlstate: Option<&str>) -> (Option<i64>, Option<i64>) {
    let primary = |c: i64| (Some(c), None);
    match sqlstate {
        None => primary(codes::IOERR),
        Some(s) if s.starts_with("08") => primary(codes::IOERR),
        Some("57P01" | "57P02" | "57P03") => primary(codes::IOERR),
        Some("55P03" | "40001" | "40P01") => primary(codes::BUSY),
        Some("25006") => primary(codes::READONLY),
        Some("53100") => primary(codes::FULL),
        Some("3D000" | "53300") => primary(codes::CANTOPEN),
        Some(s) if s.starts_with("28") => primary(codes::AUTH),
        Some("XX001" | "XX002") => primary(codes::CORRUPT),
        Some("23503") => (Some(codes::CONSTRAINT), Some(codes::CONSTRAINT_FOREIGNKEY)),
        Some(_) => (None, None),
    }
}

/// Whether `e`, inside a group's transaction, ends that transaction rather
/// than only the savepoint it came in: the policy decides
/// (`failure_scope`) from the SQLSTATE the failure carries. PostgreSQL
/// keeps even an aborted transaction open until ROLLBACK, so whether it
/// lives is the SQLSTATE's to say.
pub fn ends_transaction(e: &postgres::Error) -> bool {
    use turnsafe_policy::machine::{Scope, failure_scope};
    let obs = failure(&Fault::Client(e), 0).into_observation(turnsafe_policy::Operation::AppendBatch);
    failure_scope(&obs, true) == Scope::Transaction
}

/// The failure the flush machine takes.
pub fn failure(fault: &Fault<'_>, elapsed_ms: u64) -> Failure {
    let (sqlstate, text, errno) = match fault {
        Fault::Connect(e) | Fault::Client(e) | Fault::Commit(e) => {
            // The client library's own SQLSTATE when the server never
            // answered. A TLS handshake that fails (an unknown CA, a server
            // without TLS under `require`) is configuration, not a server
            // away for a while: no SQLSTATE, so it is not waited for.
            let lost = match fault {
                _ if e.to_string().starts_with(super::connect::TLS_HANDSHAKE) => None,
                Fault::Connect(_) => Some("08001"),
                _ => Some("08006"),
            };
            let sqlstate = e.code().map(|c| c.code()).or(lost).map(String::from);
            let text = match (e.as_db_error(), super::connect::tls_failure(e)) {
                (Some(db), _) => db.message().to_string(),
                // The reason the copy names, before the client's own text.
                (None, Some(tls)) => format!("{}: {}", tls.text(), chain_text(e)),
                (None, None) => chain_text(e),
            };
            (sqlstate, text, io_errno(e))
        }
        Fault::Config(e) => (None, e.to_string(), None),
        Fault::ConnectStalled { after } => (
            Some("08001".to_string()),
            format!(
                "the server accepted the connection but did not complete the startup within {} ms",
                after.as_millis()
            ),
            None,
        ),
        Fault::NoThread(e) => (
            None,
            format!("no thread to connect on: {e}"),
            e.raw_os_error().map(i64::from),
        ),
        Fault::NotConnected => (
            Some("08003".to_string()),
            "no connection to the server".to_string(),
            None,
        ),
        Fault::UidConflict => (
            Some("23505".to_string()),
            "a uid of the batch is stored with different content".to_string(),
            None,
        ),
        Fault::NewerSchema { found } => (
            None,
            format!("the database has schema version {found}, newer than this turnsafe knows"),
            None,
        ),
    };
    let (code, extended_code) = match fault {
        Fault::Config(_) => (Some(codes::CANTOPEN), None),
        Fault::UidConflict => (Some(codes::CONSTRAINT), Some(codes::CONSTRAINT_UNIQUE)),
        Fault::NewerSchema { .. } => (None, None),
        Fault::NotConnected
        | Fault::Connect(_)
        | Fault::Client(_)
        | Fault::Commit(_)
        | Fault::ConnectStalled { .. }
        | Fault::NoThread(_) => sqlite_codes(sqlstate.as_deref()),
    };
    let evidence = match fault {
        Fault::Commit(_) => vec![turnsafe_policy::Evidence::CommitSent],
        _ => Vec::new(),
    };
    Failure {
        engine: turnsafe_policy::Engine::Postgres,
        sqlstate: sqlstate.clone(),
        code,
        extended_code,
        message: format!("postgres SQLSTATE {}: {text}", sqlstate.as_deref().unwrap_or("none")),
        errno,
        evidence,
        elapsed_ms,
        lease: None,
    }
}

/// The error and its causes, joined: the client's own text is terse
/// ("error connecting to server") and the cause says why.
pub fn chain_text(e: &postgres::Error) -> String {
    use std::error::Error;
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    text
}

/// The OS errno under a client error (connection refused, reset, ...).
fn io_errno(e: &postgres::Error) -> Option<i64> {
    use std::error::Error;
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error().map(i64::from);
        }
        source = s.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnsafe_policy::{Cause, Observation, Operation, classify};

    fn cause(sqlstate: &str, evidence: Vec<turnsafe_policy::Evidence>) -> Cause {
        let (code, extended_code) = sqlite_codes(Some(sqlstate));
        classify(&Observation {
            engine: turnsafe_policy::Engine::Postgres,
            sqlstate: Some(sqlstate.to_string()),
            code,
            extended_code,
            message: format!("postgres SQLSTATE {sqlstate}: x"),
            evidence,
            ..Observation::new(Operation::AppendBatch)
        })
        .cause
    }

    #[test]
    fn each_sqlstate_lands_on_the_cause_docs_name() {
        for (state, expected) in [
            ("08001", Cause::Unavailable),
            ("08006", Cause::Unavailable),
            ("57P01", Cause::Unavailable),
            ("53300", Cause::Unavailable),
            ("55P03", Cause::Locked),
            ("40001", Cause::Locked),
            ("40P01", Cause::Locked),
            ("25006", Cause::ReadOnly),
            ("53100", Cause::DiskFull),
            ("3D000", Cause::Disk),
            ("28P01", Cause::Disk),
            ("XX001", Cause::Corrupt),
            ("23503", Cause::SessionRowMissing),
            ("42601", Cause::Unknown),
        ] {
            assert_eq!(cause(state, Vec::new()), expected, "{state}");
        }
        let sent = || vec![turnsafe_policy::Evidence::CommitSent];
        assert_eq!(cause("08006", sent()), Cause::OutcomeUnknown);
        // The server answered the COMMIT: it says what happened.
        assert_eq!(cause("40001", sent()), Cause::Locked);
    }

    #[test]
    fn a_uid_conflict_is_the_sqlite_one() {
        let f = failure(&Fault::UidConflict, 0);
        assert_eq!(f.extended_code, Some(2067));
        assert!(f.message.starts_with("postgres SQLSTATE 23505: "));
    }
}
