//! PostgreSQL: eight writers open a fresh database at the same moment.
//! The migration runs once, under its advisory lock (without it,
//! concurrent `CREATE TABLE IF NOT EXISTS` collide in the catalog), every
//! writer sees the same generation, and every first batch commits.
mod common;
use common::*;
use turnsafe_host::backend::Backend;

#[test]
fn writers_starting_together_migrate_once() {
    let server = pg_or_skip!();
    let db = server.create_db("together");
    let url = server.url(&db);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (url, barrier) = (url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let home = Home::new();
                barrier.wait();
                let mut store = pg::store(&url, home.path());
                let out = store.append_batch(&sid(&format!("s{t}")), &batch(&format!("w{t}"), 3));
                (
                    out.persisted,
                    out.to_value().to_string(),
                    home.divert_file(&format!("s{t}")).exists(),
                )
            })
        })
        .collect();
    for t in threads {
        let (persisted, outcome, diverted) = t.join().unwrap();
        assert!(persisted, "{outcome}");
        assert!(!diverted);
    }
    let mut admin = server.admin(&db);
    let meta: Vec<(String, String)> = admin
        .query("SELECT key, value FROM state_meta ORDER BY key", &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(meta.len(), 2, "{meta:?}");
    assert_eq!(
        meta[1],
        (
            "schema_version".to_string(),
            turnsafe_host::pg::schema::VERSION.to_string()
        )
    );
    let n: i64 = admin.query_one("SELECT count(*) FROM messages", &[]).unwrap().get(0);
    assert_eq!(n, 24);
}
