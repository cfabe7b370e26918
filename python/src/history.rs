//! A session's history on `Store`: its reads (`show`, `rows`, `lineage`)
//! and its edits (`pop`, `clear`, `restore`, `fork`, `replace_suffix`,
//! `delete_session`), and the ones an event loop hands over without
//! waiting (`_show_then`, `_pop_then`, `_clear_then`). An edit follows
//! the policy, and raises `Error` with the policy's `cause` when it
//! cannot be done.

use std::path::Path;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use serde_json::Value;
use turnsafe_host::backend::Engine;
use turnsafe_host::history::{Reason, Selector};
use turnsafe_host::store::SessionId;
use turnsafe_host::transcript::StoredMessage;

use crate::aio::Completions;
use crate::args::{parse_session, read_limit};
use crate::convert::{batch, map_to_py, to_py};
use crate::errors::{Failed, refused};
use crate::store::Store;

#[pymethods]
impl Store {
    /// The newest `limit` messages of the session (all with `None`), in
    /// `seq` order, each exactly as it was written. With `archived=True`,
    /// the session's archived rows instead (what `pop`, `clear`, a
    /// compaction took out), newest archived first, each a dict
    /// `{"uid", "seq", "message", "archived_at", "reason"}`.
    #[pyo3(signature = (session_id, *, limit = None, archived = false))]
    fn show<'py>(
        &self,
        py: Python<'py>,
        session_id: &str,
        limit: Option<i64>,
        archived: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        if archived {
            let session = parse_session(py, session_id)?;
            let limit = read_limit(limit)?;
            let store = self.shared(py)?;
            let rows = py
                .detach(move || store.with_store(|s| s.archived(session.as_str(), limit)))
                .map_err(|e| Failed::of_read(e).into_err(py))?;
            let list = PyList::empty(py);
            for a in &rows {
                list.append(to_py(py, &a.to_value())?)?;
            }
            return Ok(list);
        }
        let rows = self.read(py, session_id, limit, false)?;
        let list = PyList::empty(py);
        for r in &rows {
            list.append(map_to_py(py, &r.message)?)?;
        }
        Ok(list)
    }

    /// Like `show`, with each message's uid and seq beside it:
    /// `{"uid", "seq", "message"}`, as `turnsafe show --json` prints them.
    #[pyo3(signature = (session_id, *, limit = None))]
    fn rows<'py>(&self, py: Python<'py>, session_id: &str, limit: Option<i64>) -> PyResult<Bound<'py, PyList>> {
        let rows = self.read(py, session_id, limit, true)?;
        let list = PyList::empty(py);
        for r in &rows {
            list.append(to_py(py, &r.to_value())?)?;
        }
        Ok(list)
    }

    /// Remove and return the newest message of the session (`None` when it
    /// has none). A write: it follows the policy, and raises `Error` with
    /// the policy's `cause` when it cannot be done.
    fn pop<'py>(&self, py: Python<'py>, session_id: &str) -> PyResult<Bound<'py, PyAny>> {
        let session = parse_session(py, session_id)?;
        let store = self.shared(py)?;
        match py.detach(move || store.with_store(|s| pop_in(s, &session))) {
            Ok(v) => to_py(py, &v),
            Err(failed) => Err(failed.into_err(py)),
        }
    }

    /// Remove every message of the session, and settle its pending divert
    /// lines as `cleared` in the replay ledger (the files are kept in
    /// `sessions/settled/`). Returns how many stored messages went.
    fn clear(&self, py: Python<'_>, session_id: &str) -> PyResult<u64> {
        let session = parse_session(py, session_id)?;
        let store = self.shared(py)?;
        let home = self.home.clone();
        py.detach(move || store.with_store(|s| clear_in(s, &home, &session)))
            .map_err(|failed| failed.into_err(py))
    }

    /// Bring archived rows back into the session, at their seqs, in one
    /// transaction: `uids` (each its newest archived copy), or every row
    /// archived for `reason` (`"pop"`, `"clear"`, `"compaction"`,
    /// `"rewind"`, `"prune"`), at or after `since` (seconds since the
    /// epoch) when given. A uid active again is skipped. `reason="delete"`
    /// brings back the LangGraph rows a `delete_thread` of the thread
    /// whose safe id is `session_id` marked, its pending lines included.
    /// Returns `{"restored": [{"uid", "seq"}], "skipped_active",
    /// "not_archived", "checkpoints_restored", "writes_restored"}`.
    #[pyo3(signature = (session_id, *, uids = None, reason = None, since = None))]
    fn restore<'py>(
        &self,
        py: Python<'py>,
        session_id: &str,
        uids: Option<Vec<String>>,
        reason: Option<&str>,
        since: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let session = parse_session(py, session_id)?;
        let selector = match (uids, reason) {
            (Some(u), None) => Selector::Uids(u),
            (None, Some(r)) => {
                let reason =
                    Reason::from_label(r).ok_or_else(|| PyValueError::new_err(format!("unknown reason {r:?}")))?;
                let since_ms = since.map(|s| (s * 1000.0) as i64);
                Selector::Reason { reason, since_ms }
            }
            _ => return Err(PyValueError::new_err("give uids=[...] or reason=..., not both")),
        };
        let store = self.shared(py)?;
        match py.detach(move || store.with_store(|s| s.restore(&session, &selector))) {
            Ok(report) => to_py(py, &report.to_value()),
            Err(e) => Err(Failed::of_edit(&e).into_err(py)),
        }
    }

    /// Copy the session's messages up to and including `at_seq` into
    /// `new_session`, in one transaction, keeping the lineage. A retried
    /// fork stores nothing twice. Returns `{"source", "at_seq", "session",
    /// "copied", "already"}`; raises `Refused` when `new_session` exists
    /// and is not that fork.
    fn fork<'py>(
        &self,
        py: Python<'py>,
        session_id: &str,
        at_seq: i64,
        new_session: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let session = parse_session(py, session_id)?;
        let new = parse_session(py, new_session)?;
        let store = self.shared(py)?;
        match py.detach(move || store.with_store(|s| s.fork(&session, at_seq, &new))) {
            Ok(Ok(report)) => to_py(py, &report.to_value()),
            Ok(Err(no)) => Err(refused(py, no.to_string())),
            Err(e) => Err(Failed::of_edit(&e).into_err(py)),
        }
    }

    /// Replace the session's messages from `start_seq` on with `items`, in
    /// one transaction; what was replaced goes to the archive (reason
    /// `compaction`), and with `prune_before` the messages before that seq
    /// too. With `expected_uids`, nothing changes and `False` is returned
    /// unless the stored suffix is exactly those uids. Raises `Error` when
    /// storage fails; nothing is then changed.
    #[pyo3(signature = (session_id, start_seq, items, *, expected_uids = None, prune_before = None))]
    fn replace_suffix(
        &self,
        py: Python<'_>,
        session_id: &str,
        start_seq: i64,
        items: &Bound<'_, PyAny>,
        expected_uids: Option<Vec<String>>,
        prune_before: Option<i64>,
    ) -> PyResult<bool> {
        let session = parse_session(py, session_id)?;
        let batch = batch(items, None)?;
        let store = self.shared(py)?;
        py.detach(move || {
            store.with_store(|s| s.replace_suffix(&session, start_seq, &batch, expected_uids.as_deref(), prune_before))
        })
        .map_err(|e| Failed::of_edit(&e).into_err(py))
    }

    /// Delete the session for good: its messages, its archive and its
    /// lineage; its pending divert lines are settled as `cleared`. Raises
    /// `Error` (cause `turn_lease`) while another writer holds its lease.
    /// Returns `{"deleted", "archived_deleted"}`.
    fn delete_session<'py>(&self, py: Python<'py>, session_id: &str) -> PyResult<Bound<'py, PyAny>> {
        let session = parse_session(py, session_id)?;
        let store = self.shared(py)?;
        let home = self.home.clone();
        // The pending lines read are settled with the delete, exactly those.
        let done = py.detach(move || {
            store.with_store(|s| {
                turnsafe_host::clear::settle_with(
                    &home,
                    session.as_str(),
                    "delete",
                    turnsafe_host::clear::Settlement::Cleared,
                    |_| s.delete_session(&session),
                )
            })
        });
        match done {
            Ok(((rows, archived), _)) => to_py(py, &serde_json::json!({"deleted": rows, "archived_deleted": archived})),
            Err(e) => Err(Failed::of_clear(&e).into_err(py)),
        }
    }

    /// The session's lineage when it is a fork: `{"session", "seq"}`, else `None`.
    fn lineage<'py>(&self, py: Python<'py>, session_id: &str) -> PyResult<Bound<'py, PyAny>> {
        let session = parse_session(py, session_id)?;
        let store = self.shared(py)?;
        let found = py.detach(move || store.with_store(|s| s.lineage(session.as_str())));
        to_py(py, &found.map_or(Value::Null, |l| l.to_value()))
    }

    /// `show`, `pop` and `clear` without waiting (for an event loop): run
    /// on the store's committer thread after everything handed over
    /// before, the result reaching `completions` under `ticket`.
    #[pyo3(name = "_show_then", signature = (completions, ticket, session_id, *, limit = None))]
    fn show_then(
        &self,
        py: Python<'_>,
        completions: &Completions,
        ticket: u64,
        session_id: &str,
        limit: Option<i64>,
    ) -> PyResult<()> {
        let session = parse_session(py, session_id)?;
        let limit = read_limit(limit)?;
        self.call_then(py, completions, ticket, move |s| {
            read_in(s, &session, limit, false)
                .map(|rows| Value::Array(rows.into_iter().map(|r| Value::Object(r.message)).collect()))
        })
    }

    #[pyo3(name = "_pop_then")]
    fn pop_then(&self, py: Python<'_>, completions: &Completions, ticket: u64, session_id: &str) -> PyResult<()> {
        let session = parse_session(py, session_id)?;
        self.call_then(py, completions, ticket, move |s| pop_in(s, &session))
    }

    #[pyo3(name = "_clear_then")]
    fn clear_then(&self, py: Python<'_>, completions: &Completions, ticket: u64, session_id: &str) -> PyResult<()> {
        let session = parse_session(py, session_id)?;
        let home = self.home.clone();
        self.call_then(py, completions, ticket, move |s| {
            clear_in(s, &home, &session).map(Value::from)
        })
    }
}

impl Store {
    fn read(&self, py: Python<'_>, session_id: &str, limit: Option<i64>, full: bool) -> PyResult<Vec<StoredMessage>> {
        let session = parse_session(py, session_id)?;
        let limit = read_limit(limit)?;
        let store = self.shared(py)?;
        py.detach(move || store.with_store(|s| read_in(s, &session, limit, full)))
            .map_err(|failed| failed.into_err(py))
    }
}

/// The newest `limit` rows of `session`, through the store's own
/// connection (a read-only one when the writer could not open it);
/// `HistoryIncomplete` (with the rows, as `full` `{uid, seq, message}`
/// objects or as messages) while an unsettled capture holds rows of it
/// that the database lacks.
fn read_in(
    s: &mut dyn Engine,
    session: &SessionId,
    limit: Option<u64>,
    full: bool,
) -> Result<Vec<StoredMessage>, Failed> {
    let rows = s.rows(session.as_str(), limit).map_err(Failed::of_read)?;
    let holds = s.pending_holds();
    let holding: Vec<_> = holds.into_iter().filter(|h| h.holds(session.as_str())).collect();
    if holding.is_empty() {
        return Ok(rows);
    }
    let rendered = rows
        .into_iter()
        .map(|r| if full { r.to_value() } else { Value::Object(r.message) })
        .collect();
    Err(Failed::incomplete(session, Value::Array(rendered), &holding))
}

/// Remove and return the newest message (`null` when there is none).
fn pop_in(s: &mut dyn Engine, session: &SessionId) -> Result<Value, Failed> {
    match s.pop_last(session) {
        Ok(m) => Ok(m.map_or(Value::Null, |m| Value::Object(m.message))),
        Err(e) => Err(Failed::of_edit(&e)),
    }
}

/// Remove every message, with the session's pending divert lines read,
/// then settle exactly those lines as `cleared`. A fenced clear leaves
/// them pending, and a read that fails clears nothing.
fn clear_in(s: &mut dyn Engine, home: &Path, session: &SessionId) -> Result<u64, Failed> {
    let report = turnsafe_host::clear::clear(s, home, session).map_err(|e| Failed::of_clear(&e))?;
    Ok(report.cleared.rows.len() as u64)
}
