//! The package's exceptions, raised from Rust. They are defined in
//! `turnsafe_store/_errors.py` (two bases, attributes), so each class is
//! imported once, on first use.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use serde_json::Value;
use turnsafe_host::store::SessionId;

use crate::convert::to_py;

pub(crate) static ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
pub(crate) static INVALID_SESSION_ID: PyOnceLock<Py<PyType>> = PyOnceLock::new();
pub(crate) static REFUSED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
pub(crate) static TURN_NOT_PERSISTED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static HISTORY_INCOMPLETE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

pub(crate) const ERRORS: &str = "turnsafe_store._errors";

/// An instance of one of the package's exceptions, with `cause` set.
pub(crate) fn raise(
    py: Python<'_>,
    class: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    msg: String,
    cause: Option<&str>,
) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let cls = class.import(py, ERRORS, name)?;
        let exc = cls.call1((msg.clone(),))?;
        exc.setattr("cause", cause)?;
        Ok(PyErr::from_value(exc))
    })();
    made.unwrap_or_else(|e| e)
}

pub(crate) fn error(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    raise(py, &ERROR, "Error", msg.into(), None)
}

pub(crate) fn refused(py: Python<'_>, msg: String) -> PyErr {
    raise(py, &REFUSED, "Refused", msg, None)
}

/// A read or an edit that failed: raised as `Error` with `cause`, or as
/// `HistoryIncomplete` with the rows and the captures that hold more.
/// Made without the GIL (on the committer thread too), raised with it.
pub(crate) struct Failed {
    message: String,
    cause: Option<&'static str>,
    incomplete: Option<Box<(Value, Value)>>,
}

impl Failed {
    /// A failure with nothing but its message and cause.
    pub(crate) fn new(message: String, cause: Option<&'static str>) -> Failed {
        Failed {
            message,
            cause,
            incomplete: None,
        }
    }

    /// A read the store refused, with the policy's cause when it has one.
    pub(crate) fn of_read(e: turnsafe_host::backend::ReadError) -> Failed {
        Failed::new(e.message, e.cause.map(|c| c.label()))
    }

    pub(crate) fn of_edit(e: &turnsafe_host::store::EditError) -> Failed {
        let copy = e.copy();
        Failed::new(format!("{e}\n{}\n{}", copy.title, copy.body), Some(e.cause.label()))
    }

    /// An edit with its pending divert lines: the edit's own failure, or
    /// the lines could not be read (nothing changed) or settled.
    pub(crate) fn of_clear(e: &turnsafe_host::clear::ClearError) -> Failed {
        match e {
            turnsafe_host::clear::ClearError::Edit(e) => Failed::of_edit(e),
            other => Failed::new(other.to_string(), None),
        }
    }

    /// A read that found `holds` holding rows of `session` the database
    /// lacks; `rows` is what the read returns otherwise.
    pub(crate) fn incomplete(session: &SessionId, rows: Value, holds: &[turnsafe_host::captures::Hold]) -> Failed {
        let captures: Vec<Value> = holds.iter().map(|h| h.to_value(Some(session.as_str()))).collect();
        let paths: Vec<&str> = holds.iter().map(|h| h.path.as_str()).collect();
        Failed {
            message: format!(
                "session {}'s history is not complete: unsettled capture(s) {} hold rows the database lacks; \
                 settle them with `turnsafe recover --install` or `--dismiss`",
                session.as_str(),
                paths.join(", ")
            ),
            cause: holds.first().map(|h| h.cause.label()),
            incomplete: Some(Box::new((rows, Value::Array(captures)))),
        }
    }

    pub(crate) fn into_err(self, py: Python<'_>) -> PyErr {
        let Some(parts) = self.incomplete else {
            return raise(py, &ERROR, "Error", self.message, self.cause);
        };
        let (rows, captures) = *parts;
        let made = (|| -> PyResult<PyErr> {
            let cls = HISTORY_INCOMPLETE.import(py, ERRORS, "HistoryIncomplete")?;
            let exc = cls.call1((self.message.clone(), to_py(py, &rows)?, to_py(py, &captures)?))?;
            exc.setattr("cause", self.cause)?;
            Ok(PyErr::from_value(exc))
        })();
        made.unwrap_or_else(|e| e)
    }
}
