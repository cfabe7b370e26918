//! LangGraph's checkpoints and pending writes on `Store`, for
//! `turnsafe_store.langgraph`: each put goes through the flush machine as
//! a batch does, and reads and edits run on the store as `history`'s do.
//! The saver serializes; these methods only carry its bytes.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList};
use serde_json::{Map, Value};
use turnsafe_host::clear::ClearError;
use turnsafe_host::graph::{CheckpointRecord, GraphBatch, GraphEdit, GraphQuery, WriteRecord};

use crate::args::read_limit;
use crate::convert::to_py;
use crate::errors::Failed;
use crate::outcome::Outcome;
use crate::store::Store;

#[pymethods]
impl Store {
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
        let metadata: Value = turnsafe_host::json_in::value(metadata)
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
        Ok(py.detach(move || Outcome::of(&store.put_graph(graph))))
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
        Ok(py.detach(move || Outcome::of(&store.put_graph(GraphBatch::Writes(records)))))
    }

    /// The live checkpoints a LangGraph `list`/`get_tuple` asks for, newest
    /// first: tuples `(thread_id, checkpoint_ns, checkpoint_id,
    /// parent_checkpoint_id, type, checkpoint, metadata_json, writes)`,
    /// each write `(task_id, channel, type, value, task_path, idx)`.
    #[pyo3(name = "_lg_read", signature = (thread_id = None, checkpoint_ns = None, checkpoint_id = None, before = None, filter = None, limit = None))]
    #[allow(clippy::too_many_arguments)]
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
            Some(text) => match turnsafe_host::json_in::value(text) {
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
            .map_err(|e| Failed::of_read(e).into_err(py))?;
        let list = PyList::empty(py);
        for c in rows {
            let r = c.record;
            let writes = PyList::empty(py);
            for w in c.writes {
                writes.append((
                    w.task_id,
                    w.channel,
                    w.kind,
                    PyBytes::new(py, &w.value),
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
                PyBytes::new(py, &r.checkpoint),
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
                    _ => s.graph_edit(&edit).map_err(ClearError::Edit),
                })
            })
            .map_err(|e| Failed::of_clear(&e).into_err(py))?;
        to_py(
            py,
            &serde_json::json!({"checkpoints": done.checkpoints, "writes": done.writes}),
        )
    }
}
