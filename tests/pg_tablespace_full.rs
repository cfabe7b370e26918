//! `common::pg_limits::SmallTablespace` against a real server: a database
//! in a tablespace on a small tmpfs fills until an insert fails with
//! SQLSTATE 53100, while the WAL, on the normal disk, keeps working (a
//! write to another database commits; the server does not PANIC). Once
//! the filler is dropped, the same insert commits. Needs root for the
//! mount: under `CI=true` it must run; elsewhere a missing capability is
//! a recorded skip.
mod common;
use common::pg_limits::SmallTablespace;
use common::*;

#[test]
fn a_full_tablespace_refuses_inserts_with_53100() {
    let started = std::time::Instant::now();
    let server = pg_or_skip!();
    let ts = skip_unless!(SmallTablespace::create(&server, "small_ts", "16m"));
    let db = ts.create_db("full");
    let (free, total) = ts.space();
    println!(
        "tablespace {} on a tmpfs of {total} bytes, {free} free after CREATE DATABASE",
        ts.path().display()
    );

    let mut c = server.admin(&db);
    c.batch_execute("CREATE TABLE t (id serial PRIMARY KEY, body text)")
        .unwrap();
    c.execute("INSERT INTO t (body) VALUES ('before')", &[]).unwrap();

    let full = ts.fill(&db).expect("the tablespace fills up");
    println!(
        "filled {} bytes; SQLSTATE {} {:?}; {} bytes free",
        full.filled_bytes,
        full.code,
        full.message,
        ts.space().0
    );
    assert_eq!(full.code, "53100");
    assert!(full.message.contains("No space left on device"), "{}", full.message);

    // More than a page of rows: needs a page the tmpfs cannot give.
    let e = c
        .execute(
            "INSERT INTO t (body) SELECT repeat('y', 1000) FROM generate_series(1, 20)",
            &[],
        )
        .expect_err("the table cannot grow");
    println!(
        "insert into the full database: SQLSTATE {} {:?}",
        e.code().map_or("none", |c| c.code()),
        e.as_db_error().map(|d| d.message())
    );
    assert_eq!(e.code().map(|c| c.code()), Some("53100"), "{e}");

    // WAL is on the normal disk: the server is up and writes elsewhere.
    let mut other = server.admin("postgres");
    other.batch_execute("CREATE TABLE elsewhere (x int)").unwrap();
    other.execute("INSERT INTO elsewhere VALUES (1)", &[]).unwrap();
    assert!(!server.log().contains("PANIC"), "{}", server.log());

    ts.free(&db);
    c.execute(
        "INSERT INTO t (body) SELECT repeat('y', 1000) FROM generate_series(1, 20)",
        &[],
    )
    .expect("with the filler dropped, the insert commits");
    let n: i64 = c.query_one("SELECT count(*) FROM t", &[]).unwrap().get(0);
    assert_eq!(n, 21);
    println!("{:?}", started.elapsed());
}
