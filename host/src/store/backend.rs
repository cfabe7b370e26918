//! SQLite behind the backend seam: [`SessionStore`] performs the same
//! effects as the PostgreSQL store, so the one executor
//! ([`crate::backend::group`]) drives either.

use std::time::Instant;

use rusqlite::{OptionalExtension, params};
use serde_json::Value;
use turnsafe_policy::machine::{Failure, WritePlan};

use turnsafe_policy::Evidence;

use super::{EditError, SessionId, SessionStore, failure_of};
use crate::backend::{
    Backend, BackendError, Flush, GroupWrite, History, Identity, Ledger, ReadError, SearchReport, readable,
};
use crate::capture::{Capture, CaptureError};
use crate::history::{Archived, Cleared, ForkRefused, ForkReport, Lineage, RestoreReport, Selector};
use crate::message::Message;
use crate::transcript::StoredMessage;

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

    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    fn pending_holds(&self) -> Vec<crate::captures::Hold> {
        SessionStore::pending_holds(self)
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

    fn release_all_leases(&mut self) {
        SessionStore::release_all_leases(self)
    }

    fn release_lease(&mut self, session: &SessionId) {
        SessionStore::release_lease(self, session)
    }
}

impl History for SessionStore {
    fn graph_read(
        &mut self,
        query: &crate::graph::GraphQuery,
    ) -> Result<Vec<crate::graph::StoredCheckpoint>, ReadError> {
        let db = self.db_path.clone();
        readable(self.ledger.handle.sticky, &db.display())?;
        if self.conn.is_none() {
            // Opening migrates: a home written before version 6 gains the
            // tables. A file that cannot be opened is held, as by a flush.
            if let Err(f) = self.ensure_open() {
                self.quarantined = f.conn;
            }
        }
        match self.conn.as_ref() {
            Some(conn) => super::graph::read(conn, query),
            None => super::open_read_only(&db).and_then(|conn| super::graph::read(&conn, query)),
        }
        .map_err(|e| ReadError {
            message: format!("reading {}: {e}", db.display()),
            cause: Some(crate::observe::cause_of(turnsafe_policy::Operation::Replay, &e)),
        })
    }

    fn graph_edit(&mut self, edit: &crate::graph::GraphEdit) -> Result<crate::graph::GraphEdited, EditError> {
        let session = edit.session();
        self.edit(edit.name(), &session, |conn, _| {
            super::graph::edit(conn, edit, crate::ids::now_ms())
        })
    }

    fn graph_delete_thread(
        &mut self,
        thread: &str,
        pending: &[crate::pending::PendingRecord],
    ) -> Result<crate::graph::GraphEdited, EditError> {
        let edit = crate::graph::GraphEdit::DeleteThread(thread.to_string());
        let session = edit.session();
        self.edit(edit.name(), &session, |conn, _| {
            let now = crate::ids::now_ms();
            super::graph_marks::store_pending(conn, pending, now)?;
            super::graph::edit(conn, &edit, now)
        })
    }

    fn rows(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<StoredMessage>, ReadError> {
        let db = self.db_path.clone();
        readable(self.ledger.handle.sticky, &db.display())?;
        match self.conn.as_ref() {
            Some(conn) => crate::transcript::stored_messages(conn, session, limit),
            // The writer could not open it; a reader may still.
            None => {
                super::open_read_only(&db).and_then(|conn| crate::transcript::stored_messages(&conn, session, limit))
            }
        }
        .map_err(|e| ReadError {
            message: format!("reading {}: {e}", db.display()),
            cause: Some(crate::observe::cause_of(turnsafe_policy::Operation::Replay, &e)),
        })
    }

    fn pop_last(&mut self, session: &SessionId) -> Result<Option<StoredMessage>, EditError> {
        SessionStore::pop_last(self, session)
    }

    fn clear_session(&mut self, session: &SessionId) -> Result<u64, EditError> {
        SessionStore::clear_session(self, session)
    }

    fn clear_archiving(
        &mut self,
        session: &SessionId,
        pending: &[crate::pending::PendingMessage],
    ) -> Result<Cleared, EditError> {
        SessionStore::clear_archiving(self, session, pending)
    }

    fn archived(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<Archived>, ReadError> {
        SessionStore::archived(self, session, limit)
    }

    fn restore(&mut self, session: &SessionId, selector: &Selector) -> Result<RestoreReport, EditError> {
        SessionStore::restore(self, session, selector)
    }

    fn fork(
        &mut self,
        session: &SessionId,
        at_seq: i64,
        new_session: &SessionId,
    ) -> Result<Result<ForkReport, ForkRefused>, EditError> {
        SessionStore::fork(self, session, at_seq, new_session)
    }

    fn replace_suffix(
        &mut self,
        session: &SessionId,
        start_seq: i64,
        items: &[crate::message::Message],
        expected: Option<&[String]>,
        prune_below: Option<i64>,
    ) -> Result<bool, EditError> {
        SessionStore::replace_suffix(self, session, start_seq, items, expected, prune_below)
    }

    fn lineage(&mut self, session: &str) -> Option<Lineage> {
        SessionStore::lineage(self, session)
    }

    fn prune(&mut self, opts: &crate::history::PruneOptions) -> Result<crate::history::PruneReport, EditError> {
        SessionStore::prune(self, opts)
    }

    fn delete_session(&mut self, session: &SessionId) -> Result<(u64, u64), EditError> {
        SessionStore::delete_session(self, session)
    }

    fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError> {
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
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
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
        transcript(self.live()?, session).map_err(|e| self.read_error(e))
    }

    fn search(
        &mut self,
        query: &str,
        session: Option<&str>,
        limit: usize,
        archived: bool,
    ) -> Result<SearchReport, BackendError> {
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
        let opts = crate::store::search::SearchOptions {
            session: session.map(String::from),
            limit,
            archived,
            ..crate::store::search::SearchOptions::default()
        };
        let writable = !self.opts.read_only;
        match crate::store::search::search_in(self.live()?, writable, query, &opts) {
            Ok(report) => Ok(SearchReport {
                hits: report.hits,
                unindexed: report.unindexed,
            }),
            Err(crate::store::search::SearchError::EmptyQuery) => Err(BackendError::EmptyQuery),
            Err(e) => Err(BackendError::Unavailable {
                target: self.db_path.display().to_string(),
                message: e.to_string(),
            }),
        }
    }

    fn identity(&mut self) -> Result<Identity, BackendError> {
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
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
