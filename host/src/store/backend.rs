//! SQLite behind the backend seam: [`SessionStore`] performs the same
//! effects as the PostgreSQL store, so the one executor
//! ([`crate::backend::group`]) drives either.

use std::time::Instant;

use serde_json::Value;
use turnsafe_policy::machine::{Failure, WritePlan};

use turnsafe_policy::Evidence;

use super::{SessionId, SessionStore, failure_of};
use crate::backend::{Backend, BackendError, Flush, GroupWrite, Ledger};
use crate::capture::{Capture, CaptureError};
use crate::message::Message;

impl SessionStore {
    pub(super) fn read_error(&self, e: rusqlite::Error) -> BackendError {
        BackendError::Unavailable {
            target: self.db_path.display().to_string(),
            message: e.to_string(),
        }
    }

    pub(super) fn live(&self) -> Result<&rusqlite::Connection, BackendError> {
        self.conn.as_ref().ok_or_else(|| BackendError::Unavailable {
            target: self.db_path.display().to_string(),
            message: "the store is not open".into(),
        })
    }
}

impl Backend for SessionStore {
    fn location(&self) -> String {
        self.db_path.display().to_string()
    }

    fn is_open(&self) -> bool {
        self.conn.is_some()
    }

    fn durability(&self) -> turnsafe_policy::Durability {
        self.opts.synchronous.durability()
    }

    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// The unsettled captures under the home that hold some session's
    /// rows, looked for before every group: a capture another process made
    /// since the last group counts at once. The home is read again only
    /// when it changed ([`crate::captures::HoldsWatch`]).
    fn pending_holds(&mut self) -> Vec<crate::captures::Hold> {
        match self.holds_watch.holds(&self.home) {
            Ok(h) => h,
            Err(e) => {
                // The open that follows meets whatever keeps the home from
                // being read, and fails with its own cause.
                tracing::warn!(error = %e, "cannot list the home's captures");
                Vec::new()
            }
        }
    }

    fn patience_ms(&self, started: Instant) -> u64 {
        self.lock_watch.stalled_ms(started)
    }

    /// A failed open's connection, if SQLite made one, is held until the
    /// next open or the handle's end, so a quarantined file is opened once.
    fn open(&mut self) -> Result<(), Failure> {
        let failure = match self.open_failure.take() {
            Some(f) => f,
            None => {
                self.quarantined = None;
                match self.ensure_open() {
                    Ok(()) => return Ok(()),
                    Err(f) => f,
                }
            }
        };
        let super::OpenFailure { error, errno, conn } = *failure;
        self.quarantined = conn;
        Err(failure_of(&error, errno, Vec::new(), 0))
    }

    fn write_group(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> GroupWrite {
        let written = self.commit_group(batches);
        let failure = |f: &super::write::WriteFailure| super::failure_of_write(f, 0);
        GroupWrite {
            group: written.group.as_ref().map(failure),
            each: written.each.iter().map(|f| f.as_ref().map(failure)).collect(),
        }
    }

    /// SQLite always knows how its COMMIT ended, so the machine asks this
    /// only of hosts that lost an answer; it is answered all the same, from
    /// the live connection.
    fn resolve(&mut self, session: &str, uids: &[String], messages: &[Message]) -> Result<bool, Failure> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(failure_of(&rusqlite::Error::InvalidQuery, None, Vec::new(), 0));
        };
        all_stored(conn, session, uids, messages).map_err(|e| failure_of(&e, None, Vec::new(), 0))
    }

    fn resolve_graph(&mut self, graph: &crate::graph::GraphBatch) -> Result<bool, Failure> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(failure_of(&rusqlite::Error::InvalidQuery, None, Vec::new(), 0));
        };
        super::graph::resolve(conn, graph).map_err(|e| failure_of(&e, None, Vec::new(), 0))
    }

    /// Once per handle: a later ask gets the first capture's result.
    fn capture(&mut self, trigger: &str, evidence: &[Evidence]) -> Result<Capture, CaptureError> {
        match self.retire_generation(trigger, evidence) {
            Some(result) => result,
            // Already tried by this handle, or no generation was recorded
            // (the guard is off).
            None => match &self.captured {
                Some(result) => result.clone(),
                None => Err(CaptureError {
                    operation: "read",
                    file: None,
                    errno: None,
                    message: "no retired generation is recorded by this handle".into(),
                }),
            },
        }
    }

    /// Release every lease this handle holds, in one transaction (one
    /// sync, however many sessions it wrote to).
    fn release_all_leases(&mut self) {
        let held: Vec<(String, String)> = self
            .ledger
            .sessions
            .iter_mut()
            .filter_map(|(id, s)| Some((id.clone(), s.lease_token.take()?)))
            .collect();
        let (Some(conn), None) = (&self.conn, self.ledger.handle.sticky) else {
            return;
        };
        if held.is_empty() {
            return;
        }
        let released = (|| -> rusqlite::Result<()> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let mut release = conn.prepare_cached(
                "UPDATE sessions SET lease_token = NULL, lease_holder = NULL, lease_expires_ms = NULL \
                 WHERE id = ?1 AND lease_token = ?2",
            )?;
            for (id, token) in &held {
                release.execute(rusqlite::params![id, token])?;
            }
            conn.execute_batch("COMMIT")
        })();
        if let Err(e) = released {
            // The leases then expire on their own.
            tracing::warn!(error = %e, sessions = held.len(), "could not release the turn leases");
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
    }

    /// Release this handle's lease on `session` (end of input).
    fn release_lease(&mut self, session: &SessionId) {
        let token = self
            .ledger
            .sessions
            .get(session.as_str())
            .and_then(|s| s.lease_token.clone());
        if let (Some(conn), Some(token), None) = (&self.conn, token, self.ledger.handle.sticky) {
            if let Some(s) = self.ledger.sessions.get_mut(session.as_str()) {
                s.lease_token = None;
            }
            let _ = conn.execute(
                "UPDATE sessions SET lease_token = NULL, lease_holder = NULL, lease_expires_ms = NULL \
                 WHERE id = ?1 AND lease_token = ?2",
                rusqlite::params![session.as_str(), token],
            );
        }
    }
}

/// Whether every one of `messages` is stored for `session` under its uid
/// (`uids`, in the same order) with its own bytes ([`crate::same`]).
pub(super) fn all_stored(
    conn: &rusqlite::Connection,
    session: &str,
    uids: &[String],
    messages: &[Message],
) -> rusqlite::Result<bool> {
    if uids.len() != messages.len() {
        return Ok(false);
    }
    for (uid, m) in uids.iter().zip(messages) {
        if !crate::rows::same_row(conn, session, uid, m)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A session's stored messages in `seq` order, as `show --json` prints them.
pub fn transcript(conn: &rusqlite::Connection, session: &str) -> rusqlite::Result<Vec<Value>> {
    Ok(crate::transcript::stored_messages(conn, session, None)?
        .iter()
        .map(crate::transcript::StoredMessage::to_value)
        .collect())
}
