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
//!
//! Beyond one server, for the failures a real deployment has:
//! - [`PgServer::base_backup`] and [`PgServer::restore_base_backup`]: an
//!   older copy of the same cluster started in place of the live one
//!   (same `system_identifier`, older data);
//! - [`PgServer::standby_of`], [`PgServer::promote`]: a streaming standby
//!   (`pg_basebackup -R`), and its promotion (see `pg_cluster` for the
//!   synchronous pair);
//! - [`PgServer::kill9`]: SIGKILL to the postmaster, as a crash;
//! - [`PgServer::identity`]: what `pg_control_system()` and
//!   `pg_control_checkpoint()` report;
//! - [`PgServer::create_role`], [`PgServer::url_as`]: a role that is not a
//!   superuser (the reserved connection slots do not apply to it).
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
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

    /// `Err` only when a capability is missing (the binaries, the
    /// `postgres` account); a harness that fails once they are there
    /// (initdb, pg_ctl, the folder) panics: a failure, never a skip.
    pub fn start_with(extra: &[&str]) -> Result<PgServer, String> {
        let mut server = PgServer::empty()?;
        let pwfile = server.dir().join("pw");
        broken(std::fs::write(&pwfile, PASSWORD).map_err(|e| e.to_string()));
        if let Some((uid, gid)) = server.run_as {
            broken(chown(&pwfile, uid, gid));
        }
        let data = server.data();
        let out = broken(server.run(
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
        ));
        if !out.status.success() {
            broken::<()>(Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr))));
        }
        let mut conf = String::from("listen_addresses = '127.0.0.1'\nmax_connections = 40\n");
        for setting in extra {
            conf.push_str(setting);
            conf.push('\n');
        }
        broken(server.append_conf(&conf));
        broken(server.start_on_a_free_port());
        Ok(server)
    }

    /// A folder for a server that does not exist yet: the binaries found,
    /// the account chosen, `<dir>/sock` made; nothing running.
    fn empty() -> Result<PgServer, String> {
        let bindir = bindir()?;
        let run_as = if unsafe { libc::geteuid() } == 0 {
            Some(postgres_account()?)
        } else {
            None
        };
        let dir = broken(
            tempfile::Builder::new()
                .prefix("turnsafe-pg-")
                .tempdir()
                .map_err(|e| e.to_string()),
        );
        // The server's user must reach and own what is in here.
        broken(std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string()));
        let sock = dir.path().join("sock");
        broken(std::fs::create_dir(&sock).map_err(|e| e.to_string()));
        if let Some((uid, gid)) = run_as {
            for p in [dir.path(), &sock] {
                broken(chown(p, uid, gid));
            }
        }
        Ok(PgServer {
            bindir,
            dir,
            port: 0,
            run_as,
            running: false,
        })
    }

    /// Append lines to the data folder's `postgresql.conf` (later lines win).
    fn append_conf(&self, lines: &str) -> Result<(), String> {
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, lines.as_bytes()))
            .map_err(|e| e.to_string())
    }

    fn start_on_a_free_port(&mut self) -> Result<(), String> {
        // A port taken between the probe and the bind gets another try.
        let mut last = String::new();
        for _ in 0..5 {
            self.port = free_port();
            match self.start_again() {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// `bin` from the server's bindir, as the server's account.
    fn command(&self, bin: &str) -> Command {
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
        cmd.current_dir(self.dir.path()).env_remove("PGDATA").env("LC_ALL", "C");
        cmd
    }

    fn run(&self, bin: &str, args: &[&str]) -> Result<Output, String> {
        self.command(bin).args(args).output().map_err(|e| format!("{bin}: {e}"))
    }

    /// Run `bin` (with `env` added) and give it `limit`: past it the child
    /// is killed and the error says so. Its output goes to
    /// `<dir>/<bin>.log`, so a chatty child never blocks on a full pipe.
    fn run_timed(&self, bin: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Result<(), String> {
        let log_path = self.dir().join(format!("{bin}.log"));
        let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let mut cmd = self.command(bin);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        let mut child = cmd.spawn().map_err(|e| format!("{bin}: {e}"))?;
        let deadline = Instant::now() + limit;
        let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        loop {
            match child.try_wait().map_err(|e| format!("{bin}: {e}"))? {
                Some(status) if status.success() => return Ok(()),
                Some(status) => return Err(format!("{bin} {args:?} failed ({status}): {}", read_log().trim())),
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{bin} {args:?} did not finish within {limit:?} (killed): {}",
                        read_log().trim()
                    ));
                }
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        }
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

    /// Whether the harness believes the server is up (started, not
    /// stopped or killed since).
    pub fn running(&self) -> bool {
        self.running
    }

    /// A URL for `db` as `user`, plaintext (loopback).
    pub fn url_as(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{db}?sslmode=disable&connect_timeout=5",
            self.port
        )
    }

    /// A login role that is not a superuser, allowed to connect to every
    /// database and to create tables in `public` (PostgreSQL 15 no longer
    /// grants that to everyone).
    pub fn create_role(&self, name: &str, password: &str) {
        let mut admin = self.admin("postgres");
        // CREATE ROLE takes no parameters; both words are the test's own.
        admin
            .batch_execute(&format!("CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'"))
            .expect("create role");
    }

    /// Let `role` create tables in `db` (`public` is closed to others in 15).
    pub fn grant_create(&self, db: &str, role: &str) {
        self.admin(db)
            .batch_execute(&format!(
                "GRANT CREATE, USAGE ON SCHEMA public TO \"{role}\"; GRANT CREATE ON DATABASE \"{db}\" TO \"{role}\""
            ))
            .expect("grant create");
    }

    /// The postmaster's pid, from the first line of `postmaster.pid`.
    pub fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// SIGKILL to the postmaster, as a crash of the machine would leave
    /// it: no shutdown checkpoint, no goodbye to clients. Its children
    /// (backends, walsenders, checkpointer) notice their parent is gone
    /// and exit; this returns once every one of them has, so the port is
    /// free and no old backend still answers. One that lingers past 20 s
    /// is killed too, and the error names it.
    pub fn kill9(&mut self) -> Result<(), String> {
        let pid = self
            .postmaster_pid()
            .ok_or_else(|| format!("no postmaster.pid in {}", self.data().display()))?;
        // Children are found by parent pid, so before the parent dies.
        let children = children_of(pid);
        if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
            return Err(format!("kill -9 {pid}: {}", std::io::Error::last_os_error()));
        }
        self.running = false;
        let all: Vec<i32> = std::iter::once(pid).chain(children).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let alive: Vec<i32> = all.iter().copied().filter(|p| process_alive(*p)).collect();
            if alive.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                for p in &alive {
                    unsafe { libc::kill(*p, libc::SIGKILL) };
                }
                return Err(format!(
                    "children of the killed postmaster {pid} still ran after 20 s and were killed: {alive:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `pg_ctl promote` on a standby, then wait until a fresh connection
    /// is read-write (`transaction_read_only` off), as a client with
    /// `target_session_attrs=read-write` checks.
    pub fn promote(&self) -> Result<(), String> {
        self.run_timed(
            "pg_ctl",
            &["-D", &self.data().to_string_lossy(), "-w", "-t", "60", "promote"],
            &[],
            Duration::from_secs(70),
        )?;
        self.wait_writable(Duration::from_secs(30))
    }

    /// Wait until a new connection to `postgres` may write.
    pub fn wait_writable(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let last = match postgres::Client::connect(&self.url_as(USER, PASSWORD, "postgres"), postgres::NoTls)
                .and_then(|mut c| c.query_one("SHOW transaction_read_only", &[]))
            {
                Ok(row) if row.get::<_, String>(0) == "off" => return Ok(()),
                Ok(_) => "transaction_read_only is on".to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "the server on port {} did not accept writes within {limit:?}: {last}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `pg_basebackup` of this running server into `<dir>/<name>` (as the
    /// server's account, over TCP with the password, WAL streamed along),
    /// ready to start: [`PgServer::restore_base_backup`] starts it in this
    /// server's place. `pg_hba.conf` from initdb already admits
    /// replication from 127.0.0.1, and `wal_level` is `replica` by default.
    pub fn base_backup(&self, name: &str) -> Result<PathBuf, String> {
        let dest = self.dir().join(name);
        let port = self.port.to_string();
        self.run_timed(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                USER,
                "-w",
                "-D",
                &dest.to_string_lossy(),
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            &[("PGPASSWORD", PASSWORD)],
            Duration::from_secs(60),
        )?;
        Ok(dest)
    }

    /// Stop this server (`-m immediate`), move its data folder aside
    /// (`<dir>/data.replaced-<n>`) and start `backup`, made by
    /// [`PgServer::base_backup`] on this server, in its place on the same
    /// port. The data written after the backup is gone; the cluster is the
    /// same (`system_identifier`). Whether the timeline moves depends on
    /// `recovery`; see [`Recovery`].
    pub fn restore_base_backup(&mut self, backup: &Path, recovery: Recovery) -> Result<(), String> {
        if !backup.starts_with(self.dir()) {
            return Err(format!(
                "{} is not a backup of this server (it must be under {}, to be renamed into place)",
                backup.display(),
                self.dir().display()
            ));
        }
        if self.running {
            self.stop_immediate();
        }
        let aside = (0..)
            .map(|n| self.dir().join(format!("data.replaced-{n}")))
            .find(|p| !p.exists())
            .expect("a free name");
        std::fs::rename(self.data(), &aside).map_err(|e| format!("move the data folder aside: {e}"))?;
        std::fs::rename(backup, self.data()).map_err(|e| format!("move the backup into place: {e}"))?;
        if recovery == Recovery::Archive {
            let signal = self.data().join("recovery.signal");
            std::fs::write(&signal, "").map_err(|e| e.to_string())?;
            if let Some((uid, gid)) = self.run_as {
                chown(&signal, uid, gid)?;
            }
            // Archive recovery needs a restore_command; the WAL is already
            // in pg_wal (-X stream), so one that always fails is enough.
            self.append_conf("restore_command = 'false'\n")?;
        }
        self.start_again()?;
        if recovery == Recovery::Archive {
            // The server takes connections (hot standby) while it still
            // replays; it ends recovery on a new timeline when the WAL runs
            // out. Wait for that end, seen from the server, not for luck.
            self.wait_writable(Duration::from_secs(60))?;
        }
        Ok(())
    }

    /// What the server reports about its identity and timeline.
    pub fn identity(&self) -> ServerIdentity {
        let row = self
            .admin("postgres")
            .query_one(
                "SELECT s.system_identifier, c.timeline_id, c.checkpoint_lsn::text, pg_is_in_recovery(), \
                 CASE WHEN pg_is_in_recovery() THEN NULL \
                      ELSE ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int END, \
                 CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                      ELSE pg_current_wal_insert_lsn() END::text \
                 FROM pg_control_system() s, pg_control_checkpoint() c",
                &[],
            )
            .expect("read pg_control_system() and pg_control_checkpoint()");
        ServerIdentity {
            system_identifier: row.get(0),
            checkpoint_timeline: row.get(1),
            checkpoint_lsn: row.get(2),
            in_recovery: row.get(3),
            wal_timeline: row.get(4),
            wal_lsn: row.get(5),
        }
    }

    /// A streaming standby of `primary`: `pg_basebackup -R` into a folder
    /// of its own (so `primary_conninfo` and `standby.signal` are
    /// written), with `application_name` in the conninfo (the name
    /// `synchronous_standby_names` matches), started on a loopback port
    /// of its own. Settings come from the primary's `postgresql.conf` as
    /// it was at the backup.
    pub fn standby_of(primary: &PgServer, application_name: &str) -> Result<PgServer, String> {
        let mut standby = PgServer::empty()?;
        let conninfo = format!(
            "host=127.0.0.1 port={} user={USER} password={PASSWORD} application_name={application_name}",
            primary.port
        );
        let data = standby.data();
        standby.run_timed(
            "pg_basebackup",
            &[
                "-d",
                &conninfo,
                "-w",
                "-D",
                &data.to_string_lossy(),
                "-X",
                "stream",
                "-c",
                "fast",
                "-R",
                "--no-sync",
            ],
            &[],
            Duration::from_secs(120),
        )?;
        standby.start_on_a_free_port()?;
        Ok(standby)
    }
}

/// How [`PgServer::restore_base_backup`] starts the backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// `backup_label` alone: crash recovery from the backup's checkpoint
    /// to the end of the WAL the backup carries. The timeline stays.
    Crash,
    /// `recovery.signal` too: archive recovery, which at its end picks a
    /// new timeline (the usual shape of a restore to a point in time).
    Archive,
}

/// `pg_control_system()` and `pg_control_checkpoint()`, and where WAL is.
///
/// - `system_identifier` (`pg_control_system()`) is fixed at initdb and
///   copied by every base backup: a restored backup or a promoted standby
///   reports the same one as the server it came from.
/// - `checkpoint_timeline` and `checkpoint_lsn` (`pg_control_checkpoint()`)
///   are those of the last checkpoint (on a standby, restartpoint) in
///   `pg_control`; after a promotion the timeline moves only once the
///   checkpoint that follows it is done.
/// - `wal_timeline` is read from the name of the WAL file being inserted
///   into (`pg_walfile_name(pg_current_wal_insert_lsn())`), so it moves at
///   the promotion itself; `None` during recovery, where no WAL is written.
/// - `wal_lsn` is `pg_current_wal_insert_lsn()`, or on a standby
///   `pg_last_wal_replay_lsn()`. A backup restored by crash recovery keeps
///   the timeline: only this position going back tells it apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    pub system_identifier: i64,
    pub checkpoint_timeline: i32,
    pub checkpoint_lsn: String,
    pub in_recovery: bool,
    pub wal_timeline: Option<i32>,
    pub wal_lsn: Option<String>,
}

/// Pids whose parent is `pid` (`/proc/<n>/stat`, field 4).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| proc_stat(*p).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

/// `(state, ppid)` from `/proc/<pid>/stat`; the command name may hold
/// spaces and parentheses, so the fields are read after the last `)`.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Running, or at least not yet a zombie nobody reaped.
fn process_alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
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

/// A harness step that failed although every capability is there: the
/// test fails, under `CI=true` or not (only a missing capability is a skip).
#[track_caller]
pub fn broken<T>(step: Result<T, String>) -> T {
    step.unwrap_or_else(|e| panic!("the PostgreSQL harness failed (a failure, not a missing capability): {e}"))
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
    turnsafe_host::pg::open_store(url, home, turnsafe_host::backend::LeaseOptions::default())
}

/// `state_meta.schema_version` of `db`.
pub fn schema_version(server: &PgServer, db: &str) -> String {
    server
        .admin(db)
        .query_one("SELECT value FROM state_meta WHERE key = 'schema_version'", &[])
        .expect("read the schema version")
        .get(0)
}

/// Every row of `table`, every column, as JSON text, in `order`.
pub fn dump(server: &PgServer, db: &str, table: &str, order: &str) -> Vec<String> {
    server
        .admin(db)
        .query(
            &format!("SELECT row_to_json(t)::text FROM {table} t ORDER BY {order}"),
            &[],
        )
        .expect("dump a table")
        .into_iter()
        .map(|r| r.get(0))
        .collect()
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
        if !out.status.success() {
            broken::<()>(Err(format!(
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    };
    broken(std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string()));
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
    broken(
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .map_err(|e| e.to_string()),
    );
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
    broken(std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string()));
    if unsafe { libc::geteuid() } == 0 {
        let (uid, gid) = postgres_account()?;
        broken(chown(&key, uid, gid));
    }
    let settings = vec![
        "ssl = on".to_string(),
        format!("ssl_cert_file = '{}'", dir.join("server.pem").display()),
        format!("ssl_key_file = '{}'", key.display()),
    ];
    Ok((dir.join("ca.pem"), settings))
}
