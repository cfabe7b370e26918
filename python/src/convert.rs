//! JSON values to and from Python objects, and the messages of a batch.
//! A message is stored exactly as given, so the conversion is exact both
//! ways: no float for an int, no str for a key that is not one.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};
use turnsafe_host::message::{Message, valid_uid};

/// Deepest nesting of a message accepted (the store reads JSON back with
/// serde_json, whose limit is 128 levels).
const MAX_DEPTH: usize = 100;

pub(crate) fn to_json(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(format!("nested deeper than {MAX_DEPTH} levels")));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.cast::<PyInt>().is_ok() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::from(u));
        }
        return Err(PyValueError::new_err(
            "an integer outside the 64-bit range cannot be stored as JSON",
        ));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err("NaN and infinity cannot be stored as JSON"));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.extract::<String>()?));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut m = Map::new();
        for (k, v) in d.iter() {
            let Ok(k) = k.cast::<PyString>() else {
                return Err(PyTypeError::new_err(format!(
                    "keys must be str, not {}",
                    k.get_type().name()?
                )));
            };
            m.insert(k.extract::<String>()?, to_json(&v, depth + 1)?);
        }
        return Ok(Value::Object(m));
    }
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        let mut out = Vec::new();
        for v in obj.try_iter()? {
            out.push(to_json(&v?, depth + 1)?);
        }
        return Ok(Value::Array(out));
    }
    Err(PyTypeError::new_err(format!(
        "{} cannot be stored as JSON (use dict, list, str, int, float, bool or None)",
        obj.get_type().name()?
    )))
}

pub(crate) fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(to_py(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(m) => map_to_py(py, m)?.into_any(),
    })
}

pub(crate) fn map_to_py<'py>(py: Python<'py>, m: &Map<String, Value>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, x) in m {
        d.set_item(k, to_py(py, x)?)?;
    }
    Ok(d)
}

/// The messages of one batch, with their uids: `uids[i]` when given, else
/// the message's own string `uid`, else one turnsafe mints.
pub(crate) fn batch(messages: &Bound<'_, PyAny>, uids: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Message>> {
    if messages.cast::<PyList>().is_err() && messages.cast::<PyTuple>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "messages must be a list of dicts, not {}",
            messages.get_type().name()?
        )));
    }
    let given: Option<Vec<Option<String>>> = match uids {
        None => None,
        Some(u) if u.is_none() => None,
        Some(u) => Some(u.extract()?),
    };
    let mut out = Vec::new();
    for (index, m) in messages.try_iter()?.enumerate() {
        let m = m?;
        if m.cast::<PyDict>().is_err() {
            return Err(PyTypeError::new_err(format!(
                "message {index} must be a dict, not {}",
                m.get_type().name()?
            )));
        }
        let Value::Object(item) = to_json(&m, 0)? else {
            return Err(PyTypeError::new_err(format!("message {index} must be a dict")));
        };
        // The object is stored exactly as given; the uid lives beside it.
        let own = item
            .get("uid")
            .and_then(Value::as_str)
            .filter(|u| valid_uid(u))
            .map(String::from);
        let mut message = Message::from_item(item);
        message.uid = match given.as_ref().and_then(|g| g.get(index)).cloned().flatten() {
            Some(uid) if !valid_uid(&uid) => {
                return Err(PyValueError::new_err(format!(
                    "uids[{index}] must be a non-empty string of at most 256 bytes"
                )));
            }
            Some(uid) => Some(uid),
            None if given.is_some() => None,
            None => own,
        };
        out.push(message);
    }
    if let Some(g) = &given
        && g.len() != out.len()
    {
        return Err(PyValueError::new_err(format!(
            "{} uids for {} messages",
            g.len(),
            out.len()
        )));
    }
    Ok(out)
}
