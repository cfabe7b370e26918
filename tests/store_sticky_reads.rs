//! One rule for every read on a sticky handle: once a sticky cause (a
//! corrupt page, the WAL and shm deleted under the handle, the database
//! file replaced) quarantines a handle, every read through it refuses with
//! the error `rows` gives, the sticky cause with it: the archive
//! (`Store.show(archived=True)` in Python), the transcript, search,
//! `stored_uids`, LangGraph's checkpoints and the identity. None of them
//! reads a database the handle no longer trusts, or one that is no longer
//! the one it wrote to (the replaced file's old inode, still open).
//!
//! Each sticky cause is induced for real, as `store_sticky_handle.rs` does.
mod common;
use common::*;
use turnsafe_host::backend::History;
use turnsafe_host::backend::{Backend, BackendError, ReadError};
use turnsafe_host::graph::GraphQuery;
use turnsafe_host::store::SessionStore;
use turnsafe_policy::Cause;

/// A handle with a committed session, one message of it popped to the
/// archive, that then meets `cause` through `breaker` and turns sticky.
fn sticky_store(home: &Home, cause: Cause, breaker: impl FnOnce(&Home)) -> SessionStore {
    let mut store = home.store();
    assert!(store.append_batch(&sid("s1"), &batch("ok", 3)).persisted);
    assert!(store.pop_last(&sid("s1")).expect("pop").is_some());
    // A fork, for a lineage to read.
    assert!(store.fork(&sid("s1"), 1, &sid("f1")).expect("fork").is_ok());
    // Before: every read answers from the database.
    assert_eq!(store.rows("s1", None).expect("rows").len(), 2);
    assert_eq!(store.archived("s1", None).expect("archived").len(), 1);
    assert_eq!(store.transcript("s1").expect("transcript").len(), 2);
    assert_eq!(store.stored_uids("s1", &["ok-0".into()]).expect("uids"), ["ok-0"]);
    assert_eq!(
        store.search("lorem", Some("s1"), 10, true).expect("search").hits.len(),
        3
    );
    assert!(store.lineage("f1").is_some());
    breaker(home);
    let out = store.append_batch(&sid("s1"), &batch("hit", 2));
    assert!(!out.persisted, "{}", out.to_value());
    assert_eq!(out.cause, Some(cause), "{}", out.to_value());
    assert_eq!(store.sticky(), Some(cause));
    store
}

/// What each read gave that is not `rows`' refusal; every path is tried
/// before the test fails, so a failure names all that read anyway.
#[derive(Default)]
struct Wrong(Vec<String>);

impl Wrong {
    /// `got` must be the error every read gives: `rows`'.
    fn read(&mut self, what: &str, got: Result<impl std::fmt::Debug, ReadError>, want: &ReadError) {
        match got {
            Err(e) if e.message == want.message && e.cause == want.cause => {}
            other => self.0.push(format!("{what}: {other:?}")),
        }
    }

    /// The same, through the seam's `BackendError`.
    fn backend(&mut self, what: &str, got: Result<impl std::fmt::Debug, BackendError>, want: &ReadError) {
        match got {
            Err(BackendError::Refused(e)) => self.read(what, Err::<(), _>(e), want),
            other => self.0.push(format!("{what}: {other:?}")),
        }
    }
}

fn every_read_refuses_as_rows_does(cause: Cause, breaker: impl FnOnce(&Home)) {
    let home = Home::new();
    let mut store = sticky_store(&home, cause, breaker);
    let want = store.rows("s1", None).expect_err("rows refuses on a sticky handle");
    assert_eq!(want.cause, Some(cause), "{want:?}");
    assert!(
        want.message.contains("refuses to touch its database"),
        "{}",
        want.message
    );

    let mut wrong = Wrong::default();
    wrong.read("archived", store.archived("s1", None), &want);
    wrong.read("History::archived", History::archived(&mut store, "s1", None), &want);
    wrong.backend("transcript", store.transcript("s1"), &want);
    wrong.backend("search", store.search("lorem", None, 10, false), &want);
    wrong.backend("search --archived", store.search("lorem", None, 10, true), &want);
    wrong.backend("stored_uids", store.stored_uids("s1", &["ok-0".into()]), &want);
    wrong.backend("identity", store.identity(), &want);
    wrong.read("graph_read", store.graph_read(&GraphQuery::default()), &want);
    if let Some(lineage) = store.lineage("f1") {
        wrong.0.push(format!("lineage: {lineage:?}"));
    }
    assert!(
        wrong.0.is_empty(),
        "on a sticky handle ({cause:?}) these reads did not refuse as rows does ({}):\n{}",
        want.message,
        wrong.0.join("\n")
    );
}

#[test]
fn after_corruption_every_read_refuses() {
    every_read_refuses_as_rows_does(Cause::Corrupt, |home| corrupt_table_page(home, "messages"));
}

#[test]
fn after_the_wal_was_deleted_every_read_refuses() {
    every_read_refuses_as_rows_does(Cause::DeletedWal, |home| {
        for s in ["state.db-wal", "state.db-shm"] {
            std::fs::remove_file(home.path().join(s)).unwrap();
        }
    });
}

#[test]
fn after_the_database_was_replaced_every_read_refuses() {
    every_read_refuses_as_rows_does(Cause::Replaced, |home| {
        std::fs::rename(home.db(), home.path().join("moved.db")).unwrap();
        std::fs::write(home.db(), b"").unwrap();
    });
}
