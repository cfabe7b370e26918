//! A real PostgreSQL server for one test: `initdb` into a temporary
//! folder, run as the unprivileged `postgres` account when the test runs
//! as root (initdb refuses root), listening on a free loopback port only.
//! It is stopped (`-m immediate`) and its folder removed on drop.
//!
//! The binaries come from `pg_config --bindir` (Debian's
//! `postgresql-15`). When they are missing, [`PgServer::start`] says why;
//! use [`pg_or_skip!`], which fails the test under `CI=true` and records
//! the skip elsewhere (`turnsafe_tests::require`): never a silent skip.
//!
//! The top-level scenarios reach it as `common::pg`; the command-line
//! scenarios in `host/tests` include this same file with `#[path]`.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The superuser the harness creates, and its password (host logins use
/// scram-sha-256, so a password is really checked).
pub const USER: &str = "postgres";
pub const PASSWORD: &str = "turnsafe-test-pw";

pub struct PgServer {
    bindir: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// Run the binaries as this uid/gid (when the test runs as root).
    run_as: Option<(u32, u32)>,
    running: bool,
}

fn bindir() -> Result<PathBuf, String> {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .map_err(|e| format!("pg_config not found ({e}); install postgresql-15 (apt-get install -y postgresql-15)"))?;
    if !out.status.success() {
        return Err("pg_config --bindir failed".into());
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !dir.join("initdb").is_file() || !dir.join("pg_ctl").is_file() {
        return Err(format!(
            "{} has no initdb/pg_ctl; install the server package (apt-get install -y postgresql-15)",
            dir.display()
        ));
    }
    Ok(dir)
}

/// uid and gid of the `postgres` account.
fn postgres_account() -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|e| format!("id: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| "no `postgres` account to run the server as (initdb refuses root)".to_string())
    };
    Ok((id("-u")?, id("-g")?))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl PgServer {
    /// initdb and start a server; `extra` are `-c name=value` settings.
    pub fn start() -> Result<PgServer, String> {
        PgServer::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Result<PgServer, String> {
        let bindir = bindir()?;
        let run_as = if unsafe { libc::geteuid() } == 0 {
            Some(postgres_account()?)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("turnsafe-pg-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        // The server's user must reach and own what is in here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD).map_err(|e| e.to_string())?;
        let data = dir.path().join("data");
        let sock = dir.path().join("sock");
        std::fs::create_dir(&sock).map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = run_as {
            for p in [dir.path(), &pwfile, &sock] {
                chown(p, uid, gid)?;
            }
        }
        let mut server = PgServer {
            bindir,
            dir,
            port: 0,
            run_as,
            running: false,
        };
        let out = server.run(
            "initdb",
            &[
                "-D",
                &data.to_string_lossy(),
                "-U",
                USER,
                "--pwfile",
                &pwfile.to_string_lossy(),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let mut conf = String::from("listen_addresses = '127.0.0.1'\nmax_connections = 40\n");
        for setting in extra {
            conf.push_str(setting);
            conf.push('\n');
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, conf.as_bytes()))
            .map_err(|e| e.to_string())?;
        // A port taken between the probe and the bind gets another try.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.start_again() {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn run(&self, bin: &str, args: &[&str]) -> Result<Output, String> {
        let path = self.bindir.join(bin);
        let mut cmd = match self.run_as {
            Some((uid, gid)) => {
                let mut c = Command::new("setpriv");
                c.args([
                    format!("--reuid={uid}"),
                    format!("--regid={gid}"),
                    "--clear-groups".into(),
                    "--".into(),
                ])
                .arg(&path);
                c
            }
            None => Command::new(&path),
        };
        cmd.args(args)
            .current_dir(self.dir.path())
            .env_remove("PGDATA")
            .env("LC_ALL", "C")
            .output()
            .map_err(|e| format!("{bin}: {e}"))
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `pg_ctl start`, on the same port, waiting until it accepts connections.
    pub fn start_again(&mut self) -> Result<(), String> {
        let opts = format!("-p {} -k {}", self.port, self.dir.path().join("sock").display());
        let log = self.dir.path().join("server.log");
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().to_string_lossy(),
                "-o",
                &opts,
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )?;
        if !out.status.success() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!(
                "pg_ctl start failed: {}{}",
                String::from_utf8_lossy(&out.stderr),
                log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
            ));
        }
        self.running = true;
        Ok(())
    }

    /// `pg_ctl stop -m immediate`: the server dies without a checkpoint,
    /// closing every connection, as a crash would.
    pub fn stop_immediate(&mut self) {
        let out = self
            .run(
                "pg_ctl",
                &["-D", &self.data().to_string_lossy(), "-m", "immediate", "-w", "stop"],
            )
            .expect("pg_ctl stop");
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.running = false;
    }

    /// A URL for `db` with the password in it, plaintext (loopback).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// The form turnsafe shows for `db`.
    pub fn shown(&self, db: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// An administrative connection to `db`.
    pub fn admin(&self, db: &str) -> postgres::Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match postgres::Client::connect(&self.url(db), postgres::NoTls) {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("admin connection to {db}: {e}"),
            }
        }
    }

    /// A fresh database; returns its name.
    pub fn create_db(&self, name: &str) -> String {
        self.admin("postgres")
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .expect("create database");
        name.to_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.running {
            let _ = self.run(
                "pg_ctl",
                &["-D", &self.data().to_string_lossy(), "-m", "immediate", "-w", "stop"],
            );
        }
    }
}

fn chown(p: &Path, uid: u32, gid: u32) -> Result<(), String> {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(|e| format!("chown {}: {e}", p.display()))
}

/// Start a server, or say why not, through the shared capability helper:
/// under `CI=true` the test fails with the reason; elsewhere the skip is
/// recorded (`TURNSAFE_SKIP_LOG`) and the test returns.
#[macro_export]
macro_rules! pg_or_skip {
    () => {
        pg_or_skip!(&[])
    };
    ($extra:expr) => {
        turnsafe_tests::require!(pg::PgServer::start_with($extra))
    };
}

/// A PostgreSQL writer on `url`, diverting under `home`.
pub fn store(url: &str, home: &Path) -> turnsafe_host::pg::PgStore {
    let url: turnsafe_host::pg::DbUrl = url.parse().expect("a valid URL");
    turnsafe_host::pg::open_store(url, home, turnsafe_host::backend::WriterOptions::default())
}

/// `(uid, seq, content)` of a session's stored messages, in order.
pub fn rows(server: &PgServer, db: &str, session: &str) -> Vec<(String, i64, String)> {
    server
        .admin(db)
        .query(
            "SELECT uid, seq, COALESCE(content, item) FROM messages WHERE session_id = $1 ORDER BY seq, id",
            &[&session],
        )
        .expect("read messages")
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// A CA and a server certificate for 127.0.0.1 and localhost, made with
/// the `openssl` command in `dir`: `(ca.pem, settings for the server)`.
/// The key is handed to the server's account, mode 0600.
pub fn make_certs(dir: &Path) -> Result<(PathBuf, Vec<String>), String> {
    let run = |args: &[&str]| -> Result<(), String> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .map_err(|e| format!("openssl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=turnsafe test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ])?;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ])?;
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| e.to_string())?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ])?;
    let key = dir.join("server.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())?;
    if unsafe { libc::geteuid() } == 0 {
        let (uid, gid) = postgres_account()?;
        chown(&key, uid, gid)?;
    }
    let settings = vec![
        "ssl = on".to_string(),
        format!("ssl_cert_file = '{}'", dir.join("server.pem").display()),
        format!("ssl_key_file = '{}'", key.display()),
    ];
    Ok((dir.join("ca.pem"), settings))
}
