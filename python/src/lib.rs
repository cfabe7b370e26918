//! `turnsafe_store._native`: the native host behind a thin PyO3 binding.
//!
//! Nothing here decides anything: every call converts its arguments,
//! releases the GIL, calls the host (`turnsafe-host`, built without the
//! WASM engine) and converts the answer. The exceptions are defined in
//! `turnsafe_store/_errors.py` so they can have two bases and attributes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use serde_json::{Map, Number, Value};
use turnsafe_host::backend::{Backend, LeaseOptions};
use turnsafe_host::graph::{CheckpointRecord, GraphBatch, GraphEdit, GraphQuery, WriteRecord};
use turnsafe_host::message::{Message, valid_uid};
use turnsafe_host::outcome::FlushOutcome;
use turnsafe_host::pg::{DbUrl, PgStore};
use turnsafe_host::replay::{ReplayError, ReplayOptions};
use turnsafe_host::store::{SessionId, SharedStore, StoreOptions, Synchronous};

/// Deepest nesting of a message accepted (the store reads JSON back with
/// serde_json, whose limit is 128 levels).
const MAX_DEPTH: usize = 100;

// ---------------------------------------------------------------- errors

static ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_SESSION_ID: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static REFUSED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TURN_NOT_PERSISTED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static HISTORY_INCOMPLETE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

const ERRORS: &str = "turnsafe_store._errors";

/// An instance of one of the package's exceptions, with `cause` set.
fn raise(
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

fn error(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    raise(py, &ERROR, "Error", msg.into(), None)
}

fn parse_session(py: Python<'_>, id: &str) -> PyResult<SessionId> {
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
fn expand_home(path: PathBuf) -> PathBuf {
    let Ok(rest) = path.strip_prefix("~") else {
        return path;
    };
    match std::env::var_os("HOME") {
        Some(home) => Path::new(&home).join(rest),
        None => path,
    }
}

// ---------------------------------------------------------------- JSON <-> Python

fn to_json(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
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

fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
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

fn map_to_py<'py>(py: Python<'py>, m: &Map<String, Value>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, x) in m {
        d.set_item(k, to_py(py, x)?)?;
    }
    Ok(d)
}

/// The messages of one batch, with their uids: `uids[i]` when given, else
/// the message's own string `uid`, else one turnsafe mints.
fn batch(py: Python<'_>, messages: &Bound<'_, PyAny>, uids: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Message>> {
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
    let _ = py;
    Ok(out)
}

// ---------------------------------------------------------------- Outcome

/// What one `append` did: attributes named as the keys of the JSON object
/// `turnsafe append` prints; nested values are dicts.
#[pyclass(frozen, module = "turnsafe_store")]
struct Outcome {
    value: Value,
}

impl Outcome {
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, self.value.get(key).unwrap_or(&Value::Null))
    }
}

#[pymethods]
impl Outcome {
    #[getter]
    fn persisted(&self) -> bool {
        self.value["persisted"].as_bool().unwrap_or(false)
    }
    #[getter]
    fn operation<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "operation")
    }
    #[getter]
    fn cause<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "cause")
    }
    #[getter]
    fn action<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "action")
    }
    #[getter]
    fn attempts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "attempts")
    }
    #[getter]
    fn committed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "committed")
    }
    #[getter]
    fn diverted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "diverted")
    }
    #[getter]
    fn handed_back<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "handed_back")
    }
    #[getter]
    fn receipt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "receipt")
    }
    #[getter]
    fn divert_error<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "divert_error")
    }
    #[getter]
    fn divert_residue<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "divert_residue")
    }
    /// The unsettled capture (`{path, cause}`) that kept this batch out of
    /// the database, or `None`.
    #[getter]
    fn pending_capture<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "pending_capture")
    }
    #[getter]
    fn capture<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "capture")
    }
    /// Whether what this outcome says is stored survives a power cut now:
    /// `False` for a commit under `synchronous="normal"`.
    #[getter]
    fn durable(&self) -> bool {
        // An outcome that does not say claims the less.
        self.value["durable"].as_bool().unwrap_or(false)
    }
    #[getter]
    fn copy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "copy")
    }
    #[getter]
    fn error<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "error")
    }
    #[getter]
    fn uids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "uids")
    }
    #[getter]
    fn minted_uids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "minted_uids")
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
        if slf.get().persisted() {
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
            if self.persisted() { "True" } else { "False" },
            s("cause"),
            s("action"),
            s("committed"),
            s("diverted"),
            s("handed_back")
        )
    }
}

// ---------------------------------------------------------------- Completions

/// Outcomes of batches handed over with `Store._append_then`, for one event
/// loop: the committing thread queues each under its ticket and makes
/// `fileno()` readable, and the loop takes them with `drain()`. No thread
/// of Python's runs in between, so no GIL changes hands for a batch but
/// the loop's own.
#[pyclass(frozen, module = "turnsafe_store")]
struct Completions {
    lane: Arc<Lane>,
}

struct Lane {
    reader: std::io::PipeReader,
    writer: std::io::PipeWriter,
    ready: Mutex<Ready>,
}

/// What reaches the loop for one ticket.
enum Done {
    /// An append's outcome.
    Outcome(Value),
    /// A read's or an edit's result.
    Answer(Result<Value, Failed>),
}

/// A read or an edit that failed: raised as `Error` with `cause`, or as
/// `HistoryIncomplete` with the rows and the captures that hold more.
struct Failed {
    message: String,
    cause: Option<&'static str>,
    incomplete: Option<Box<(Value, Value)>>,
}

impl Failed {
    fn of_edit(e: &turnsafe_host::store::EditError) -> Failed {
        let copy = e.copy();
        Failed {
            message: format!("{e}\n{}\n{}", copy.title, copy.body),
            cause: Some(e.cause.label()),
            incomplete: None,
        }
    }

    /// An edit with its pending divert lines: the edit's own failure, or
    /// the lines could not be read (nothing changed) or settled.
    fn of_clear(e: &turnsafe_host::clear::ClearError) -> Failed {
        match e {
            turnsafe_host::clear::ClearError::Edit(e) => Failed::of_edit(e),
            other => Failed {
                message: other.to_string(),
                cause: None,
                incomplete: None,
            },
        }
    }

    /// A read that found `holds` holding rows of `session` the database
    /// lacks; `rows` is what the read returns otherwise.
    fn incomplete(session: &SessionId, rows: Value, holds: &[turnsafe_host::captures::Hold]) -> Failed {
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

    fn into_err(self, py: Python<'_>) -> PyErr {
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

#[derive(Default)]
struct Ready {
    outcomes: Vec<(u64, Done)>,
    /// A byte is in the pipe: set with the write, cleared with the read,
    /// both under the lock, so there is never more than one and a drain
    /// never waits for one.
    signalled: bool,
}

impl Lane {
    fn ready(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, ticket: u64, done: Done) {
        use std::io::Write;
        let mut ready = self.ready();
        ready.outcomes.push((ticket, done));
        if !ready.signalled {
            ready.signalled = (&self.writer).write_all(&[1]).is_ok();
        }
    }
}

#[pymethods]
impl Completions {
    #[new]
    fn new() -> PyResult<Self> {
        let (reader, writer) = std::io::pipe().map_err(|e| PyOSError::new_err(e.to_string()))?;
        Ok(Completions {
            lane: Arc::new(Lane {
                reader,
                writer,
                ready: Mutex::new(Ready::default()),
            }),
        })
    }

    /// The descriptor that is readable while outcomes are ready.
    fn fileno(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.lane.reader.as_raw_fd()
    }

    /// What is ready, oldest first: `(ticket, True, result)` (an append's
    /// `Outcome`, or a read's or an edit's value) or `(ticket, False,
    /// exception)`.
    fn drain(&self, py: Python<'_>) -> PyResult<Vec<(u64, bool, Py<PyAny>)>> {
        use std::io::Read;
        let taken = {
            let mut ready = self.lane.ready();
            if ready.signalled {
                let mut byte = [0u8; 1];
                let _ = (&self.lane.reader).read(&mut byte);
                ready.signalled = false;
            }
            std::mem::take(&mut ready.outcomes)
        };
        let mut out = Vec::with_capacity(taken.len());
        for (ticket, done) in taken {
            out.push(match done {
                Done::Outcome(value) => (ticket, true, Py::new(py, Outcome { value })?.into_any()),
                Done::Answer(Ok(value)) => (ticket, true, to_py(py, &value)?.unbind()),
                Done::Answer(Err(failed)) => (ticket, false, failed.into_err(py).into_value(py).into_any()),
            });
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------- Store

/// The shared store of either engine: SQLite under the home, or a
/// PostgreSQL server with the divert folder under the home.
#[derive(Clone)]
enum Shared {
    Sqlite(SharedStore),
    Postgres(SharedStore<PgStore>),
}

impl Shared {
    fn open(home: &Path, db: Option<&DbUrl>, opts: StoreOptions) -> Result<Shared, String> {
        let Some(url) = db else {
            return SharedStore::open(home, opts)
                .map(Shared::Sqlite)
                .map_err(|e| e.to_string());
        };
        // The divert folder is on this machine whatever the server does:
        // the home exists before the first batch.
        turnsafe_host::durable::create_dir_all(home, 0o700)
            .map_err(|e| format!("could not create {}: {e}", home.display()))?;
        let lease = LeaseOptions {
            holder: opts.holder,
            lease_ttl: opts.lease_ttl,
        };
        let store = turnsafe_host::pg::open_store(url.clone(), home, lease);
        Ok(Shared::Postgres(SharedStore::over(store, home)))
    }

    fn append_batch(&self, session: &SessionId, messages: &[Message]) -> FlushOutcome {
        match self {
            Shared::Sqlite(s) => s.append_batch(session, messages),
            Shared::Postgres(s) => s.append_batch(session, messages),
        }
    }

    fn append_batch_then(
        &self,
        session: &SessionId,
        messages: Vec<Message>,
        then: impl FnOnce(FlushOutcome) + Send + 'static,
    ) {
        match self {
            Shared::Sqlite(s) => s.append_batch_then(session, messages, then),
            Shared::Postgres(s) => s.append_batch_then(session, messages, then),
        }
    }

    fn call_then<T: 'static>(
        &self,
        f: impl FnOnce(&mut dyn Backend) -> T + Send + 'static,
        then: impl FnOnce(Option<T>) + Send + 'static,
    ) {
        match self {
            Shared::Sqlite(s) => s.call_then(move |st| f(st), then),
            Shared::Postgres(s) => s.call_then(move |st| f(st), then),
        }
    }

    fn with_store<T>(&self, f: impl FnOnce(&mut dyn Backend) -> T) -> T {
        match self {
            Shared::Sqlite(s) => s.with_store(|st| f(st)),
            Shared::Postgres(s) => s.with_store(|st| f(st)),
        }
    }

    fn settle(&self) {
        match self {
            Shared::Sqlite(s) => s.settle(),
            Shared::Postgres(s) => s.settle(),
        }
    }

    fn release_lease(&self, session: &SessionId) {
        match self {
            Shared::Sqlite(s) => s.release_lease(session),
            Shared::Postgres(s) => s.release_lease(session),
        }
    }

    fn put_graph(&self, graph: GraphBatch) -> FlushOutcome {
        match self {
            Shared::Sqlite(s) => s.put_graph(graph),
            Shared::Postgres(s) => s.put_graph(graph),
        }
    }
}

/// The PostgreSQL server a call names: `db`, else `TURNSAFE_DB`, else none
/// (SQLite under the home). A URL the writer refuses (a read-only target)
/// is a `ValueError`, as it is a usage error on the command line.
fn resolve_db(db: Option<&str>) -> PyResult<Option<DbUrl>> {
    let (raw, from) = match db.filter(|s| !s.trim().is_empty()) {
        Some(raw) => (raw.to_string(), "db"),
        None => match std::env::var(turnsafe_host::backend::target::ENV)
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            Some(raw) => (raw, turnsafe_host::backend::target::ENV),
            None => return Ok(None),
        },
    };
    let url: DbUrl = raw
        .parse()
        .map_err(|e: turnsafe_host::pg::url::UrlError| PyValueError::new_err(format!("{from}: {e}")))?;
    Ok(Some(url))
}

/// A PostgreSQL target a writer may use.
fn writable(url: Option<DbUrl>) -> PyResult<Option<DbUrl>> {
    if let Some(why) = url.as_ref().and_then(DbUrl::writer_refusal) {
        let shown = url.as_ref().map(|u| u.display().to_string()).unwrap_or_default();
        return Err(PyValueError::new_err(format!("db {shown}: {why}")));
    }
    Ok(url)
}

/// The open store, and the process that opened it: a child of `fork`
/// must not touch its parent's connection.
struct Opened {
    pid: u32,
    store: Shared,
}

/// One turnsafe home, shared by every thread of the process.
#[pyclass(frozen, weakref, module = "turnsafe_store")]
struct Store {
    home: PathBuf,
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
    fn shared(&self, py: Python<'_>) -> PyResult<Shared> {
        let mut opened = self.opened();
        let pid = std::process::id();
        match opened.as_ref() {
            None => return Err(error(py, "the store is closed")),
            Some(o) if o.pid == pid => return Ok(o.store.clone()),
            Some(_) => {}
        }
        let (home, db, opts) = (self.home.clone(), self.db.clone(), self.options());
        let fresh = py
            .detach(move || Shared::open(&home, db.as_ref(), opts))
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
            .detach(move || Shared::open(&home, db.as_ref(), opts))
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
        let batch = batch(py, messages, uids)?;
        let store = self.shared(py)?;
        let value = py.detach(move || store.append_batch(&session, &batch).to_value());
        Ok(Outcome { value })
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
        let batch = batch(py, messages, uids)?;
        let store = self.shared(py)?;
        let lane = Arc::clone(&completions.lane);
        py.detach(move || {
            store.append_batch_then(&session, batch, move |outcome| {
                lane.push(ticket, Done::Outcome(outcome.to_value()))
            });
        });
        Ok(())
    }

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
                .map_err(|e| {
                    Failed {
                        message: e.message,
                        cause: e.cause.map(|c| c.label()),
                        incomplete: None,
                    }
                    .into_err(py)
                })?;
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
            (Some(u), None) => turnsafe_host::history::Selector::Uids(u),
            (None, Some(r)) => {
                let reason = turnsafe_host::history::Reason::from_label(r)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown reason {r:?}")))?;
                let since_ms = since.map(|s| (s * 1000.0) as i64);
                turnsafe_host::history::Selector::Reason { reason, since_ms }
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
            Ok(Err(refused)) => Err(raise(py, &REFUSED, "Refused", refused.to_string(), None)),
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
        let batch = batch(py, items, None)?;
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

    /// Store one LangGraph checkpoint through the flush machine (used by
    /// `turnsafe_store.langgraph`). `metadata` is a JSON object as text.
    #[pyo3(name = "_lg_put_checkpoint", signature = (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type_, checkpoint, metadata))]
    #[allow(clippy::too_many_arguments)]
    fn lg_put_checkpoint(
        &self,
        py: Python<'_>,
        thread_id: String,
        checkpoint_ns: String,
        checkpoint_id: String,
        parent_checkpoint_id: Option<String>,
        type_: Option<String>,
        checkpoint: PyBackedBytes,
        metadata: &str,
    ) -> PyResult<Outcome> {
        let metadata: Value = serde_json::from_str(metadata)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| PyValueError::new_err("metadata must be a JSON object"))?;
        let graph = GraphBatch::Checkpoint(CheckpointRecord {
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            parent_checkpoint_id,
            kind: type_,
            checkpoint: checkpoint.to_vec(),
            metadata,
        });
        let store = self.shared(py)?;
        let value = py.detach(move || store.put_graph(graph).to_value());
        Ok(Outcome { value })
    }

    /// Store one task's pending writes, each `(idx, channel, type, value)`.
    #[pyo3(name = "_lg_put_writes", signature = (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, writes))]
    #[allow(clippy::too_many_arguments)]
    fn lg_put_writes(
        &self,
        py: Python<'_>,
        thread_id: String,
        checkpoint_ns: String,
        checkpoint_id: String,
        task_id: String,
        task_path: String,
        writes: Vec<(i64, String, Option<String>, PyBackedBytes)>,
    ) -> PyResult<Outcome> {
        let records: Vec<WriteRecord> = writes
            .into_iter()
            .map(|(idx, channel, kind, value)| WriteRecord {
                thread_id: thread_id.clone(),
                checkpoint_ns: checkpoint_ns.clone(),
                checkpoint_id: checkpoint_id.clone(),
                task_id: task_id.clone(),
                task_path: task_path.clone(),
                idx,
                channel,
                kind,
                value: value.to_vec(),
            })
            .collect();
        if records.is_empty() {
            return Err(PyValueError::new_err("no writes to store"));
        }
        let store = self.shared(py)?;
        let value = py.detach(move || store.put_graph(GraphBatch::Writes(records)).to_value());
        Ok(Outcome { value })
    }

    /// The live checkpoints a LangGraph `list`/`get_tuple` asks for, newest
    /// first: tuples `(thread_id, checkpoint_ns, checkpoint_id,
    /// parent_checkpoint_id, type, checkpoint, metadata_json, writes)`,
    /// each write `(task_id, channel, type, value, task_path, idx)`.
    #[pyo3(name = "_lg_read", signature = (thread_id = None, checkpoint_ns = None, checkpoint_id = None, before = None, filter = None, limit = None))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn lg_read<'py>(
        &self,
        py: Python<'py>,
        thread_id: Option<String>,
        checkpoint_ns: Option<String>,
        checkpoint_id: Option<String>,
        before: Option<String>,
        filter: Option<&str>,
        limit: Option<i64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let filter = match filter {
            None => Map::new(),
            Some(text) => match serde_json::from_str(text) {
                Ok(Value::Object(m)) => m,
                _ => return Err(PyValueError::new_err("filter must be a JSON object")),
            },
        };
        let query = GraphQuery {
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            before,
            filter,
            limit: read_limit(limit)?,
        };
        let store = self.shared(py)?;
        let rows = py
            .detach(move || store.with_store(|s| s.graph_read(&query)))
            .map_err(|e| {
                Failed {
                    message: e.message,
                    cause: e.cause.map(|c| c.label()),
                    incomplete: None,
                }
                .into_err(py)
            })?;
        let list = PyList::empty(py);
        for c in rows {
            let r = c.record;
            let writes = PyList::empty(py);
            for w in c.writes {
                writes.append((
                    w.task_id,
                    w.channel,
                    w.kind,
                    pyo3::types::PyBytes::new(py, &w.value),
                    w.task_path,
                    w.idx,
                ))?;
            }
            list.append((
                r.thread_id,
                r.checkpoint_ns,
                r.checkpoint_id,
                r.parent_checkpoint_id,
                r.kind,
                pyo3::types::PyBytes::new(py, &r.checkpoint),
                r.metadata.to_string(),
                writes,
            ))?;
        }
        Ok(list)
    }

    /// A LangGraph delete, prune or copy: `kind` is `delete_thread`
    /// (`threads[0]`), `delete_for_runs` (`runs`), `prune_keep_latest`,
    /// `prune_delete` (`threads`) or `copy_thread` (`threads[0]` to
    /// `threads[1]`). Returns `{"checkpoints", "writes"}` it changed.
    #[pyo3(name = "_lg_edit", signature = (kind, threads, runs = Vec::new()))]
    fn lg_edit<'py>(
        &self,
        py: Python<'py>,
        kind: &str,
        threads: Vec<String>,
        runs: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let first = |k: usize| {
            threads
                .get(k)
                .cloned()
                .ok_or_else(|| PyValueError::new_err("a thread id is missing"))
        };
        let edit = match kind {
            "delete_thread" => GraphEdit::DeleteThread(first(0)?),
            "delete_for_runs" => GraphEdit::DeleteRuns(runs),
            "prune_keep_latest" => GraphEdit::Prune {
                threads: threads.clone(),
                keep_latest: true,
            },
            "prune_delete" => GraphEdit::Prune {
                threads: threads.clone(),
                keep_latest: false,
            },
            "copy_thread" => GraphEdit::Copy {
                from: first(0)?,
                to: first(1)?,
            },
            other => return Err(PyValueError::new_err(format!("unknown edit {other:?}"))),
        };
        let store = self.shared(py)?;
        let home = self.home.clone();
        let done = py
            .detach(move || {
                store.with_store(|s| match &edit {
                    // The thread's pending divert lines are settled with it.
                    GraphEdit::DeleteThread(thread) => {
                        turnsafe_host::clear::delete_thread(s, &home, thread).map(|d| d.edited)
                    }
                    _ => s.graph_edit(&edit).map_err(turnsafe_host::clear::ClearError::Edit),
                })
            })
            .map_err(|e| Failed::of_clear(&e).into_err(py))?;
        to_py(
            py,
            &serde_json::json!({"checkpoints": done.checkpoints, "writes": done.writes}),
        )
    }

    fn __repr__(&self) -> String {
        format!("Store({:?})", self.home.display().to_string())
    }
}

impl Store {
    fn read(
        &self,
        py: Python<'_>,
        session_id: &str,
        limit: Option<i64>,
        full: bool,
    ) -> PyResult<Vec<turnsafe_host::transcript::StoredMessage>> {
        let session = parse_session(py, session_id)?;
        let limit = read_limit(limit)?;
        let store = self.shared(py)?;
        py.detach(move || store.with_store(|s| read_in(s, &session, limit, full)))
            .map_err(|failed| failed.into_err(py))
    }

    /// Hand `work` to the committer thread; its answer reaches
    /// `completions` under `ticket` (a panic inside is answered as an error).
    fn call_then(
        &self,
        py: Python<'_>,
        completions: &Completions,
        ticket: u64,
        work: impl FnOnce(&mut dyn Backend) -> Result<Value, Failed> + Send + 'static,
    ) -> PyResult<()> {
        let store = self.shared(py)?;
        let lane = Arc::clone(&completions.lane);
        py.detach(move || {
            store.call_then(work, move |done| {
                let answer = done.unwrap_or_else(|| {
                    Err(Failed {
                        message: "the store's work failed unexpectedly (a panic); nothing was changed by it".into(),
                        cause: None,
                        incomplete: None,
                    })
                });
                lane.push(ticket, Done::Answer(answer))
            })
        });
        Ok(())
    }
}

fn read_limit(limit: Option<i64>) -> PyResult<Option<u64>> {
    match limit {
        Some(l) if l < 0 => Err(PyValueError::new_err("limit must not be negative")),
        l => Ok(l.map(i64::unsigned_abs)),
    }
}

/// The newest `limit` rows of `session`, through the store's own connection
/// (a read-only one when the writer could not open it).
/// A session's stored rows; `HistoryIncomplete` (with the rows, as `full`
/// `{uid, seq, message}` objects or as messages) while an unsettled
/// capture holds rows of it that the database lacks.
fn read_in(
    s: &mut dyn Backend,
    session: &SessionId,
    limit: Option<u64>,
    full: bool,
) -> Result<Vec<turnsafe_host::transcript::StoredMessage>, Failed> {
    let rows = s.rows(session.as_str(), limit).map_err(|e| Failed {
        message: e.message,
        cause: e.cause.map(|c| c.label()),
        incomplete: None,
    })?;
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
fn pop_in(s: &mut dyn Backend, session: &SessionId) -> Result<Value, Failed> {
    match s.pop_last(session) {
        Ok(m) => Ok(m.map_or(Value::Null, |m| Value::Object(m.message))),
        Err(e) => Err(Failed::of_edit(&e)),
    }
}

/// Remove every message, with the session's pending divert lines read,
/// then settle exactly those lines as `cleared`. A fenced clear leaves
/// them pending, and a read that fails clears nothing.
fn clear_in(s: &mut dyn Backend, home: &Path, session: &SessionId) -> Result<u64, Failed> {
    let report = turnsafe_host::clear::clear(s, home, session).map_err(|e| Failed::of_clear(&e))?;
    Ok(report.cleared.rows.len() as u64)
}

// ---------------------------------------------------------------- functions

/// Import the home's diverted transcripts back into `state.db`: the same
/// report as `turnsafe replay --json`, in one dict.
///
/// With `db` (or `TURNSAFE_DB`), into that PostgreSQL server instead.
#[pyfunction]
#[pyo3(signature = (home, *, db = None, session = None, force = false, dry_run = false))]
fn replay<'py>(
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
            Err(raise(py, &REFUSED, "Refused", e.to_string(), None))
        }
        Err(e) => Err(error(py, e.to_string())),
    }
}

/// Import a Hermes home (`HERMES_HOME`) into the turnsafe home `home`
/// (SQLite, `home/state.db`): the totals of `turnsafe import hermes --json`
/// (its `end` line) and `session_reports` (its `session` lines). The Hermes
/// home is only read, from a verified copy; a session whose live lease
/// another writer holds is listed in `refused` and not written.
#[pyfunction]
#[pyo3(signature = (source, home, *, session = None, dry_run = false))]
fn import_hermes<'py>(
    py: Python<'py>,
    source: PathBuf,
    home: PathBuf,
    session: Option<String>,
    dry_run: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let (source, home) = (expand_home(source), expand_home(home));
    let opts = turnsafe_host::import_hermes::ImportOptions {
        session,
        dry_run,
        ..Default::default()
    };
    match py.detach(move || turnsafe_host::import_hermes::import(&source, &home, &opts)) {
        Ok(report) => to_py(py, &report.to_value()),
        Err(e) if e.is_refusal() => Err(raise(py, &REFUSED, "Refused", e.to_string(), None)),
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
fn doctor<'py>(py: Python<'py>, home: PathBuf, db: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
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
fn search<'py>(
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

/// The canonical JSON text of a JSON text: the bytes every host compares
/// to decide a record is already stored (`docs/DIVERT.md`, "Canonical
/// bytes"). Raises ValueError for a text that is not JSON.
#[pyfunction]
fn canonical_json(text: &str) -> PyResult<String> {
    turnsafe_host::same::canonical_text(text).map_err(|e| PyValueError::new_err(format!("not JSON: {e}")))
}

/// `sha256:<hex>` of a JSON text's canonical bytes. Raises ValueError for
/// a text that is not JSON.
#[pyfunction]
fn digest_json(text: &str) -> PyResult<String> {
    canonical_json(text).map(|c| turnsafe_host::same::digest_bytes(c.as_bytes()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add_class::<Outcome>()?;
    m.add_class::<Completions>()?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(import_hermes, m)?)?;
    m.add_function(wrap_pyfunction!(doctor, m)?)?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_json, m)?)?;
    m.add_function(wrap_pyfunction!(digest_json, m)?)?;
    m.add("SCHEMA_VERSION", turnsafe_host::store::SCHEMA_VERSION)?;
    Ok(())
}
