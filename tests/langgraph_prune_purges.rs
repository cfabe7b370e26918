//! `turnsafe prune --older-than D` removes for good the LangGraph rows a
//! delete marked more than D ago, and only those, on SQLite and on a real
//! PostgreSQL server (`docs/LANGGRAPH.md`, "Deletes"): rows marked more
//! recently stay marked, live rows stay live, and the JSON report's
//! `checkpoints_purged` and `writes_purged` count exactly what went; a dry
//! run first counts the same and removes nothing.
//!
//! Three threads: `old` (marked, then its marks moved two days back from
//! outside the store, as if the delete had run then), `recent` (marked
//! now) and `live`. What is stored is read from outside the store.
mod common;

use assert_cmd::Command;
use common::graph::{checkpoint, write};
use common::*;
use serde_json::{Value, json};
use turnsafe_host::backend::Engine;
use turnsafe_host::graph::{GraphBatch, GraphEdit};

const DAY_MS: i64 = 86_400_000;

/// Per thread: two checkpoints and three writes of `old`, one and two of
/// `recent`, one and one of `live`.
fn fill(store: &mut impl Engine) {
    for (thread, checkpoints, writes) in [("old", 2, 3), ("recent", 1, 2), ("live", 1, 1)] {
        for c in 0..checkpoints {
            let id = format!("1ef{c}");
            let out = store.put_graph(&GraphBatch::Checkpoint(checkpoint(thread, &id)));
            assert!(out.persisted, "{}", out.to_value());
        }
        let batch: Vec<_> = (0..writes)
            .map(|idx| {
                let mut w = write(thread, "1ef0");
                w.idx = idx;
                w
            })
            .collect();
        let out = store.put_graph(&GraphBatch::Writes(batch));
        assert!(out.persisted, "{}", out.to_value());
    }
    for thread in ["old", "recent"] {
        let edited = store
            .graph_edit(&GraphEdit::DeleteThread(thread.into()))
            .expect("delete_thread");
        assert!(edited.checkpoints > 0, "{thread}");
    }
}

/// `(thread, checkpoint_id, marked)` of every checkpoint, and `(thread,
/// checkpoint_id, idx, marked)` of every write, in key order.
type Rows = (Vec<(String, String, bool)>, Vec<(String, String, i64, bool)>);

const CHECKPOINTS: &str =
    "SELECT thread_id, checkpoint_id, deleted_ms IS NOT NULL FROM checkpoints ORDER BY thread_id, checkpoint_id";
const WRITES: &str = "SELECT thread_id, checkpoint_id, idx, deleted_ms IS NOT NULL FROM checkpoint_writes \
                      ORDER BY thread_id, checkpoint_id, idx";

fn expected_before() -> Rows {
    let c = |t: &str, id: &str, marked| (t.to_string(), id.to_string(), marked);
    let w = |t: &str, idx, marked| (t.to_string(), "1ef0".to_string(), idx, marked);
    (
        vec![
            c("live", "1ef0", false),
            c("old", "1ef0", true),
            c("old", "1ef1", true),
            c("recent", "1ef0", true),
        ],
        vec![
            w("live", 0, false),
            w("old", 0, true),
            w("old", 1, true),
            w("old", 2, true),
            w("recent", 0, true),
            w("recent", 1, true),
        ],
    )
}

/// What stays: everything but `old`'s rows.
fn expected_after() -> Rows {
    let (c, w) = expected_before();
    (
        c.into_iter().filter(|r| r.0 != "old").collect(),
        w.into_iter().filter(|r| r.0 != "old").collect(),
    )
}

/// `turnsafe prune --older-than 1d --json` (a dry run first when `dry`):
/// its end record's data.
fn prune(home: &Home, db: Option<&str>, dry: bool) -> Value {
    let mut cmd = Command::cargo_bin("turnsafe").expect("the turnsafe binary");
    cmd.args(["prune", "--older-than", "1d", "--json", "--home"])
        .arg(home.path());
    if let Some(url) = db {
        cmd.args(["--db", url]);
    }
    if dry {
        cmd.arg("--dry-run");
    }
    let out = cmd.output().expect("run turnsafe prune");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let end: Value = serde_json::from_str(stdout.lines().last().expect("an end record")).expect("JSON");
    assert_eq!(end["type"], "end", "{stdout}");
    end["data"].clone()
}

/// The report's counts and what it says of the space.
fn counts(end: &Value) -> Value {
    json!({
        "checkpoints_purged": end["checkpoints_purged"],
        "writes_purged": end["writes_purged"],
        "archived": end["archived"],
        "deleted": end["deleted"],
        "dry_run": end["dry_run"],
    })
}

fn purged(checkpoints: u64, writes: u64, dry: bool) -> Value {
    json!({
        "checkpoints_purged": checkpoints,
        "writes_purged": writes,
        "archived": 0,
        "deleted": 0,
        "dry_run": dry,
    })
}

fn sqlite_rows(home: &Home) -> Rows {
    let c = home.other();
    let checkpoints = c
        .prepare(CHECKPOINTS)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let writes = c
        .prepare(WRITES)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    (checkpoints, writes)
}

#[test]
fn prune_older_than_purges_what_was_marked_before_the_cutoff_on_sqlite() {
    let home = Home::new();
    let mut store = home.store();
    fill(&mut store);
    drop(store);
    // The delete of `old` ran two days ago.
    let moved = home.other().execute_batch(&format!(
        "UPDATE checkpoints SET deleted_ms = deleted_ms - 2 * {DAY_MS} WHERE thread_id = 'old';
             UPDATE checkpoint_writes SET deleted_ms = deleted_ms - 2 * {DAY_MS} WHERE thread_id = 'old';"
    ));
    moved.expect("move the marks back");
    assert_eq!(sqlite_rows(&home), expected_before());

    assert_eq!(counts(&prune(&home, None, true)), purged(2, 3, true));
    assert_eq!(sqlite_rows(&home), expected_before(), "a dry run removes nothing");
    assert_eq!(counts(&prune(&home, None, false)), purged(2, 3, false));
    assert_eq!(sqlite_rows(&home), expected_after());
    assert_eq!(
        counts(&prune(&home, None, false)),
        purged(0, 0, false),
        "nothing left marked before the cutoff"
    );
    assert_eq!(sqlite_rows(&home), expected_after());
}

fn pg_rows(server: &pg::PgServer, db: &str) -> Rows {
    let mut admin = server.admin(db);
    let checkpoints = admin
        .query(CHECKPOINTS, &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let writes = admin
        .query(WRITES, &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    (checkpoints, writes)
}

#[test]
fn prune_older_than_purges_what_was_marked_before_the_cutoff_on_postgres() {
    let server = pg_or_skip!();
    let db = server.create_db("lg_prune");
    let url = server.url(&db);
    let home = Home::new();
    let mut store = pg::store(&url, home.path());
    fill(&mut store);
    drop(store);
    server
        .admin(&db)
        .batch_execute(&format!(
            "UPDATE checkpoints SET deleted_ms = deleted_ms - 2 * {DAY_MS} WHERE thread_id = 'old';
             UPDATE checkpoint_writes SET deleted_ms = deleted_ms - 2 * {DAY_MS} WHERE thread_id = 'old';"
        ))
        .expect("move the marks back");
    assert_eq!(pg_rows(&server, &db), expected_before());

    assert_eq!(counts(&prune(&home, Some(&url), true)), purged(2, 3, true));
    assert_eq!(pg_rows(&server, &db), expected_before(), "a dry run removes nothing");
    assert_eq!(counts(&prune(&home, Some(&url), false)), purged(2, 3, false));
    assert_eq!(pg_rows(&server, &db), expected_after());
    assert_eq!(
        counts(&prune(&home, Some(&url), false)),
        purged(0, 0, false),
        "nothing left marked before the cutoff"
    );
    assert_eq!(pg_rows(&server, &db), expected_after());
}
