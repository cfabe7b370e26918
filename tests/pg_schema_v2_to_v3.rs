//! A PostgreSQL database written by the schema v2 code
//! (`tests/fixtures/pg-v2.sql`) gains the archive and the lineage (v3) at
//! the first open: every row stays as it was, and edits then archive.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;

const FIXTURE: &str = include_str!("fixtures/pg-v2.sql");

#[test]
fn a_version_2_database_is_migrated_and_keeps_every_row() {
    let server = pg_or_skip!();
    let db = server.create_db("pgv2");
    server.admin(&db).batch_execute(FIXTURE).unwrap();
    let version = || -> String {
        server
            .admin(&db)
            .query_one("SELECT value FROM state_meta WHERE key = 'schema_version'", &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(version(), "2");
    let before = pg::rows(&server, &db, "s1");
    assert_eq!(before.len(), 5);
    let home = Home::new();
    let mut store = pg::store(&server.url(&db), home.path());
    assert!(store.append_batch(&sid("s1"), &batch("new", 1)).persisted);
    // Through version 3 to the current one.
    assert_eq!(version(), turnsafe_host::pg::schema::VERSION.to_string());
    let after = pg::rows(&server, &db, "s1");
    assert_eq!(&after[..5], &before[..]);
    assert_eq!(after[5].1, 6);
    let popped = store.pop_last(&sid("s1")).unwrap().unwrap();
    assert_eq!(popped.uid, "new-0");
    assert_eq!(store.archived("s1", None).unwrap()[0].reason, "pop");
    assert!(store.lineage("s1").is_none());
}
