//! `Completions`: the answers of work handed to the committer thread,
//! passed to one asyncio event loop (`turnsafe_store/_aio.py`) through a
//! pipe it watches.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use serde_json::Value;

use crate::convert::to_py;
use crate::errors::Failed;
use crate::outcome::Outcome;

/// Outcomes of batches handed over with `Store._append_then`, for one event
/// loop: the committing thread queues each under its ticket and makes
/// `fileno()` readable, and the loop takes them with `drain()`. No thread
/// of Python's runs in between, so no GIL changes hands for a batch but
/// the loop's own.
#[pyclass(frozen, module = "turnsafe_store")]
pub(crate) struct Completions {
    lane: Arc<Lane>,
}

impl Completions {
    /// The lane the committer thread answers on, to move there.
    pub(crate) fn lane(&self) -> Arc<Lane> {
        Arc::clone(&self.lane)
    }
}

pub(crate) struct Lane {
    reader: std::io::PipeReader,
    writer: std::io::PipeWriter,
    ready: Mutex<Ready>,
}

/// What reaches the loop for one ticket.
pub(crate) enum Done {
    /// An append's outcome.
    Outcome(Outcome),
    /// A read's or an edit's result.
    Answer(Result<Value, Failed>),
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

    pub(crate) fn push(&self, ticket: u64, done: Done) {
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
                Done::Outcome(outcome) => (ticket, true, Py::new(py, outcome)?.into_any()),
                Done::Answer(Ok(value)) => (ticket, true, to_py(py, &value)?.unbind()),
                Done::Answer(Err(failed)) => (ticket, false, failed.into_err(py).into_value(py).into_any()),
            });
        }
        Ok(out)
    }
}
