//! Arguments every entry point reads the same way: a session id, a home
//! folder, a PostgreSQL target, a limit. A bad one raises before anything
//! is touched.

use std::path::{Path, PathBuf};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use turnsafe_host::pg::DbUrl;
use turnsafe_host::store::SessionId;

use crate::errors::{INVALID_SESSION_ID, raise};

pub(crate) fn parse_session(py: Python<'_>, id: &str) -> PyResult<SessionId> {
    SessionId::new(id).map_err(|e| {
        raise(
            py,
            &INVALID_SESSION_ID,
            "InvalidSessionId",
            format!("{e}: {id:?}"),
            None,
        )
    })
}

/// `~` and `~/...` name the user's home folder, as in a shell.
pub(crate) fn expand_home(path: PathBuf) -> PathBuf {
    let Ok(rest) = path.strip_prefix("~") else {
        return path;
    };
    match std::env::var_os("HOME") {
        Some(home) => Path::new(&home).join(rest),
        None => path,
    }
}

/// The PostgreSQL server a call names: `db`, else `TURNSAFE_DB`, else none
/// (SQLite under the home). A URL the writer refuses (a read-only target)
/// is a `ValueError`, as it is a usage error on the command line.
pub(crate) fn resolve_db(db: Option<&str>) -> PyResult<Option<DbUrl>> {
    let (raw, from) = match db.filter(|s| !s.trim().is_empty()) {
        Some(raw) => (raw.to_string(), "db"),
        None => match std::env::var(turnsafe_host::target::ENV)
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            Some(raw) => (raw, turnsafe_host::target::ENV),
            None => return Ok(None),
        },
    };
    let url: DbUrl = raw
        .parse()
        .map_err(|e: turnsafe_host::pg::url::UrlError| PyValueError::new_err(format!("{from}: {e}")))?;
    Ok(Some(url))
}

/// A PostgreSQL target a writer may use.
pub(crate) fn writable(url: Option<DbUrl>) -> PyResult<Option<DbUrl>> {
    if let Some(why) = url.as_ref().and_then(DbUrl::writer_refusal) {
        let shown = url.as_ref().map(|u| u.display().to_string()).unwrap_or_default();
        return Err(PyValueError::new_err(format!("db {shown}: {why}")));
    }
    Ok(url)
}

pub(crate) fn read_limit(limit: Option<i64>) -> PyResult<Option<u64>> {
    match limit {
        Some(l) if l < 0 => Err(PyValueError::new_err("limit must not be negative")),
        l => Ok(l.map(i64::unsigned_abs)),
    }
}
