//! The command line's reports over a home, as functions: `replay`,
//! `import_hermes`, `doctor` and `search` return the dicts that
//! `turnsafe <command> --json` prints.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use turnsafe_host::replay::{ReplayError, ReplayOptions};

use crate::args::{expand_home, parse_session, resolve_db, writable};
use crate::convert::to_py;
use crate::errors::{error, refused};

/// Import the home's diverted transcripts back into `state.db`: the same
/// report as `turnsafe replay --json`, in one dict.
///
/// With `db` (or `TURNSAFE_DB`), into that PostgreSQL server instead.
#[pyfunction]
#[pyo3(signature = (home, *, db = None, session = None, force = false, dry_run = false))]
pub(crate) fn replay<'py>(
    py: Python<'py>,
    home: PathBuf,
    db: Option<&str>,
    session: Option<String>,
    force: bool,
    dry_run: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(s) = &session {
        parse_session(py, s)?;
    }
    let db = writable(resolve_db(db)?)?;
    let home = expand_home(home);
    let opts = ReplayOptions {
        session,
        dry_run,
        force,
    };
    let run = py.detach(move || match &db {
        Some(url) => turnsafe_host::pg::replay::replay(&home, url, &opts),
        None => turnsafe_host::replay::replay_run(&home, &opts),
    });
    match run {
        Ok(run) => to_py(py, &run.report(dry_run)),
        Err(e @ (ReplayError::LeaseLive { .. } | ReplayError::CapturePending { .. })) => {
            Err(refused(py, e.to_string()))
        }
        Err(e) => Err(error(py, e.to_string())),
    }
}

/// Import a Hermes home (`HERMES_HOME`) into the turnsafe home `home`
/// (SQLite, `home/state.db`), or with `db` (or `TURNSAFE_DB`) into that
/// PostgreSQL database: the totals of `turnsafe import hermes --json`
/// (its `end` line) and `session_reports` (its `session` lines). The Hermes
/// home is only read, from a verified copy; a session whose live lease
/// another writer holds is listed in `refused` and not written.
#[pyfunction]
#[pyo3(signature = (source, home, *, session = None, dry_run = false, db = None))]
pub(crate) fn import_hermes<'py>(
    py: Python<'py>,
    source: PathBuf,
    home: PathBuf,
    session: Option<String>,
    dry_run: bool,
    db: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let db = writable(resolve_db(db)?)?;
    let (source, home) = (expand_home(source), expand_home(home));
    let opts = turnsafe_host::import_hermes::ImportOptions {
        session,
        dry_run,
        db,
        ..Default::default()
    };
    match py.detach(move || turnsafe_host::import_hermes::import(&source, &home, &opts)) {
        Ok(report) => to_py(py, &report.to_value()),
        Err(e) if e.is_refusal() => Err(refused(py, e.to_string())),
        Err(e) => Err(error(py, e.to_string())),
    }
}

/// Findings about a home: `ok`, `findings` and `facts`, as `turnsafe
/// doctor --json` prints them.
///
/// With `db` (or `TURNSAFE_DB`), about that PostgreSQL server and the
/// home's divert folder, as `turnsafe doctor --db` reports them.
#[pyfunction]
#[pyo3(signature = (home, *, db = None))]
pub(crate) fn doctor<'py>(py: Python<'py>, home: PathBuf, db: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
    let db = resolve_db(db)?;
    let home = expand_home(home);
    let report = py.detach(move || match &db {
        Some(url) => turnsafe_host::doctor::report_postgres(url, Some(&home)),
        None => turnsafe_host::doctor::report(&home),
    });
    to_py(py, &report)
}

/// Full-text search of a home's stored messages; never misses a committed
/// one (what the index lacks is indexed first, or scanned). Each hit is a
/// dict as `turnsafe search --json` prints it: `session`, `uid`, `seq`,
/// `role` (None for a message without one) and `snippet` (matches in `[`
/// `]`). `query` is plain words, all of which must appear.
#[pyfunction]
#[pyo3(signature = (home, query, *, session = None, limit = 20, archived = false))]
pub(crate) fn search<'py>(
    py: Python<'py>,
    home: PathBuf,
    query: &str,
    session: Option<String>,
    limit: i64,
    archived: bool,
) -> PyResult<Bound<'py, PyList>> {
    if let Some(s) = &session {
        parse_session(py, s)?;
    }
    let limit = usize::try_from(limit).map_err(|_| PyValueError::new_err("limit must not be negative"))?;
    let home = expand_home(home);
    let opts = turnsafe_host::search::SearchOptions {
        session,
        limit,
        archived,
        ..Default::default()
    };
    let query = query.to_string();
    let report = py
        .detach(move || turnsafe_host::search::search(&home, &query, &opts))
        .map_err(|e| error(py, e.to_string()))?;
    let list = PyList::empty(py);
    for hit in &report.hits {
        list.append(to_py(py, &serde_json::to_value(hit).unwrap_or_default())?)?;
    }
    Ok(list)
}
