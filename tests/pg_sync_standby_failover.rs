//! `common::pg_cluster::SyncPair` against two real servers: a commit the
//! primary acknowledged is already readable on the synchronous standby;
//! after SIGKILL to the primary's postmaster and `pg_ctl promote`, a
//! client with the multi-host URL (`target_session_attrs=read-write`)
//! connects to the new primary and writes. The `postgres` crate reads
//! such URLs itself (tokio-postgres's `Config` takes comma-separated
//! `host:port` pairs and `target_session_attrs`, and tries each host in
//! order, checking `SHOW transaction_read_only`). turnsafe's writer, given
//! the same URL, finds the new primary at its next open.
mod common;
use common::pg_cluster::{STANDBY_NAME, SyncPair, replication_state};
use common::*;
use turnsafe_host::backend::Backend;

fn port_of(c: &mut postgres::Client) -> i32 {
    c.query_one("SELECT inet_server_port()", &[]).unwrap().get(0)
}

#[test]
fn an_acknowledged_commit_survives_kill_and_promote() {
    let started = std::time::Instant::now();
    let mut pair = turnsafe_tests::require!(SyncPair::start());
    let (p1, p2) = (pair.primary.port(), pair.standby.port());
    let state = pair.replication().expect("replication state");
    println!("primary {p1}, standby {p2}: {state:?}");
    assert!(state.is_sync(STANDBY_NAME), "{state:?}");
    assert_eq!(state.synchronous_commit, "remote_apply");

    let db = pair.primary.create_db("pair");
    let mut primary = pair.primary.admin(&db);
    primary.batch_execute("CREATE TABLE t (tag text PRIMARY KEY)").unwrap();
    primary.execute("INSERT INTO t VALUES ('acked')", &[]).unwrap();
    // No wait, no retry: the commit returned, so the standby applied it.
    let mut standby = pair.standby.admin(&db);
    let on_standby: i64 = standby
        .query_one("SELECT count(*) FROM t WHERE tag = 'acked'", &[])
        .unwrap()
        .get(0);
    assert_eq!(on_standby, 1, "an acknowledged commit is on the standby");
    let e = standby
        .execute("INSERT INTO t VALUES ('on-standby')", &[])
        .expect_err("the standby is read-only");
    assert_eq!(e.code().map(|c| c.code()), Some("25006"), "{e}");
    drop(standby);

    let url = pair.multi_host_url(&db);
    let mut before = postgres::Client::connect(&url, postgres::NoTls).expect("multi-host connect");
    assert_eq!(
        port_of(&mut before),
        i32::from(p1),
        "the read-write host is the primary"
    );
    let home = Home::new();
    let mut store = pg::store(&url, home.path());
    let first = store.append_batch(&sid("s1"), &batch("a", 2));
    assert!(first.persisted, "{}", first.to_value());
    let identity_before = pair.primary.identity();
    let standby_before = pair.standby.identity();
    println!("primary before: {identity_before:?}");
    println!("standby before: {standby_before:?}");

    let killed = std::time::Instant::now();
    pair.kill_primary().expect("kill -9 the postmaster");
    println!("primary killed in {:?}", killed.elapsed());
    assert!(before.execute("SELECT 1", &[]).is_err(), "the old connection is gone");
    match postgres::Client::connect(&url, postgres::NoTls) {
        Ok(_) => panic!("a read-write host was found with the primary dead and the standby not promoted"),
        Err(e) => println!(
            "multi-host connect, primary dead, standby read-only: {e}: {:?}",
            std::error::Error::source(&e).map(|s| s.to_string())
        ),
    }

    let promoted = std::time::Instant::now();
    pair.promote_standby().expect("promote");
    println!("standby promoted and writable in {:?}", promoted.elapsed());
    let mut after = postgres::Client::connect(&url, postgres::NoTls).expect("multi-host connect after failover");
    assert_eq!(
        port_of(&mut after),
        i32::from(p2),
        "the read-write host is the promoted standby"
    );
    after.execute("INSERT INTO t VALUES ('after-failover')", &[]).unwrap();
    let tags: Vec<String> = after
        .query("SELECT tag FROM t ORDER BY tag", &[])
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tags, ["acked", "after-failover"]);
    let identity_after = pair.standby.identity();
    println!("new primary:    {identity_after:?}");
    assert_eq!(identity_after.system_identifier, identity_before.system_identifier);
    assert_eq!(
        identity_after.wal_timeline,
        identity_before.wal_timeline.map(|t| t + 1),
        "promotion starts a new timeline"
    );
    let later = store.append_batch(&sid("s1"), &batch("b", 2));
    println!(
        "turnsafe writer with the multi-host URL after failover: persisted={} cause={:?} error={:?}",
        later.persisted, later.cause, later.error
    );
    let again = store.append_batch(&sid("s1"), &batch("c", 2));
    println!(
        "and the batch after: persisted={} cause={:?} error={:?}",
        again.persisted, again.cause, again.error
    );
    // Nothing lost: the batch that met the dead connection is diverted
    // (or stored), and the writer's next open finds the new primary.
    assert!(later.persisted || later.diverted == 2, "{}", later.to_value());
    assert!(again.persisted, "{}", again.to_value());
    let uids: Vec<String> = pg::rows(&pair.standby, &db, "s1").into_iter().map(|r| r.0).collect();
    assert!(
        uids.starts_with(&["a-0".to_string(), "a-1".to_string()])
            && uids.ends_with(&["c-0".to_string(), "c-1".to_string()]),
        "{uids:?}"
    );
    let state = replication_state(&pair.standby).unwrap();
    println!("new primary's replication: {state:?}");
    assert!(
        state.synchronous_standby_names.is_empty(),
        "the standby was made before the primary named it: the new primary waits for nobody"
    );

    // What turnsafe's own URL parser makes of the same URL.
    match url.parse::<turnsafe_host::pg::DbUrl>() {
        Ok(u) => println!(
            "turnsafe DbUrl: display {:?}, host {:?}, port {}",
            u.display(),
            u.host(),
            u.port()
        ),
        Err(e) => println!("turnsafe DbUrl refused it: {e}"),
    }
    println!("{:?}", started.elapsed());
}
