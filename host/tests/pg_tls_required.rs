//! TLS: `sslmode=require` verifies the server certificate with rustls.
//! Against the server's own CA (`sslrootcert`) the batch commits; without
//! it the certificate is unknown, the open fails, and the batch is
//! diverted, never sent in plaintext. A server with no TLS at all is
//! refused the same way.
#[path = "../../tests/common/pg.rs"]
mod pg;

use assert_cmd::Command;
use serde_json::Value;

const BATCH: &str = "[{\"role\":\"user\",\"content\":\"over tls\",\"uid\":\"t1\"}]\n";

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

#[test]
fn require_verifies_the_certificate() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, settings) = turnsafe_tests::require!(pg::make_certs(certs.path()));
    let mut settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    settings.push("log_connections = on");
    let server = pg_or_skip!(&settings);
    let db = server.create_db("tls");
    let home = tempfile::tempdir().unwrap();
    let base = format!(
        "postgres://{}:{}@127.0.0.1:{}/{db}",
        pg::USER,
        pg::PASSWORD,
        server.port()
    );

    let verified = format!("{base}?sslmode=require&sslrootcert={}", ca.display());
    let (code, o) = append(home.path(), &verified);
    assert_eq!(code, Some(0), "{o}");
    assert_eq!(o["persisted"], true);
    // The server logged that connection as TLS.
    assert!(server.log().contains("SSL enabled"), "{}", server.log());

    // No sslrootcert: the Mozilla roots do not know this CA.
    let (code, o) = append(home.path(), &format!("{base}?sslmode=require"));
    assert_eq!(code, Some(3), "{o}");
    assert_eq!(
        (o["operation"].as_str(), o["cause"].as_str()),
        (Some("open"), Some("disk")),
        "{o}"
    );
    assert_eq!(o["diverted"], 1);

    // A default URL (no sslmode) is `require`, so it fails the same way.
    let (code, _) = append(home.path(), &base);
    assert_eq!(code, Some(3));

    // A server with no TLS: `require` never falls back to plaintext.
    let plain = pg_or_skip!();
    let pdb = plain.create_db("plain");
    let url = format!(
        "postgres://{}:{}@127.0.0.1:{}/{pdb}?sslmode=require&sslrootcert={}",
        pg::USER,
        pg::PASSWORD,
        plain.port(),
        ca.display()
    );
    let (code, o) = append(home.path(), &url);
    assert_eq!(code, Some(3), "{o}");
    assert_eq!(o["cause"], "disk");
    let n: i64 = plain
        .admin(&pdb)
        .query_one("SELECT count(*) FROM pg_tables WHERE tablename = 'messages'", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing was sent to the plaintext server");
}
