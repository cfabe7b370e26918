//! `Store`: one turnsafe home, shared by every thread of the process, and
//! its batches. A session's reads and edits are in `history`, LangGraph's
//! checkpoints in `langgraph`; each adds its own methods to the class.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use serde_json::Value;
use turnsafe_host::backend::Engine;
use turnsafe_host::pg::DbUrl;
use turnsafe_host::store::{SharedStore, StoreOptions, Synchronous};

use crate::aio::{Completions, Done};
use crate::args::{expand_home, parse_session, resolve_db, writable};
use crate::convert::batch;
use crate::errors::{Failed, error};
use crate::outcome::Outcome;

/// The open store, and the process that opened it: a child of `fork`
/// must not touch its parent's connection.
struct Opened {
    pid: u32,
    store: SharedStore,
}

/// One turnsafe home, shared by every thread of the process.
#[pyclass(frozen, weakref, module = "turnsafe_store")]
pub(crate) struct Store {
    pub(crate) home: PathBuf,
    /// The PostgreSQL server, or `None` for SQLite under the home.
    db: Option<DbUrl>,
    opts: StoreOptions,
    /// The holder name given, or `None` for `pid-<pid>` of the process writing.
    holder: Option<String>,
    opened: Mutex<Option<Opened>>,
}

impl Store {
    fn opened(&self) -> MutexGuard<'_, Option<Opened>> {
        self.opened.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn options(&self) -> StoreOptions {
        let mut opts = self.opts.clone();
        opts.holder = self
            .holder
            .clone()
            .unwrap_or_else(|| format!("pid-{}", std::process::id()));
        opts
    }

    /// The store for this process, without the GIL. After a `fork` the
    /// child opens its own handle; the parent's is left untouched (never
    /// closed, never written) in the child.
    pub(crate) fn shared(&self, py: Python<'_>) -> PyResult<SharedStore> {
        let mut opened = self.opened();
        let pid = std::process::id();
        match opened.as_ref() {
            None => return Err(error(py, "the store is closed")),
            Some(o) if o.pid == pid => return Ok(o.store.clone()),
            Some(_) => {}
        }
        let (home, db, opts) = (self.home.clone(), self.db.clone(), self.options());
        let fresh = py
            .detach(move || crate::engine::open(&home, db.as_ref(), opts))
            .map_err(|e| error(py, e))?;
        if let Some(inherited) = opened.replace(Opened {
            pid,
            store: fresh.clone(),
        }) {
            // The parent's connection, locks and leases are not ours.
            std::mem::forget(inherited);
        }
        Ok(fresh)
    }

    /// Hand `work` to the committer thread; its answer reaches
    /// `completions` under `ticket` (a panic inside is answered as an error).
    pub(crate) fn call_then(
        &self,
        py: Python<'_>,
        completions: &Completions,
        ticket: u64,
        work: impl FnOnce(&mut dyn Engine) -> Result<Value, Failed> + Send + 'static,
    ) -> PyResult<()> {
        let store = self.shared(py)?;
        let lane = completions.lane();
        py.detach(move || {
            store.call_then(work, move |done| {
                let answer = done.unwrap_or_else(|| {
                    Err(Failed::new(
                        "the store's work failed unexpectedly (a panic); nothing was changed by it".into(),
                        None,
                    ))
                });
                lane.push(ticket, Done::Answer(answer))
            })
        });
        Ok(())
    }
}

impl Drop for Store {
    /// In a child of `fork` the parent's handle is not ours to close: closing
    /// it would give back the parent's leases from the child.
    fn drop(&mut self) {
        let opened = self.opened.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(o) = opened
            && o.pid != std::process::id()
        {
            std::mem::forget(o);
        }
    }
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (home, *, db = None, synchronous = "full", holder = None, lease_ttl = 30.0))]
    fn new(
        py: Python<'_>,
        home: PathBuf,
        db: Option<&str>,
        synchronous: &str,
        holder: Option<String>,
        lease_ttl: f64,
    ) -> PyResult<Self> {
        let db = writable(resolve_db(db)?)?;
        let synchronous = match synchronous.to_ascii_lowercase().as_str() {
            "full" => Synchronous::Full,
            "normal" => Synchronous::Normal,
            other => {
                return Err(PyValueError::new_err(format!(
                    "synchronous must be \"full\" or \"normal\", not {other:?}"
                )));
            }
        };
        if !(lease_ttl.is_finite() && lease_ttl > 0.0) {
            return Err(PyValueError::new_err("lease_ttl must be a positive number of seconds"));
        }
        if holder.as_deref().is_some_and(str::is_empty) {
            return Err(PyValueError::new_err("holder must not be empty"));
        }
        let mut store = Store {
            home: expand_home(home),
            db,
            opts: StoreOptions {
                synchronous,
                lease_ttl: Duration::from_secs_f64(lease_ttl),
                ..StoreOptions::default()
            },
            holder,
            opened: Mutex::new(None),
        };
        let (home, db, opts) = (store.home.clone(), store.db.clone(), store.options());
        let shared = py
            .detach(move || crate::engine::open(&home, db.as_ref(), opts))
            .map_err(|e| error(py, e))?;
        store.opened = Mutex::new(Some(Opened {
            pid: std::process::id(),
            store: shared,
        }));
        Ok(store)
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.opened().is_none()
    }

    /// The home folder (`state.db`, `sessions/`).
    #[getter]
    fn home(&self) -> PathBuf {
        self.home.clone()
    }

    /// Flush one batch: every message ends committed, diverted with a
    /// receipt, or handed back, and the outcome says which.
    #[pyo3(signature = (session_id, messages, *, uids = None))]
    fn append(
        &self,
        py: Python<'_>,
        session_id: &str,
        messages: &Bound<'_, PyAny>,
        uids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Outcome> {
        let session = parse_session(py, session_id)?;
        let batch = batch(messages, uids)?;
        let store = self.shared(py)?;
        Ok(py.detach(move || Outcome::of(&store.append_batch(&session, &batch))))
    }

    /// Hand one batch over without waiting (for an event loop): it joins
    /// the next group commit, and its outcome reaches `completions` under
    /// `ticket`. Bad input raises here, before anything is queued.
    #[pyo3(name = "_append_then", signature = (completions, ticket, session_id, messages, *, uids = None))]
    fn append_then(
        &self,
        py: Python<'_>,
        completions: &Completions,
        ticket: u64,
        session_id: &str,
        messages: &Bound<'_, PyAny>,
        uids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let session = parse_session(py, session_id)?;
        let batch = batch(messages, uids)?;
        let store = self.shared(py)?;
        let lane = completions.lane();
        py.detach(move || {
            store.append_batch_then(&session, batch, move |outcome| {
                lane.push(ticket, Done::Outcome(Outcome::of(&outcome)))
            });
        });
        Ok(())
    }

    /// Wait until every batch handed over with `_append_then` has settled
    /// (committed, diverted or handed back). Nothing to wait for on a
    /// closed store (closing settles them) or in a child of `fork`.
    #[pyo3(name = "_settle")]
    fn settle(&self, py: Python<'_>) {
        let store = match self.opened().as_ref() {
            Some(o) if o.pid == std::process::id() => o.store.clone(),
            _ => return,
        };
        py.detach(move || store.settle());
    }

    /// Give back this store's turn lease on the session.
    fn release(&self, py: Python<'_>, session_id: &str) -> PyResult<()> {
        let session = parse_session(py, session_id)?;
        let store = self.shared(py)?;
        py.detach(move || store.release_lease(&session));
        Ok(())
    }

    /// Release every lease and close the database. Later calls raise `Error`.
    fn close(&self, py: Python<'_>) {
        let taken = self.opened().take();
        if let Some(o) = taken {
            if o.pid == std::process::id() {
                py.detach(move || drop(o));
            } else {
                std::mem::forget(o);
            }
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        format!("Store({:?})", self.home.display().to_string())
    }
}
