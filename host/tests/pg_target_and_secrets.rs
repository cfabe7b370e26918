//! How a PostgreSQL target is given and shown: `--db` and `TURNSAFE_DB`,
//! a warning for a password on the command line, a libpq-style password
//! file, `sslmode=prefer` refused, and only `postgres://user@host:port/db`
//! in any output.
#[path = "../../tests/common/pg.rs"]
mod pg;

use std::os::unix::fs::PermissionsExt;

use assert_cmd::Command;
use serde_json::Value;

const BATCH: &str = "[{\"role\":\"user\",\"content\":\"hello\",\"uid\":\"u1\"}]\n";

fn outcomes(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `turnsafe <cmd> --db <url> --home <home>`, with `--session` where the
/// command takes one, and one batch on stdin.
fn run_with_db(cmd: &str, url: &str, session: &str, home: &std::path::Path) -> std::process::Output {
    let mut args = vec![cmd, "--db", url];
    if cmd == "append" || cmd == "show" {
        args.extend(["--session", session]);
    }
    Command::cargo_bin("turnsafe")
        .unwrap()
        .args(&args)
        .arg("--home")
        .arg(home)
        .write_stdin(BATCH)
        .output()
        .unwrap()
}

#[test]
fn targets_passwords_and_what_is_shown() {
    let server = pg_or_skip!();
    let db = server.create_db("targets");
    let url = server.url(&db);
    let home = tempfile::tempdir().unwrap();

    // A password on the command line works, and draws the warning.
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "s1", "--db", &url, "--home"])
        .arg(home.path())
        .env_remove("TURNSAFE_DB")
        .env("TURNSAFE_LOG", "debug")
        .write_stdin(BATCH)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(outcomes(&out.stdout)[0]["persisted"], true);
    assert!(stderr.contains("warning: --db carries a password"), "{stderr}");
    assert!(stderr.contains("TURNSAFE_DB") && stderr.contains("pgpass"), "{stderr}");
    assert!(!stderr.contains(pg::PASSWORD) && !String::from_utf8_lossy(&out.stdout).contains(pg::PASSWORD));

    // TURNSAFE_DB: no warning.
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["show", "--session", "s1"])
        .env("TURNSAFE_DB", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("hello"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));

    // A password file, as libpq reads it; a readable-by-others one is ignored.
    let bare = format!(
        "postgres://{}@127.0.0.1:{}/{db}?sslmode=disable",
        pg::USER,
        server.port()
    );
    let passfile = home.path().join("pgpass");
    std::fs::write(
        &passfile,
        format!("127.0.0.1:{}:*:{}:{}\n", server.port(), pg::USER, pg::PASSWORD),
    )
    .unwrap();
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let show = |passfile: &std::path::Path| {
        Command::cargo_bin("turnsafe")
            .unwrap()
            .args(["show", "--session", "s1", "--db", &bare])
            .env("PGPASSFILE", passfile)
            .output()
            .unwrap()
    };
    let out = show(&passfile);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning: --db"));
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = show(&passfile);
    assert_eq!(out.status.code(), Some(1), "no password, no entry");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&server.shown(&db)), "{stderr}");

    // doctor names the target in the shown form only.
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["doctor", "--json", "--db", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains(pg::PASSWORD));
    let facts: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["type"] == "facts")
        .unwrap();
    assert_eq!(facts["data"]["db"], server.shown(&db));
    assert_eq!(facts["data"]["messages"], 1);

    // A server that accepts no writes is a doctor error (exit 6).
    server
        .admin("postgres")
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" SET default_transaction_read_only = on"
        ))
        .unwrap();
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["doctor", "--db", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(6), "{text}");
    assert!(
        text.contains("[error] postgres:") && text.contains("accepts no writes"),
        "{text}"
    );
    server
        .admin("postgres")
        .batch_execute(&format!("ALTER DATABASE \"{db}\" RESET default_transaction_read_only"))
        .unwrap();

    // sslmode=prefer falls back to plaintext silently: refused, exit 2.
    let prefer = url.replace("sslmode=disable", "sslmode=prefer");
    for cmd in ["append", "show", "replay", "doctor"] {
        let out = run_with_db(cmd, &prefer, "s1", home.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {stderr}");
        assert!(stderr.contains("sslmode=prefer is refused"), "{cmd}: {stderr}");
        assert!(!stderr.contains(pg::PASSWORD));
    }

    // target_session_attrs=read-only names only servers that refuse writes:
    // a writer refuses it before connecting (nothing listens there, and
    // nothing is diverted), exit 2.
    let read_only = format!(
        "postgres://{}@127.0.0.1:1/{db}?sslmode=disable&target_session_attrs=read-only",
        pg::USER
    );
    for cmd in ["append", "replay"] {
        let out = run_with_db(cmd, &read_only, "ro", home.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {stderr}");
        assert!(
            stderr.contains("target_session_attrs=read-only") && stderr.contains("read-write"),
            "{cmd}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{cmd}: no outcome");
    }
    assert!(
        !home.path().join("sessions").join("ro.jsonl").exists(),
        "nothing diverted for the refused target"
    );

    // A server that cannot be reached: the batch is diverted, the copy
    // names the receipt, and no output shows more than user@host:port/db.
    let closed = format!(
        "postgres://{}:{}@127.0.0.1:1/{db}?sslmode=disable",
        pg::USER,
        pg::PASSWORD
    );
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "s2", "--home"])
        .arg(home.path())
        .env("TURNSAFE_DB", &closed)
        .env("TURNSAFE_LOG", "debug")
        .write_stdin(BATCH)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let o = &outcomes(&out.stdout)[0];
    assert_eq!(
        (o["operation"].as_str(), o["cause"].as_str()),
        (Some("open"), Some("unavailable")),
        "nothing listens there: waited for within the patience, then diverted: {o}"
    );
    assert_eq!(o["diverted"], 1);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(pg::PASSWORD), "{all}");
    assert!(
        all.contains(&format!("postgres://{}@127.0.0.1:1/{db}", pg::USER)),
        "{all}"
    );
}
