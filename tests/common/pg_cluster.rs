//! A primary and a streaming standby with synchronous replication, on
//! two loopback ports, for failover scenarios.
//!
//! [`SyncPair::start`]:
//! 1. the primary is initdb'd and started with `synchronous_commit =
//!    remote_apply`: a commit is acknowledged only once the standby has
//!    applied it, so a read on the standby right after sees it;
//! 2. the standby is `pg_basebackup -R` of it, `application_name`
//!    [`STANDBY_NAME`] in its `primary_conninfo`;
//! 3. once the standby streams, the primary's `synchronous_standby_names`
//!    names it (ALTER SYSTEM and a reload), and the pair is ready when
//!    `pg_stat_replication` says `sync`.
//!
//! The standby is made before step 3 on purpose: a primary that names a
//! synchronous standby before one is connected makes every commit wait,
//! and the standby's own copy of the setting would make the promoted
//! standby wait for a standby it will never have.
//!
//! Failover: [`SyncPair::kill_primary`] (SIGKILL to the postmaster),
//! [`SyncPair::promote_standby`] (`pg_ctl promote`, then wait until it
//! accepts writes), and [`SyncPair::multi_host_url`], with which a
//! client finds whichever one is read-write.
//!
//! While the primary runs with the standby gone, its commits wait for
//! ever (that is synchronous replication): kill the standby only with
//! `synchronous_standby_names` emptied first, or expect the hang.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use super::pg::{self, PASSWORD, PgServer, USER};

/// The standby's `application_name`, as `synchronous_standby_names` names it.
pub const STANDBY_NAME: &str = "turnsafe_standby";

pub struct SyncPair {
    pub primary: PgServer,
    pub standby: PgServer,
}

/// One row of `pg_stat_replication`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyState {
    pub application_name: String,
    /// `startup`, `catchup`, `streaming`, ...
    pub state: String,
    /// `async`, `potential`, `sync` or `quorum`.
    pub sync_state: String,
    pub replay_lsn: Option<String>,
}

/// What a primary says about its replication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationState {
    pub synchronous_standby_names: String,
    pub synchronous_commit: String,
    pub standbys: Vec<StandbyState>,
}

impl ReplicationState {
    /// The standby named `name` is connected and synchronous.
    pub fn is_sync(&self, name: &str) -> bool {
        self.standbys
            .iter()
            .any(|s| s.application_name == name && s.state == "streaming" && s.sync_state == "sync")
    }
}

/// `synchronous_standby_names`, `synchronous_commit` and
/// `pg_stat_replication` of `server` (a primary; a standby has no rows).
pub fn replication_state(server: &PgServer) -> Result<ReplicationState, String> {
    let mut c = postgres::Client::connect(&server.url_as(USER, PASSWORD, "postgres"), postgres::NoTls)
        .map_err(|e| format!("connect to port {}: {e}", server.port()))?;
    let show = |c: &mut postgres::Client, name: &str| -> Result<String, String> {
        c.query_one(&format!("SHOW {name}"), &[])
            .map(|r| r.get(0))
            .map_err(|e| e.to_string())
    };
    let synchronous_standby_names = show(&mut c, "synchronous_standby_names")?;
    let synchronous_commit = show(&mut c, "synchronous_commit")?;
    let standbys = c
        .query(
            "SELECT application_name, state, sync_state, replay_lsn::text FROM pg_stat_replication \
             ORDER BY application_name",
            &[],
        )
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|r| StandbyState {
            application_name: r.get(0),
            state: r.get::<_, Option<String>>(1).unwrap_or_default(),
            sync_state: r.get::<_, Option<String>>(2).unwrap_or_default(),
            replay_lsn: r.get(3),
        })
        .collect();
    Ok(ReplicationState {
        synchronous_standby_names,
        synchronous_commit,
        standbys,
    })
}

/// Poll `probe` until it returns `Ok(Some(v))`, for at most `limit`; the
/// error names `what` and the last thing the probe said.
pub fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("nothing yet");
    loop {
        match probe() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = e,
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not within {limit:?} (last: {last})"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl SyncPair {
    pub fn start() -> Result<SyncPair, String> {
        SyncPair::start_with(&[])
    }

    /// `extra` settings go to the primary's `postgresql.conf`, and so to
    /// the standby's (the base backup copies it).
    pub fn start_with(extra: &[&str]) -> Result<SyncPair, String> {
        let mut settings = vec!["synchronous_commit = remote_apply"];
        settings.extend_from_slice(extra);
        // `Err` only for a missing capability; past the first server,
        // every step that fails is a broken harness (a panic).
        let primary = PgServer::start_with(&settings)?;
        let standby = pg::broken(PgServer::standby_of(&primary, STANDBY_NAME));
        let pair = SyncPair { primary, standby };
        pg::broken(wait_for(
            "the standby streaming from the primary",
            Duration::from_secs(30),
            || {
                let st = replication_state(&pair.primary)?;
                Ok(st
                    .standbys
                    .iter()
                    .any(|s| s.application_name == STANDBY_NAME && s.state == "streaming")
                    .then_some(()))
            },
        ));
        {
            let mut admin = pair.primary.admin("postgres");
            pg::broken(
                admin
                    .batch_execute(&format!(
                        "ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'"
                    ))
                    .map_err(|e| e.to_string()),
            );
            pg::broken(
                admin
                    .batch_execute("SELECT pg_reload_conf()")
                    .map_err(|e| e.to_string()),
            );
        }
        pg::broken(wait_for("the standby synchronous", Duration::from_secs(30), || {
            Ok(replication_state(&pair.primary)?.is_sync(STANDBY_NAME).then_some(()))
        }));
        Ok(pair)
    }

    /// `postgres://USER:PASSWORD@127.0.0.1:P1,127.0.0.1:P2/db?...&target_session_attrs=read-write`:
    /// the client tries the primary's port, then the standby's, and keeps
    /// the first that is read-write. `connect_timeout` bounds each try.
    pub fn multi_host_url(&self, db: &str) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/{db}?sslmode=disable&connect_timeout=5&target_session_attrs=read-write",
            self.primary.port(),
            self.standby.port()
        )
    }

    /// SIGKILL to the primary's postmaster; returns once its processes
    /// are gone (see [`PgServer::kill9`]).
    pub fn kill_primary(&mut self) -> Result<(), String> {
        self.primary.kill9()
    }

    /// `pg_ctl promote` the standby and wait until it accepts writes.
    pub fn promote_standby(&mut self) -> Result<(), String> {
        self.standby.promote()
    }

    /// What the primary says about its replication.
    pub fn replication(&self) -> Result<ReplicationState, String> {
        replication_state(&self.primary)
    }
}
