//! A real PostgreSQL server out of a resource: connection slots
//! (SQLSTATE 53300) or space for its data (SQLSTATE 53100).
//!
//! - [`start_with_few_slots`] and [`hold_slots`]: a server with a small
//!   `max_connections`, and connections held by a role that is not a
//!   superuser until the server refuses the next one. With
//!   [`Slots::All`] the slots reserved for superusers are taken too, so
//!   the harness's own superuser URL is refused as well.
//! - [`SmallTablespace`]: a tablespace on a small tmpfs (root mounts it,
//!   the server's account owns it), a database in it, and a filler that
//!   writes until the server answers 53100. `pg_wal` stays in the data
//!   folder on the normal disk: a full WAL disk makes the server PANIC,
//!   which is another failure than a full data disk.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use super::pg::{self, PASSWORD, PgServer, USER};
use super::privileged::Tmpfs;

/// The role [`hold_slots`] connects as.
pub const SLOT_ROLE: &str = "turnsafe_slot_holder";
const SLOT_PASSWORD: &str = "turnsafe-slot-pw";

/// A server whose `max_connections` is `max`, `reserved` of them kept
/// for superusers (`superuser_reserved_connections`; PostgreSQL 15 has
/// no `reserved_connections` yet).
pub fn start_with_few_slots(max: u32, reserved: u32) -> Result<PgServer, String> {
    let max_connections = format!("max_connections = {max}");
    let reserved_connections = format!("superuser_reserved_connections = {reserved}");
    PgServer::start_with(&[&max_connections, &reserved_connections])
}

/// Which slots [`hold_slots`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// Those a role that is not a superuser may use; a superuser still
    /// gets in (the reserved slots).
    NonSuperuser,
    /// Every one: the reserved slots too, as the superuser.
    All,
}

/// A refusal from the server: SQLSTATE and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: String,
    pub message: String,
}

/// Connections held open; dropping them frees the slots (the backends
/// exit a moment later, so a connection right after may still be
/// refused: see [`HeldSlots::release`]).
pub struct HeldSlots {
    clients: Vec<postgres::Client>,
    /// What the server said to the role's first refused connection.
    pub role_refused: Refusal,
    /// What it said to the superuser's, with [`Slots::All`].
    pub superuser_refused: Option<Refusal>,
    url: String,
}

impl HeldSlots {
    pub fn held(&self) -> usize {
        self.clients.len()
    }

    /// A URL as the role that holds the slots (not a superuser).
    pub fn role_url(&self) -> &str {
        &self.url
    }

    /// Close every held connection and wait (up to 10 s) until the role
    /// can connect again.
    pub fn release(mut self) -> Result<(), String> {
        self.clients.clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match postgres::Client::connect(&self.url, postgres::NoTls) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("the slots were not free 10 s after release: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// Hold connections to `db` until the server refuses one with 53300.
///
/// The role [`SLOT_ROLE`] is created (not a superuser) and connects
/// until refused; with [`Slots::All`] the superuser then connects until
/// refused too. Any other failure, or no refusal after
/// `max_connections` + 5 attempts, is an error that says what happened.
pub fn hold_slots(server: &PgServer, db: &str, which: Slots) -> Result<HeldSlots, String> {
    let max: usize = {
        let mut admin = server.admin("postgres");
        let exists: bool = admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)",
                &[&SLOT_ROLE],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        if !exists {
            server.create_role(SLOT_ROLE, SLOT_PASSWORD);
        }
        let max: String = admin
            .query_one("SHOW max_connections", &[])
            .map_err(|e| e.to_string())?
            .get(0);
        max.parse().map_err(|_| format!("max_connections = {max}?"))?
    };
    let role_url = server.url_as(SLOT_ROLE, SLOT_PASSWORD, db);
    let mut clients = Vec::new();
    let role_refused = fill(&role_url, &mut clients, max + 5)?;
    let superuser_refused = match which {
        Slots::NonSuperuser => None,
        Slots::All => Some(fill(&server.url_as(USER, PASSWORD, db), &mut clients, max + 5)?),
    };
    Ok(HeldSlots {
        clients,
        role_refused,
        superuser_refused,
        url: role_url,
    })
}

/// Connect to `url` until the server answers 53300; the connections made
/// are pushed to `clients`.
fn fill(url: &str, clients: &mut Vec<postgres::Client>, attempts: usize) -> Result<Refusal, String> {
    for _ in 0..attempts {
        match postgres::Client::connect(url, postgres::NoTls) {
            Ok(c) => clients.push(c),
            Err(e) => {
                return match e.as_db_error() {
                    Some(db) if db.code().code() == "53300" => Ok(Refusal {
                        code: db.code().code().to_string(),
                        message: db.message().to_string(),
                    }),
                    _ => Err(format!(
                        "connection {} failed, but not with 53300: {e} ({e:?})",
                        clients.len() + 1
                    )),
                };
            }
        }
    }
    Err(format!(
        "{} connections held and none refused: is max_connections small?",
        clients.len()
    ))
}

/// A tablespace on a tmpfs of its own, under the server's folder.
///
/// It borrows the server, so it is dropped first: the tmpfs is then
/// unmounted (lazily, the server may still hold files there) before the
/// server stops and its folder is removed.
pub struct SmallTablespace<'a> {
    server: &'a PgServer,
    name: String,
    tmpfs: Tmpfs,
}

/// What the server said when the tablespace was full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFull {
    pub code: String,
    pub message: String,
    /// Bytes of filler rows committed before the refusal.
    pub filled_bytes: i64,
}

/// The filler's table and one row's size (below the TOAST threshold, so
/// rows are stored as written, uncompressed).
const FILLER: &str = "turnsafe_filler";
const FILLER_ROW: i32 = 1000;

impl<'a> SmallTablespace<'a> {
    /// Mount a tmpfs of `size` (`mount -o size=`, e.g. `"16m"`) at
    /// `<server dir>/<name>`, hand it to the server's account, and
    /// `CREATE TABLESPACE name` there. Needs root (the mount); the error
    /// says why not, for `skip_unless!`.
    ///
    /// A database made with [`SmallTablespace::create_db`] copies
    /// `template1` into it (about 2 MB of the tmpfs with PostgreSQL 15),
    /// so `size` must leave room above that; 16m fills in about a second.
    pub fn create(server: &'a PgServer, name: &str, size: &str) -> Result<SmallTablespace<'a>, String> {
        let dir = server.dir().join(name);
        let tmpfs = Tmpfs::new(&dir, size)?;
        // The mount's root is root's, mode 0700: the server's account must
        // own it (CREATE TABLESPACE refuses a location it does not own).
        // Past the mount (a capability), a failing step is a broken harness.
        let data_owner = pg::broken(std::fs::metadata(server.data()).map_err(|e| e.to_string()));
        {
            use std::os::unix::fs::MetadataExt;
            pg::broken(
                std::os::unix::fs::chown(&dir, Some(data_owner.uid()), Some(data_owner.gid()))
                    .map_err(|e| format!("chown {}: {e}", dir.display())),
            );
        }
        pg::broken(
            server
                .admin("postgres")
                .batch_execute(&format!("CREATE TABLESPACE \"{name}\" LOCATION '{}'", dir.display()))
                .map_err(|e| format!("create tablespace on {}: {e}", dir.display())),
        );
        Ok(SmallTablespace {
            server,
            name: name.to_string(),
            tmpfs,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &std::path::Path {
        self.tmpfs.path()
    }

    /// `(bytes free, bytes in all)` on the tmpfs.
    pub fn space(&self) -> (u64, u64) {
        let c = std::ffi::CString::new(self.path().as_os_str().as_encoded_bytes()).expect("no NUL in the path");
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
        let frsize = st.f_frsize as u64;
        (st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize)
    }

    /// A database whose every file (catalogs included) is in the
    /// tablespace; tables turnsafe creates there land on the tmpfs too.
    pub fn create_db(&self, db: &str) -> String {
        self.server
            .admin("postgres")
            .batch_execute(&format!("CREATE DATABASE \"{db}\" TABLESPACE \"{}\"", self.name))
            .expect("create database in the tablespace");
        db.to_string()
    }

    /// Insert rows into a filler table in `db` (created in the
    /// tablespace), about 0.5 MB per statement, until one fails with
    /// 53100. The failed statement rolled back, but the pages it added
    /// stay allocated, so the tmpfs is left with less than a page free.
    ///
    /// A later write fails only if it needs a new page: a row that fits
    /// in free space of a page a table already has is still stored. Write
    /// more than a page, or fill after the table's last write.
    pub fn fill(&self, db: &str) -> Result<DiskFull, String> {
        let mut c = self.server.admin(db);
        c.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {FILLER} (pad text) TABLESPACE \"{}\"",
            self.name
        ))
        .map_err(|e| e.to_string())?;
        let (_, total) = self.space();
        // Far more statements than the tmpfs can take; a bound all the same.
        let statements = total / (500 * FILLER_ROW as u64) + 20;
        let deadline = Instant::now() + Duration::from_secs(60);
        for _ in 0..statements {
            let r = c.execute(
                &format!("INSERT INTO {FILLER} SELECT repeat('x', $1) FROM generate_series(1, 500)"),
                &[&FILLER_ROW],
            );
            match r {
                Ok(_) if Instant::now() < deadline => {}
                Ok(_) => return Err("the tablespace was not full after 60 s of filling".into()),
                Err(e) => {
                    let Some(db_err) = e.as_db_error() else {
                        return Err(format!("filling failed without an SQLSTATE: {e}"));
                    };
                    if db_err.code().code() != "53100" {
                        return Err(format!("filling failed, but not with 53100: {e}"));
                    }
                    let filled: i64 = c
                        .query_one(
                            &format!("SELECT count(*) * $1::bigint FROM {FILLER}"),
                            &[&i64::from(FILLER_ROW)],
                        )
                        .map_err(|e| e.to_string())?
                        .get(0);
                    return Ok(DiskFull {
                        code: db_err.code().code().to_string(),
                        message: db_err.message().to_string(),
                        filled_bytes: filled,
                    });
                }
            }
        }
        Err(format!(
            "{statements} filler statements and the tablespace is still not full"
        ))
    }

    /// Drop the filler in `db` (its files are truncated at commit) and
    /// checkpoint: the space is free again.
    pub fn free(&self, db: &str) {
        let mut c = self.server.admin(db);
        c.batch_execute(&format!("DROP TABLE IF EXISTS {FILLER}"))
            .expect("drop the filler");
        c.batch_execute("CHECKPOINT").expect("checkpoint");
    }
}
