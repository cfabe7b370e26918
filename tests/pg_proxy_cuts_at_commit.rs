//! The proxy in `common::pg_proxy`, against a real server, through the
//! `postgres` crate itself: a connection cut just before COMMIT leaves
//! the row absent (the server aborted), one cut just after leaves it
//! present (the server committed), and the client cannot tell the two
//! apart: both are a closed connection. Both COMMIT routes are covered:
//! `Transaction::commit()` (a simple-query `Q`) and `execute("COMMIT")`
//! (Parse/Bind/Execute). Also: refusing new connections, and counting.
mod common;
use common::pg_proxy::{CutStyle, Mode, PgProxy, is_commit};
use common::*;

/// How a commit is sent.
#[derive(Debug, Clone, Copy)]
enum Route {
    /// `Transaction::commit()`: `Q "COMMIT"`.
    Transaction,
    /// `BEGIN` by `batch_execute`, then `execute("COMMIT", &[])`.
    Extended,
}

/// Insert `tag` in a transaction through the proxy, with `mode` armed for
/// the commit; the commit's error, if any.
fn write_through(proxy: &PgProxy, db: &str, tag: &str, mode: Mode, route: Route) -> Result<(), postgres::Error> {
    let mut client = postgres::Client::connect(&proxy.url(db), postgres::NoTls).expect("connect through the proxy");
    let result = match route {
        Route::Transaction => {
            let mut tx = client.transaction().unwrap();
            tx.execute("INSERT INTO t (tag) VALUES ($1)", &[&tag]).unwrap();
            proxy.once(mode);
            tx.commit()
        }
        Route::Extended => {
            client.batch_execute("BEGIN").unwrap();
            client.execute("INSERT INTO t (tag) VALUES ($1)", &[&tag]).unwrap();
            proxy.once(mode);
            client.execute("COMMIT", &[]).map(|_| ())
        }
    };
    if result.is_err() {
        assert!(client.is_closed(), "after a cut the client's connection is closed");
    }
    result
}

/// The error as the caller sees it: `is_closed()`, the `io::ErrorKind`
/// underneath if any, and the text.
fn describe(e: &postgres::Error) -> String {
    let io = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .map(|io| format!("{:?}", io.kind()));
    format!(
        "is_closed={} io_kind={} sqlstate={} display={e:?}",
        e.is_closed(),
        io.as_deref().unwrap_or("none"),
        e.code().map_or("none", |c| c.code()),
    )
}

fn present(server: &pg::PgServer, db: &str, tag: &str) -> bool {
    let n: i64 = server
        .admin(db)
        .query_one("SELECT count(*) FROM t WHERE tag = $1", &[&tag])
        .unwrap()
        .get(0);
    n == 1
}

/// The server ended the cut session and its transaction with it: no
/// backend is left `idle in transaction`.
fn wait_no_open_transaction(server: &pg::PgServer, db: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut admin = server.admin(db);
    loop {
        let open: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'",
                &[],
            )
            .unwrap()
            .get(0);
        if open == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a transaction was still open 10 s after the cut"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_cut_before_commit_aborts_and_a_cut_after_commits() {
    let started = std::time::Instant::now();
    let server = pg_or_skip!();
    let db = server.create_db("proxy");
    server
        .admin(&db)
        .batch_execute("CREATE TABLE t (tag text PRIMARY KEY)")
        .unwrap();
    let proxy = PgProxy::start(server.port()).expect("proxy");

    // Untouched traffic first: COMMIT passes, and text that merely
    // mentions COMMIT is not one.
    write_through(&proxy, &db, "pass", Mode::Pass, Route::Transaction).expect("pass-through commits");
    assert!(present(&server, &db, "pass"));
    {
        let mut c = postgres::Client::connect(&proxy.url(&db), postgres::NoTls).unwrap();
        proxy.once(Mode::DropBeforeCommit);
        let s: String = c.query_one("SELECT 'COMMIT'", &[]).unwrap().get(0);
        assert_eq!(s, "COMMIT");
        assert_eq!(proxy.cuts_before_commit(), 0);
        proxy.set_mode(Mode::Pass);
    }

    for style in [CutStyle::Close, CutStyle::Reset] {
        proxy.set_cut_style(style);
        for route in [Route::Transaction, Route::Extended] {
            let tag = format!("before-{style:?}-{route:?}");
            let e = write_through(&proxy, &db, &tag, Mode::DropBeforeCommit, route)
                .expect_err("a COMMIT held back fails at the client");
            println!("drop before COMMIT, {style:?}, {route:?}: {}", describe(&e));
            assert!(
                !present(&server, &db, &tag),
                "the server never saw COMMIT: the row is absent"
            );
            wait_no_open_transaction(&server, &db);

            let tag = format!("after-{style:?}-{route:?}");
            let e = write_through(&proxy, &db, &tag, Mode::DropAfterCommit, route)
                .expect_err("a COMMIT whose answer is held back fails at the client");
            println!("drop after COMMIT, {style:?}, {route:?}: {}", describe(&e));
            assert!(
                present(&server, &db, &tag),
                "the server committed before the cut: the row is present"
            );
        }
    }
    assert_eq!(proxy.cuts_before_commit(), 4);
    assert_eq!(proxy.cuts_after_commit(), 4);
    assert_eq!(
        proxy.swallowed_commit_errors(),
        0,
        "every held-back answer was a success"
    );
    assert_eq!(proxy.mode(), Mode::Pass, "each cut was armed for one commit");
    assert!(
        proxy.commits_seen() >= 9,
        "one pass-through and eight cut: {}",
        proxy.commits_seen()
    );

    // Refusing: a new connection is closed at once; live ones carry on.
    proxy.set_cut_style(CutStyle::Close);
    let mut live = postgres::Client::connect(&proxy.url(&db), postgres::NoTls).unwrap();
    let accepted = proxy.accepted();
    proxy.set_mode(Mode::Refuse);
    let Err(e) = postgres::Client::connect(&proxy.url(&db), postgres::NoTls) else {
        panic!("a connection was accepted in Refuse mode");
    };
    println!("refused at accept: {}", describe(&e));
    assert_eq!(proxy.refused(), 1);
    assert_eq!(proxy.accepted(), accepted + 1, "the refused connection is counted");
    live.batch_execute("SELECT 1")
        .expect("an open connection is not affected");
    proxy.set_mode(Mode::Pass);
    postgres::Client::connect(&proxy.url(&db), postgres::NoTls).expect("accepted again");
    drop(live);
    println!(
        "connections accepted {}, refused {}, commits seen {}; {:?}",
        proxy.accepted(),
        proxy.refused(),
        proxy.commits_seen(),
        started.elapsed()
    );
}

#[test]
fn commit_text_is_recognised_as_the_server_would_run_it() {
    for yes in [
        "COMMIT",
        "commit",
        " COMMIT; ",
        "END",
        "end transaction",
        "COMMIT WORK;",
    ] {
        assert!(is_commit(yes), "{yes:?}");
    }
    for no in [
        "SELECT 'COMMIT'",
        "COMMIT PREPARED 'x'",
        "ROLLBACK",
        "INSERT INTO t VALUES (1); COMMIT",
        "",
    ] {
        assert!(!is_commit(no), "{no:?}");
    }
}
