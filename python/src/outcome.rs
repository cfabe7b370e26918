//! `Outcome`, what one batch did, as Python sees it: the fields of the
//! policy's report, named as the keys of the JSON object `turnsafe append`
//! prints, and that object itself.

use pyo3::prelude::*;
use serde_json::Value;
use turnsafe_host::outcome::FlushOutcome;

use crate::convert::to_py;
use crate::errors::{ERRORS, TURN_NOT_PERSISTED};

// Scalars and lists are copied out of the report once; the nested objects
// are made into fresh dicts at each read, from the JSON, so no caller can
// change what another reads.
/// What one `append` did: attributes named as the keys of the JSON object
/// `turnsafe append` prints; nested values are dicts.
#[pyclass(frozen, module = "turnsafe_store")]
pub(crate) struct Outcome {
    #[pyo3(get)]
    persisted: bool,
    #[pyo3(get)]
    operation: Option<&'static str>,
    #[pyo3(get)]
    cause: Option<&'static str>,
    #[pyo3(get)]
    action: Option<&'static str>,
    #[pyo3(get)]
    attempts: u32,
    #[pyo3(get)]
    committed: usize,
    #[pyo3(get)]
    diverted: usize,
    #[pyo3(get)]
    handed_back: usize,
    /// Whether what this outcome says is stored survives a power cut now:
    /// `False` for a commit under `synchronous="normal"`.
    #[pyo3(get)]
    durable: bool,
    #[pyo3(get)]
    error: Option<String>,
    #[pyo3(get)]
    uids: Vec<String>,
    #[pyo3(get)]
    minted_uids: Vec<String>,
    /// The object `turnsafe append` prints, whole.
    value: Value,
}

impl Outcome {
    /// Made without the GIL, on the thread that committed the batch.
    pub(crate) fn of(outcome: &FlushOutcome) -> Outcome {
        Outcome {
            persisted: outcome.persisted,
            operation: outcome.operation.map(|o| o.label()),
            cause: outcome.cause.map(|c| c.label()),
            action: outcome.action.map(|a| a.label()),
            attempts: outcome.attempts,
            committed: outcome.committed,
            diverted: outcome.diverted,
            handed_back: outcome.handed_back,
            durable: outcome.durable,
            error: outcome.error.clone(),
            uids: outcome.uids.clone(),
            minted_uids: outcome.minted_uids.clone(),
            value: outcome.to_value(),
        }
    }

    /// A nested object of the JSON, as a fresh dict (or `None`).
    fn nested<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, self.value.get(key).unwrap_or(&Value::Null))
    }
}

#[pymethods]
impl Outcome {
    #[getter]
    fn receipt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.nested(py, "receipt")
    }
    #[getter]
    fn divert_error<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.nested(py, "divert_error")
    }
    #[getter]
    fn divert_residue<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.nested(py, "divert_residue")
    }
    /// The unsettled capture (`{path, cause}`) that kept this batch out of
    /// the database, or `None`.
    #[getter]
    fn pending_capture<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.nested(py, "pending_capture")
    }
    #[getter]
    fn capture<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.nested(py, "capture")
    }
    #[getter]
    fn copy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.nested(py, "copy")
    }

    /// The outcome as the JSON object `turnsafe append` prints, as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.value)
    }

    /// The same object as JSON text.
    fn to_json(&self) -> String {
        self.value.to_string()
    }

    /// Raise `TurnNotPersisted` carrying this outcome unless every message
    /// was committed; return the outcome otherwise.
    fn raise_for_status(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().persisted {
            return Ok(slf);
        }
        let py = slf.py();
        let cls = TURN_NOT_PERSISTED.import(py, ERRORS, "TurnNotPersisted")?;
        Err(PyErr::from_value(cls.call1((slf,))?))
    }

    fn __repr__(&self) -> String {
        let s = |k: &str| match &self.value[k] {
            Value::Null => "None".to_string(),
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        format!(
            "Outcome(persisted={}, cause={}, action={}, committed={}, diverted={}, handed_back={})",
            if self.persisted { "True" } else { "False" },
            s("cause"),
            s("action"),
            s("committed"),
            s("diverted"),
            s("handed_back")
        )
    }
}
