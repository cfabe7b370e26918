//! History rewrites on PostgreSQL, on a real server, follow the same rules
//! as on SQLite (`tests/history_archive.rs`): pop and clear archive,
//! restore brings rows back at their seqs and skips a uid active again,
//! fork copies with derived uids and lineage, a compaction's replace is one
//! transaction, and an edit that fails for real (the archive revoked from
//! the writer's role) changes nothing.
mod common;
use common::*;
use serde_json::json;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::history::{ForkRefused, Reason, Selector};
use turnsafe_host::message::Message;

fn uids(server: &pg::PgServer, db: &str, session: &str) -> Vec<String> {
    pg::rows(server, db, session).into_iter().map(|r| r.0).collect()
}

#[test]
fn pop_clear_restore_fork_and_replace_on_postgres() {
    let server = pg_or_skip!();
    let db = server.create_db("history");
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 4)).persisted);

    let popped = store.pop_last(&sid("s1")).unwrap().expect("a message");
    assert_eq!((popped.uid.as_str(), popped.seq), ("a-3", 4));
    let archived = store.archived("s1", None).unwrap();
    assert_eq!(archived.len(), 1);
    assert_eq!(archived[0].reason, "pop");
    assert!(archived[0].holder.as_deref().unwrap_or_default().starts_with("pid-"));

    // The same uid sent again is active once more: restore skips it.
    assert!(store.append_batch(&sid("s1"), &batch("a", 4)).persisted);
    let r = store.restore(&sid("s1"), &Selector::Uids(vec!["a-3".into()])).unwrap();
    assert_eq!(r.skipped_active, ["a-3"]);
    assert_eq!(uids(&server, &db, "s1"), ["a-0", "a-1", "a-2", "a-3"]);

    // Fork, retried.
    let f = store.fork(&sid("s1"), 2, &sid("s2")).unwrap().unwrap();
    assert_eq!((f.copied, f.already), (2, 0));
    let f = store.fork(&sid("s1"), 2, &sid("s2")).unwrap().unwrap();
    assert_eq!((f.copied, f.already), (0, 2));
    assert!(matches!(
        store.fork(&sid("s1"), 1, &sid("s2")).unwrap(),
        Err(ForkRefused::Exists { .. })
    ));
    let lineage = store.lineage("s2").unwrap();
    assert_eq!((lineage.session.as_str(), lineage.seq), ("s1", 2));
    assert_eq!(
        uids(&server, &db, "s2"),
        [
            turnsafe_host::history::fork_uid("s2", "a-0"),
            turnsafe_host::history::fork_uid("s2", "a-1")
        ]
    );

    // A compaction's replace: a stale suffix changes nothing; then one transaction.
    let summary = vec![Message::from_item(
        json!({"role": "user", "content": "summary"})
            .as_object()
            .unwrap()
            .clone(),
    )];
    let stale = vec!["a-3".to_string()];
    assert!(
        !store
            .replace_suffix(&sid("s1"), 3, &summary, Some(&stale), None)
            .unwrap()
    );
    let expected = vec!["a-2".to_string(), "a-3".to_string()];
    assert!(
        store
            .replace_suffix(&sid("s1"), 3, &summary, Some(&expected), None)
            .unwrap()
    );
    let rows = pg::rows(&server, &db, "s1");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[2].2, "summary");

    // Clear, then restore everything the clear archived.
    let cleared = store.clear_archiving(&sid("s1"), &[]).unwrap();
    assert_eq!(cleared.rows.len(), 3);
    assert!(pg::rows(&server, &db, "s1").is_empty());
    let r = store
        .restore(
            &sid("s1"),
            &Selector::Reason {
                reason: Reason::Clear,
                since_ms: None,
            },
        )
        .unwrap();
    assert_eq!(r.restored.len(), 3);
    assert_eq!(pg::rows(&server, &db, "s1"), rows);
}

#[test]
fn an_edit_that_fails_for_real_changes_nothing_on_postgres() {
    let server = pg_or_skip!();
    let db = server.create_db("historyfail");
    server.create_role("agent", "agent-pw");
    server.grant_create(&db, "agent");
    let url = server.url_as("agent", "agent-pw", &db);
    let home = Home::new();
    let mut store = pg::store(&url, home.path());
    assert!(store.append_batch(&sid("s1"), &batch("a", 3)).persisted);
    // The archive can no longer be written by the writer's role.
    server
        .admin(&db)
        .batch_execute("ALTER TABLE archive OWNER TO postgres; REVOKE ALL ON archive FROM agent")
        .unwrap();
    let before = pg::rows(&server, &db, "s1");
    let e = store.pop_last(&sid("s1")).unwrap_err();
    assert!(e.message.contains("permission denied"), "{e}");
    assert!(store.clear_session(&sid("s1")).is_err());
    assert_eq!(pg::rows(&server, &db, "s1"), before, "nothing was taken out");
    let archived: i64 = server
        .admin(&db)
        .query_one("SELECT count(*) FROM archive", &[])
        .unwrap()
        .get(0);
    assert_eq!(archived, 0);
}
