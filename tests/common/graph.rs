//! LangGraph records for the store scenarios, and their round trip
//! through the flush machine on either engine.
use serde_json::json;
use turnsafe_host::backend::Engine;
use turnsafe_host::graph::{CheckpointRecord, GraphBatch, GraphQuery, WriteRecord};

/// A checkpoint of `thread` with blob bytes a text path would mangle.
pub fn checkpoint(thread: &str, id: &str) -> CheckpointRecord {
    CheckpointRecord {
        thread_id: thread.into(),
        checkpoint_ns: String::new(),
        checkpoint_id: id.into(),
        parent_checkpoint_id: Some("1ef0".into()),
        kind: Some("msgpack".into()),
        checkpoint: vec![0x81, 0xa1, b'v', 0x00, 0xff, 0x0a],
        metadata: json!({"source": "loop", "step": 3, "run_id": "run-1"}),
    }
}

/// One pending write of checkpoint `id` of `thread`.
pub fn write(thread: &str, id: &str) -> WriteRecord {
    WriteRecord {
        thread_id: thread.into(),
        checkpoint_ns: String::new(),
        checkpoint_id: id.into(),
        task_id: "task-1".into(),
        task_path: "~__pregel_pull, agent".into(),
        idx: 0,
        channel: "messages".into(),
        kind: Some("json".into()),
        value: br#"["hi"]"#.to_vec(),
    }
}

/// Store a checkpoint and one write through the flush machine, each
/// committed, and read them back as LangGraph asks for a thread.
pub fn put_and_read_back(store: &mut impl Engine, thread: &str) {
    let cp = checkpoint(thread, "1ef1");
    let out = store.put_graph(&GraphBatch::Checkpoint(cp.clone()));
    assert!(out.persisted && out.committed == 1, "{}", out.to_value());
    let w = write(thread, "1ef1");
    let out = store.put_graph(&GraphBatch::Writes(vec![w.clone()]));
    assert!(out.persisted && out.committed == 1, "{}", out.to_value());
    let read = store
        .graph_read(&GraphQuery {
            thread_id: Some(thread.into()),
            ..GraphQuery::default()
        })
        .unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].record, cp);
    assert_eq!(read[0].writes, [w]);
}
