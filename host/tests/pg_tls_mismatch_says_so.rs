//! A server and a URL that disagree on TLS, against real servers: the
//! batch is diverted as `disk` (configuration: the next batch meets it
//! again), and the copy and `turnsafe doctor --db` say which way they
//! disagree, with the URL's `sslmode` and `sslrootcert` to fix it, instead
//! of sending the user to check disks.
//!
//! - A plain loopback server (no `ssl`) under the default `sslmode`
//!   (`require`): "the server does not offer TLS". `sslmode=disable`
//!   then writes to it.
//! - A TLS server whose certificate another CA signed than the one
//!   `sslrootcert` names, or than any public root (no `sslrootcert`): "the
//!   server's certificate failed verification". Its own CA then writes to
//!   it.
#[path = "../../tests/common/pg.rs"]
mod pg;

use assert_cmd::Command;
use serde_json::Value;

const BATCH: &str = "[{\"role\":\"user\",\"content\":\"over tls?\",\"uid\":\"t1\"}]\n";

const NOT_OFFERED: &str = "the server does not offer TLS";
const CERTIFICATE: &str = "the server's certificate failed verification";

/// `turnsafe append` of one batch to `url`: exit code and the outcome.
fn append(home: &std::path::Path, url: &str) -> (Option<i32>, Value) {
    let out = Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "s1", "--home"])
        .arg(home)
        .env("TURNSAFE_DB", url)
        .write_stdin(BATCH)
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("{}")
        .to_string();
    (out.status.code(), serde_json::from_str(&line).unwrap())
}

/// `turnsafe doctor --db url`, as text and as JSON Lines: exit code, the
/// text, and the findings.
fn doctor(url: &str) -> (Option<i32>, String, Vec<Value>) {
    let run = |json: bool| {
        let mut cmd = Command::cargo_bin("turnsafe").unwrap();
        cmd.args(["doctor", "--db", url]);
        if json {
            cmd.arg("--json");
        }
        cmd.env_remove("TURNSAFE_DB").output().unwrap()
    };
    let text = run(false);
    let json = run(true);
    assert_eq!(text.status.code(), json.status.code());
    let findings = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "finding")
        .map(|v| v["data"].clone())
        .collect();
    (
        text.status.code(),
        String::from_utf8_lossy(&text.stdout).into_owned(),
        findings,
    )
}

/// The outcome of a batch the TLS handshake kept from `url`: diverted as
/// `disk`, and a copy that names the handshake, `reason`, `sslmode` and
/// `sslrootcert`, and not the disk's checks.
fn assert_diverted_for(code: Option<i32>, o: &Value, reason: &str) {
    assert_eq!(code, Some(3), "{o}");
    assert_eq!(
        (o["operation"].as_str(), o["cause"].as_str(), o["diverted"].as_u64()),
        (Some("open"), Some("disk"), Some(1)),
        "{o}"
    );
    let copy = &o["copy"];
    assert_eq!(copy["code"], "disk.diverted", "{o}");
    assert_eq!(copy["details"]["tls"], reason, "{o}");
    let body = copy["body"].as_str().unwrap();
    assert!(
        body.starts_with("The TLS handshake with the database server failed"),
        "{body}"
    );
    assert!(!body.contains("could not be opened or written"), "{body}");
    let first = copy["remediation"][0].as_str().unwrap();
    assert!(first.contains("sslmode") && first.contains("sslrootcert"), "{o}");
    assert!(!copy.to_string().contains("ulimit"), "no disk checks: {o}");
}

/// What `turnsafe doctor --db` says of a server the handshake fails with.
fn assert_doctor_says(url: &str, reason: &str) {
    let (code, text, findings) = doctor(url);
    assert_eq!(code, Some(6), "{text}");
    let tls: Vec<&Value> = findings.iter().filter(|f| f["kind"] == "tls").collect();
    assert_eq!(tls.len(), 1, "{findings:?}");
    let f = tls[0];
    assert_eq!(f["severity"], "error", "{f}");
    assert_eq!(f["cause"], "disk", "{f}");
    let message = f["message"].as_str().unwrap();
    assert!(
        message.contains("the TLS handshake failed") && message.contains(reason),
        "{f}"
    );
    // Named only as user@host:port/db: no password, no parameters.
    assert!(
        !message.contains(pg::PASSWORD) && !message.contains("sslrootcert="),
        "{f}"
    );
    let steps = f["remediation"].to_string();
    assert!(steps.contains("sslmode") && steps.contains("sslrootcert"), "{f}");
    assert!(text.contains("[error] tls: ") && text.contains(reason), "{text}");
    assert!(text.contains("- Set the URL's `sslmode`"), "{text}");
}

fn messages_table_exists(server: &pg::PgServer, db: &str) -> bool {
    server
        .admin(db)
        .query_one("SELECT to_regclass('messages') IS NOT NULL", &[])
        .unwrap()
        .get(0)
}

#[test]
fn a_server_without_tls_under_the_default_sslmode() {
    let plain = pg_or_skip!();
    let db = plain.create_db("plain");
    let home = tempfile::tempdir().unwrap();
    let base = format!(
        "postgres://{}:{}@127.0.0.1:{}/{db}",
        pg::USER,
        pg::PASSWORD,
        plain.port()
    );

    // No sslmode: `require`, which never falls back to plaintext.
    let (code, o) = append(home.path(), &base);
    assert_diverted_for(code, &o, NOT_OFFERED);
    assert!(!messages_table_exists(&plain, &db), "nothing was sent in plaintext");
    assert_doctor_says(&base, NOT_OFFERED);

    // The remedy the copy names: plaintext, on loopback.
    let (code, o) = append(home.path(), &format!("{base}?sslmode=disable"));
    assert_eq!((code, &o["persisted"]), (Some(0), &Value::Bool(true)), "{o}");
    assert_eq!(pg::rows(&plain, &db, "s1").len(), 1);
    let (code, text, _) = doctor(&format!("{base}?sslmode=disable"));
    assert!(!text.contains("] tls: "), "{text}");
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn a_certificate_another_ca_signed() {
    let server_certs = tempfile::tempdir().unwrap();
    let (own_ca, settings) = turnsafe_tests::require!(pg::make_certs(server_certs.path()));
    // A second CA, which never signed the server's certificate.
    let other_certs = tempfile::tempdir().unwrap();
    let (other_ca, _) = turnsafe_tests::require!(pg::make_certs(other_certs.path()));
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let server = pg_or_skip!(&settings);
    let db = server.create_db("tls");
    let home = tempfile::tempdir().unwrap();
    let base = format!(
        "postgres://{}:{}@127.0.0.1:{}/{db}?sslmode=require",
        pg::USER,
        pg::PASSWORD,
        server.port()
    );

    // A CA of the same name: rustls finds it, and the signature fails.
    let wrong = format!("{base}&sslrootcert={}", other_ca.display());
    let (code, o) = append(home.path(), &wrong);
    assert_diverted_for(code, &o, CERTIFICATE);
    assert!(!messages_table_exists(&server, &db), "nothing was sent");
    assert_doctor_says(&wrong, CERTIFICATE);
    // No sslrootcert: the public roots know no such issuer.
    let (code, o) = append(home.path(), &base);
    assert_diverted_for(code, &o, CERTIFICATE);
    assert_doctor_says(&base, CERTIFICATE);

    // The server's own CA: verified, written.
    let right = format!("{base}&sslrootcert={}", own_ca.display());
    let (code, o) = append(home.path(), &right);
    assert_eq!((code, &o["persisted"]), (Some(0), &Value::Bool(true)), "{o}");
    let (code, text, _) = doctor(&right);
    assert!(!text.contains("] tls: "), "{text}");
    assert_eq!(code, Some(0), "{text}");
}
