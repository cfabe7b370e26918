//! The canonical bytes every host compares to decide a record is already
//! stored (`docs/DIVERT.md`, "Canonical bytes"), from the host's own
//! `same` module, so Python never computes them differently.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The canonical JSON text of a JSON text: the bytes every host compares
/// to decide a record is already stored (`docs/DIVERT.md`, "Canonical
/// bytes"). Raises ValueError for a text that is not JSON.
#[pyfunction]
pub(crate) fn canonical_json(text: &str) -> PyResult<String> {
    turnsafe_host::same::canonical_text(text).map_err(|e| PyValueError::new_err(format!("not JSON: {e}")))
}

/// `sha256:<hex>` of a JSON text's canonical bytes. Raises ValueError for
/// a text that is not JSON.
#[pyfunction]
pub(crate) fn digest_json(text: &str) -> PyResult<String> {
    canonical_json(text).map(|c| turnsafe_host::same::digest_bytes(c.as_bytes()))
}
