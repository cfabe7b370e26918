//! SQLite behind the backend seam: [`SessionStore`] performs the same
//! effects as the PostgreSQL executor, so [`crate::backend::Writer`] can
//! drive either.

use std::time::Instant;

use rusqlite::{OptionalExtension, params};
use serde_json::Value;
use turnsafe_policy::machine::{Failure, WritePlan};

use super::{Flush, SessionId, SessionStore, failure_of};
use crate::backend::{Backend, BackendError, Batch, Cursor, Identity, Lease, SearchReport};
use crate::capture::{Capture, CaptureError};

impl SessionStore {
    fn read_error(&self, e: rusqlite::Error) -> BackendError {
        BackendError::Unavailable {
            target: self.db_path.display().to_string(),
            message: e.to_string(),
        }
    }

    fn live(&self) -> Result<&rusqlite::Connection, BackendError> {
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

    fn write(
        &mut self,
        batch: &Batch<'_>,
        plan: &WritePlan,
        cursor: &mut Cursor,
        lease: &Lease,
    ) -> Result<(), Failure> {
        self.opts.holder = lease.holder.clone();
        self.opts.lease_ttl = std::time::Duration::from_millis(lease.ttl_ms.max(0) as u64);
        let key = batch.session.as_str().to_string();
        let state = self.sessions.entry(key.clone()).or_default();
        state.lease_token = cursor.lease_token.clone();
        state.next_seq = cursor.next_seq;
        let flush = Flush {
            session: batch.session,
            messages: batch.messages,
            uids: batch.uids.to_vec(),
            started: Instant::now(),
        };
        let mut result = self.write_group(&[(&flush, *plan)]);
        if let Some(state) = self.sessions.get(&key) {
            cursor.lease_token = state.lease_token.clone();
            cursor.next_seq = state.next_seq;
        }
        match result.each.pop().flatten().or(result.group) {
            None => Ok(()),
            Some(f) => Err(super::failure_of_write(&f, flush.elapsed_ms())),
        }
    }

    fn resolve(&mut self, session: &str, uids: &[String]) -> Result<bool, Failure> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(failure_of(&rusqlite::Error::InvalidQuery, None, Vec::new(), 0));
        };
        super::group::all_stored(conn, session, uids).map_err(|e| failure_of(&e, None, Vec::new(), 0))
    }

    fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError> {
        let conn = self.live()?;
        let mut stmt = conn
            .prepare_cached("SELECT 1 FROM messages WHERE session_id = ?1 AND uid = ?2")
            .map_err(|e| self.read_error(e))?;
        let mut out = Vec::new();
        for uid in uids {
            let found = stmt
                .query_row(params![session, uid], |_| Ok(()))
                .optional()
                .map_err(|e| self.read_error(e))?;
            if found.is_some() {
                out.push(uid.clone());
            }
        }
        Ok(out)
    }

    fn transcript(&mut self, session: &str) -> Result<Vec<Value>, BackendError> {
        transcript(self.live()?, session).map_err(|e| self.read_error(e))
    }

    fn search(&mut self, query: &str, session: Option<&str>, limit: usize) -> Result<SearchReport, BackendError> {
        let opts = crate::search::SearchOptions {
            session: session.map(String::from),
            limit,
            ..crate::search::SearchOptions::default()
        };
        let writable = !self.opts.read_only;
        match crate::search::search_in(self.live()?, writable, query, &opts) {
            Ok(report) => Ok(SearchReport {
                hits: report.hits,
                unindexed: report.unindexed,
            }),
            Err(crate::search::SearchError::EmptyQuery) => Err(BackendError::EmptyQuery),
            Err(e) => Err(BackendError::Unavailable {
                target: self.db_path.display().to_string(),
                message: e.to_string(),
            }),
        }
    }

    fn identity(&mut self) -> Result<Identity, BackendError> {
        let conn = self.live()?;
        let generation: String = conn
            .query_row("SELECT value FROM state_meta WHERE key = 'generation'", [], |r| {
                r.get(0)
            })
            .map_err(|e| self.read_error(e))?;
        Ok(Identity {
            generation,
            location: self.db_path.display().to_string(),
        })
    }

    fn release_lease(&mut self, session: &str, token: &str) {
        if let Ok(id) = SessionId::new(session) {
            self.sessions.entry(session.to_string()).or_default().lease_token = Some(token.to_string());
            SessionStore::release_lease(self, &id);
        }
    }

    fn capture(&mut self, trigger: &str) -> Result<Capture, CaptureError> {
        self.retire_generation(trigger, &[]).unwrap_or_else(|| {
            Err(CaptureError {
                operation: "read",
                file: None,
                errno: None,
                message: "no retired generation is recorded by this handle".into(),
            })
        })
    }
}

/// A session's stored messages in `seq` order, as `show --json` prints them.
pub fn transcript(conn: &rusqlite::Connection, session: &str) -> rusqlite::Result<Vec<Value>> {
    Ok(crate::transcript::stored_messages(conn, session, None)?
        .iter()
        .map(crate::transcript::StoredMessage::to_value)
        .collect())
}
