//! PostgreSQL as a second backend, under the same policy.
//!
//! [`Postgres`] is the connection to a server named by a [`DbUrl`] and the
//! reads every command shares; [`PgStore`] performs the [`Backend`]
//! effects over it for the one executor ([`crate::backend::group`]),
//! diverting to the local `--home`. The executor decides nothing: every failure goes
//! through [`translate`], the one place that says which SQLite code a
//! PostgreSQL failure stands for, and the policy decides from there.
//!
//! A connection the server dropped (or that never came up) leaves the
//! handle closed: the batch in flight is diverted, and the next batch's
//! first step is an open, as after any failed open. Within one flush a
//! connection is never made twice.

pub mod connect;
mod edit;
mod graph;
mod graph_marks;
pub mod replay;
pub mod schema;
pub mod translate;
pub mod url;
mod write;

use std::time::Duration;

use postgres::Client;
use serde_json::Value;
use turnsafe_policy::machine::{Failure, WritePlan};
use turnsafe_policy::{Durability, Evidence};

use crate::backend::{
    Backend, BackendError, Flush, GroupWrite, Hit, Identity, Lease, LeaseOptions, Ledger, ReadError, SearchReport,
};
use crate::capture::{Capture, CaptureError};
use crate::history::{Archived, Cleared, ForkRefused, ForkReport, Lineage, RestoreReport, Selector};
use crate::outcome::FlushOutcome;
use crate::store::{Counters, EditError, SessionId};
use crate::transcript::StoredMessage;
use schema::Migrated;
use translate::Fault;
pub use url::DbUrl;

/// How the executor talks to the server.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `lock_timeout` for the writer's statements: kept small, as the
    /// policy's retry plan, not the server, decides how long to wait.
    pub lock_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            lock_timeout: Duration::from_millis(50),
        }
    }
}

/// The PostgreSQL executor.
pub struct Postgres {
    url: DbUrl,
    opts: PgOptions,
    client: Option<Client>,
    /// The write path's statements, prepared on `client`.
    prepared: write::Prepared,
    /// The generation of the database the first open found; a later open
    /// that finds another is a replaced store.
    generation: Option<String>,
    /// The server this handle last connected to (see [`ServerMark`]).
    server: Option<ServerMark>,
    /// The last batch this handle stored: its session and uids.
    last_stored: Option<(String, Vec<String>)>,
    /// The server's WAL position read inside the last batch stored.
    last_lsn: Option<i64>,
    /// Whether this connection's COMMIT waits for its WAL flush
    /// (`synchronous_commit`), read at every connect.
    durability: Durability,
}

/// What says whether a server is the one a handle wrote to before: its
/// `system_identifier` and timeline (a failover moves to a new timeline),
/// and its WAL position (a restore from an older backup keeps both the
/// identifier and the timeline, and only its WAL position goes back).
/// Reading the control data may need `pg_monitor` or a superuser; without
/// it the other marks are compared.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServerMark {
    system_identifier: Option<String>,
    timeline: Option<i64>,
    lsn: Option<i64>,
}

impl ServerMark {
    fn read(client: &mut Client) -> ServerMark {
        let one =
            |client: &mut Client, sql: &str| -> Option<postgres::Row> { client.query_opt(sql, &[]).ok().flatten() };
        let system_identifier =
            one(client, "SELECT system_identifier::text FROM pg_control_system()").map(|r| r.get(0));
        // The timeline of the WAL being written: the checkpoint's lags
        // behind a promotion until the next checkpoint.
        let timeline = one(
            client,
            "SELECT CASE WHEN pg_is_in_recovery() THEN NULL \
             ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 END",
        )
        .and_then(|r| r.get(0));
        let lsn = one(
            client,
            "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8 END",
        )
        .and_then(|r| r.get(0));
        ServerMark {
            system_identifier,
            timeline,
            lsn,
        }
    }
}

impl Postgres {
    pub fn new(url: DbUrl, opts: PgOptions) -> Postgres {
        Postgres {
            url,
            opts,
            client: None,
            prepared: write::Prepared::default(),
            generation: None,
            server: None,
            last_stored: None,
            last_lsn: None,
            durability: Durability::Synced,
        }
    }

    /// After connecting: if the server is not the one this handle last
    /// wrote to (another identity or timeline, or a WAL position behind the
    /// one read inside the last batch stored), the last batch stored must
    /// still be there. It is after a failover with synchronous replication;
    /// it is not after a restore from an older backup, and then the store
    /// is `replaced`: every later batch is diverted.
    // A `Failure`, as `Backend::open` returns it: see there.
    #[allow(clippy::result_large_err)]
    fn check_server(&mut self, client: &mut Client) -> Result<(), Failure> {
        let now = ServerMark::read(client);
        let changed = match &self.server {
            None => false,
            Some(before) => {
                let differs = |a: &Option<String>, b: &Option<String>| a.is_some() && b.is_some() && a != b;
                differs(&before.system_identifier, &now.system_identifier)
                    || (before.timeline.is_some() && now.timeline.is_some() && before.timeline != now.timeline)
                    || matches!((self.last_lsn, now.lsn), (Some(seen), Some(lsn)) if lsn < seen)
            }
        };
        self.server = Some(now.clone());
        let Some((session, uids)) = self.last_stored.clone().filter(|_| changed) else {
            return Ok(());
        };
        let stored =
            write::stored_uids(client, &session, &uids).map_err(|e| translate::failure(&Fault::Client(&e), 0))?;
        if stored.len() == uids.len() {
            tracing::warn!(
                target_db = self.url.display(),
                "another server now, and it holds the last batch stored"
            );
            return Ok(());
        }
        tracing::error!(
            target_db = self.url.display(),
            missing = uids.len() - stored.len(),
            "the server lacks the last batch this handle stored"
        );
        Err(Failure {
            evidence: vec![Evidence::DbReplaced],
            message: format!(
                "turnsafe guard: {} lacks {} of the {} messages of the last batch this handle stored there \
                 (a restore from an older backup, or a failover that lost commits)",
                self.url.display(),
                uids.len() - stored.len(),
                uids.len()
            ),
            engine: turnsafe_policy::Engine::Postgres,
            ..Failure::default()
        })
    }

    pub fn url(&self) -> &DbUrl {
        &self.url
    }

    /// The live connection, for tests and read commands.
    pub fn client(&mut self) -> Option<&mut Client> {
        self.client.as_mut()
    }

    /// A connection for a read: the live one, or a new one.
    fn reader(&mut self) -> Result<&mut Client, BackendError> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            let mut client = connect::connect(&self.url).map_err(|e| self.unavailable(&e.to_string()))?;
            match schema::migrate(&mut client).map_err(|e| self.unavailable(&e.to_string()))? {
                Migrated::Ready { .. } => {}
                Migrated::Newer { found } => {
                    return Err(BackendError::NewerSchema {
                        target: self.url.display().to_string(),
                        found,
                        known: schema::VERSION,
                    });
                }
            }
            self.prepared.clear();
            self.client = Some(client);
        }
        self.client.as_mut().ok_or_else(|| BackendError::Unavailable {
            target: String::new(),
            message: "no connection".into(),
        })
    }

    fn unavailable(&self, message: &str) -> BackendError {
        BackendError::Unavailable {
            target: self.url.display().to_string(),
            message: message.to_string(),
        }
    }

    /// The failure of a client call. A lost connection, or a server that
    /// turned read-only (a standby), drops the connection: the next open
    /// connects again, to whichever server is the primary then.
    fn client_failure(&mut self, e: &postgres::Error, fault: Fault<'_>) -> Failure {
        let f = translate::failure(&fault, 0);
        let gone = e.is_closed()
            || self.client.as_ref().is_none_or(|c| c.is_closed())
            || f.code == Some(turnsafe_policy::codes::IOERR)
            || f.sqlstate.as_deref() == Some("25006");
        if gone {
            self.client = None;
        }
        f
    }
}

impl Postgres {
    pub fn location(&self) -> String {
        self.url.display().to_string()
    }

    pub fn is_open(&self) -> bool {
        self.client.as_ref().is_some_and(|c| !c.is_closed())
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    // A `Failure`, as `Backend::open` returns it.
    #[allow(clippy::result_large_err)]
    pub fn open(&mut self) -> Result<(), Failure> {
        self.client = None;
        let mut client = match connect::connect(&self.url) {
            Ok(c) => c,
            Err(connect::ConnectError::Url(e)) => return Err(translate::failure(&Fault::Config(&e), 0)),
            Err(connect::ConnectError::Postgres(e)) => return Err(translate::failure(&Fault::Connect(&e), 0)),
            Err(connect::ConnectError::Stalled { after }) => {
                return Err(translate::failure(&Fault::ConnectStalled { after }, 0));
            }
            Err(connect::ConnectError::Thread(e)) => return Err(translate::failure(&Fault::NoThread(&e), 0)),
        };
        let lock_timeout = format!("SET lock_timeout = {}", self.opts.lock_timeout.as_millis().max(1));
        if let Err(e) = client.batch_execute(&lock_timeout) {
            return Err(translate::failure(&Fault::Client(&e), 0));
        }
        let generation = match schema::migrate(&mut client) {
            Ok(Migrated::Ready { generation }) => generation,
            Ok(Migrated::Newer { found }) => return Err(translate::failure(&Fault::NewerSchema { found }, 0)),
            Err(e) => return Err(translate::failure(&Fault::Client(&e), 0)),
        };
        match &self.generation {
            Some(known) if *known != generation => {
                tracing::error!(
                    target_db = self.url.display(),
                    "the database at the URL is not the one this handle wrote to"
                );
                return Err(replaced(&self.url, known, &generation));
            }
            _ => {}
        }
        self.check_server(&mut client)?;
        // `off` returns from COMMIT before the WAL is flushed: a crash of
        // the server may lose it. A setting that cannot be read claims the
        // less.
        self.durability = match client.query_one("SHOW synchronous_commit", &[]) {
            Ok(row) if row.get::<_, String>(0) != "off" => Durability::Synced,
            _ => Durability::Unsynced,
        };
        tracing::debug!(target_db = self.url.display(), "postgres store opened");
        self.generation = Some(generation);
        self.prepared.clear();
        self.client = Some(client);
        Ok(())
    }

    /// LangGraph checkpoints, as [`crate::backend::Backend::graph_read`].
    pub fn graph_read(
        &mut self,
        query: &crate::graph::GraphQuery,
    ) -> Result<Vec<crate::graph::StoredCheckpoint>, BackendError> {
        let target = self.url.display().to_string();
        let client = self.reader()?;
        graph::read(client, query).map_err(|e| BackendError::Unavailable {
            target,
            message: e.to_string(),
        })
    }

    #[allow(clippy::result_large_err)]
    pub fn resolve(&mut self, session: &str, uids: &[String]) -> Result<bool, Failure> {
        let Some(client) = self.client.as_mut() else {
            return Err(translate::failure(&Fault::NotConnected, 0));
        };
        match write::stored_uids(client, session, uids) {
            Ok(stored) => {
                let all = stored.len() == uids.len();
                if all {
                    self.last_stored = Some((session.to_string(), uids.to_vec()));
                }
                Ok(all)
            }
            Err(e) => Err(self.client_failure(&e, Fault::Client(&e))),
        }
    }

    pub fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError> {
        let target = self.url.display().to_string();
        let client = self.reader()?;
        write::stored_uids(client, session, uids).map_err(|e| BackendError::Unavailable {
            target,
            message: e.to_string(),
        })
    }

    pub fn transcript(&mut self, session: &str) -> Result<Vec<Value>, BackendError> {
        let target = self.url.display().to_string();
        let client = self.reader()?;
        let rows = client
            .query(
                "SELECT uid, seq, item FROM messages WHERE session_id = $1 ORDER BY seq, id",
                &[&session],
            )
            .map_err(|e| BackendError::Unavailable {
                target,
                message: e.to_string(),
            })?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let item: String = r.get(2);
                serde_json::json!({
                    "uid": r.get::<_, String>(0),
                    "seq": r.get::<_, i64>(1),
                    "message": serde_json::from_str::<serde_json::Value>(&item).unwrap_or(serde_json::Value::Null),
                })
            })
            .collect())
    }

    /// With `archived`, archived rows matching too, after the transcripts'
    /// and within `limit`, most recently archived first (matched without an
    /// index).
    pub fn search(
        &mut self,
        query: &str,
        session: Option<&str>,
        limit: usize,
        archived: bool,
    ) -> Result<SearchReport, BackendError> {
        if query.trim().is_empty() {
            return Err(BackendError::EmptyQuery);
        }
        let target = self.url.display().to_string();
        let client = self.reader()?;
        let err = |e: postgres::Error| BackendError::Unavailable {
            target: target.clone(),
            message: e.to_string(),
        };
        // Bring the index up to date off the commit path; if that cannot
        // be done (a read-only server, a held lock), the rows it lacks are
        // searched without it and counted.
        if let Err(e) = client.batch_execute(
            "INSERT INTO messages_search(message_id, tsv) \
             SELECT m.id, to_tsvector('simple', COALESCE(m.content, '')) FROM messages m \
             WHERE NOT EXISTS (SELECT 1 FROM messages_search s WHERE s.message_id = m.id) \
             ON CONFLICT (message_id) DO NOTHING",
        ) {
            tracing::warn!(target_db = %target, sqlstate = ?e.code().map(|c| c.code()), "search index not brought up to date");
        }
        let limit = limit as i64;
        let rows = client
            .query(
                "WITH q AS (SELECT plainto_tsquery('simple', $1) AS q), \
                 hits AS ( \
                   SELECT m.id FROM messages m JOIN messages_search s ON s.message_id = m.id, q \
                   WHERE s.tsv @@ q.q AND ($2::text IS NULL OR m.session_id = $2) \
                   UNION ALL \
                   SELECT m.id FROM messages m, q \
                   WHERE NOT EXISTS (SELECT 1 FROM messages_search s WHERE s.message_id = m.id) \
                     AND to_tsvector('simple', COALESCE(m.content, '')) @@ q.q AND ($2::text IS NULL OR m.session_id = $2)) \
                 SELECT m.session_id, m.uid, m.seq, m.role, \
                        ts_headline('simple', COALESCE(m.content, ''), q.q, 'StartSel=[, StopSel=], HighlightAll=false') \
                 FROM hits h JOIN messages m ON m.id = h.id, q \
                 ORDER BY m.session_id, m.seq, m.id LIMIT $3",
                &[&query, &session, &limit],
            )
            .map_err(err)?;
        let unindexed: i64 = client
            .query_one(
                "SELECT count(*) FROM messages m WHERE NOT EXISTS \
                 (SELECT 1 FROM messages_search s WHERE s.message_id = m.id) AND ($1::text IS NULL OR m.session_id = $1)",
                &[&session],
            )
            .map_err(err)?
            .get(0);
        let mut hits: Vec<Hit> = rows
            .into_iter()
            .map(|r| Hit {
                session: r.get(0),
                uid: r.get(1),
                seq: r.get(2),
                role: r.get(3),
                snippet: r.get(4),
                archived: None,
            })
            .collect();
        let left = limit - (hits.len() as i64).min(limit);
        if archived && left > 0 {
            let rows = client
                .query(
                    "WITH q AS (SELECT plainto_tsquery('simple', $1) AS q) \
                     SELECT a.session_id, a.uid, a.seq, a.role, \
                            ts_headline('simple', COALESCE(a.content, ''), q.q, 'StartSel=[, StopSel=], HighlightAll=false'), \
                            a.archived_ms, a.reason \
                     FROM archive a, q \
                     WHERE to_tsvector('simple', COALESCE(a.content, '')) @@ q.q AND ($2::text IS NULL OR a.session_id = $2) \
                     ORDER BY a.archived_ms DESC, a.id DESC LIMIT $3",
                    &[&query, &session, &left],
                )
                .map_err(err)?;
            hits.extend(rows.into_iter().map(|r| Hit {
                session: r.get(0),
                uid: r.get(1),
                seq: r.get(2),
                role: r.get(3),
                snippet: r.get(4),
                archived: Some(crate::search::ArchivedHit::new(r.get(5), r.get(6))),
            }));
        }
        Ok(SearchReport {
            hits,
            unindexed: unindexed as u64,
        })
    }

    pub fn identity(&mut self) -> Result<Identity, BackendError> {
        let location = self.url.display().to_string();
        let client = self.reader()?;
        let generation: String = client
            .query_one("SELECT value FROM state_meta WHERE key = 'generation'", &[])
            .map_err(|e| BackendError::Unavailable {
                target: location.clone(),
                message: e.to_string(),
            })?
            .get(0);
        Ok(Identity { generation, location })
    }
}

/// `db_replaced`: the URL now leads to another database than the one this
/// handle wrote to (a failover to a fresh server, a database recreated).
fn replaced(url: &DbUrl, known: &str, found: &str) -> Failure {
    Failure {
        engine: turnsafe_policy::Engine::Postgres,
        evidence: vec![Evidence::DbReplaced],
        message: format!(
            "turnsafe guard: {} holds generation {found}, not {known} that this handle wrote to",
            url.display()
        ),
        ..Failure::default()
    }
}

/// What `doctor --db` reports about a server.
#[derive(Debug, Clone, Default)]
pub struct ServerState {
    pub schema_version: i64,
    pub messages: i64,
    pub sessions: i64,
    pub live_leases: i64,
    pub unindexed: i64,
    /// New transactions are read-only (`default_transaction_read_only`, a standby).
    pub read_only: bool,
    /// `synchronous_standby_names`, as set.
    pub synchronous_standby_names: String,
    /// `synchronous_commit`, as set.
    pub synchronous_commit: String,
    /// Standbys streaming in sync (or quorum) right now.
    pub sync_standbys: i64,
    /// LangGraph's state: live checkpoints and writes, and those a delete
    /// or prune marked (`None` before schema version 4).
    pub langgraph: Option<(i64, i64, i64, i64)>,
}

impl ServerState {
    /// Whether an acknowledged commit is on a standby too: a standby is
    /// named, commits wait for it, and one is streaming in sync.
    pub fn synchronous_replication(&self) -> bool {
        !self.synchronous_standby_names.trim().is_empty()
            && !matches!(self.synchronous_commit.as_str(), "off" | "local")
            && self.sync_standbys > 0
    }
}

/// Read the server's state without writing anything (no migration).
pub fn inspect(url: &DbUrl) -> Result<ServerState, connect::ConnectError> {
    let mut client = connect::connect(url)?;
    let read_only: String = client.query_one("SHOW transaction_read_only", &[])?.get(0);
    let synchronous_standby_names: String = client.query_one("SHOW synchronous_standby_names", &[])?.get(0);
    let synchronous_commit: String = client.query_one("SHOW synchronous_commit", &[])?.get(0);
    // Without `pg_monitor` the state columns read NULL: counted as not in sync.
    let sync_standbys: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')",
            &[],
        )?
        .get(0);
    let mut state = ServerState {
        read_only: read_only == "on",
        synchronous_standby_names,
        synchronous_commit,
        sync_standbys,
        ..ServerState::default()
    };
    let exists: bool = client
        .query_one("SELECT to_regclass('state_meta') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(state);
    }
    state.schema_version = client
        .query_opt("SELECT value FROM state_meta WHERE key = 'schema_version'", &[])?
        .and_then(|r| r.get::<_, String>(0).parse().ok())
        .unwrap_or(0);
    let row = client.query_one(
        "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM sessions),                 (SELECT count(*) FROM sessions WHERE lease_token IS NOT NULL AND lease_expires_ms > $1),                 (SELECT count(*) FROM messages m WHERE NOT EXISTS                     (SELECT 1 FROM messages_search s WHERE s.message_id = m.id))",
        &[&crate::store::now_ms()],
    )?;
    state.messages = row.get(0);
    state.sessions = row.get(1);
    state.live_leases = row.get(2);
    state.unindexed = row.get(3);
    let graph: bool = client
        .query_one("SELECT to_regclass('checkpoints') IS NOT NULL", &[])?
        .get(0);
    if graph {
        let r = client.query_one(
            "SELECT (SELECT count(*) FROM checkpoints WHERE deleted_ms IS NULL),
                    (SELECT count(*) FROM checkpoint_writes WHERE deleted_ms IS NULL),
                    (SELECT count(*) FROM checkpoints WHERE deleted_ms IS NOT NULL),
                    (SELECT count(*) FROM checkpoint_writes WHERE deleted_ms IS NOT NULL)",
            &[],
        )?;
        state.langgraph = Some((r.get(0), r.get(1), r.get(2), r.get(3)));
    }
    Ok(state)
}

/// Open a PostgreSQL store diverting under `home`.
pub fn open_store(url: DbUrl, home: &std::path::Path, opts: LeaseOptions) -> PgStore {
    PgStore::new(Postgres::new(url, PgOptions::default()), home, opts)
}

/// A handle on PostgreSQL for the one executor: the connection, the
/// ledger (the policy's handle state, each session's cursor, the divert
/// folder `<home>/sessions/`) and the lease this handle takes.
pub struct PgStore {
    pg: Postgres,
    /// The home the divert folder is under.
    home: std::path::PathBuf,
    ledger: Ledger,
    lease: Lease,
    /// Why the open at construction failed; the first batch observes it
    /// instead of connecting a second time.
    open_failure: Option<Failure>,
}

impl PgStore {
    /// A store on `pg`, diverting under `home/sessions/`. The server is
    /// connected to here; if that fails the store still answers every batch.
    pub fn new(pg: Postgres, home: &std::path::Path, opts: LeaseOptions) -> PgStore {
        let mut store = PgStore {
            pg,
            home: home.to_path_buf(),
            ledger: Ledger::new(home),
            lease: opts.lease(),
            open_failure: None,
        };
        store.ledger.counters.open_attempts += 1;
        match store.pg.open() {
            Ok(()) => store.ledger.counters.connections_opened += 1,
            Err(f) => store.open_failure = Some(f),
        }
        store
    }

    /// Flush one turn's batch (see [`Backend::append_batch`]).
    pub fn append_batch(&mut self, session: &SessionId, messages: &[crate::message::Message]) -> FlushOutcome {
        crate::backend::group::append_one(self, session, messages)
    }

    /// Flush batches together: one transaction, each batch in its own
    /// savepoint (see [`Backend::append_group`]).
    pub fn append_group(&mut self, batches: &[(&SessionId, &[crate::message::Message])]) -> Vec<FlushOutcome> {
        crate::backend::group::append_group(self, batches)
    }

    /// Give back this handle's lease on `session`.
    pub fn release_lease(&mut self, session: &SessionId) {
        Backend::release_lease(self, session)
    }

    /// Give back every lease this handle holds.
    pub fn release_all_leases(&mut self) {
        Backend::release_all_leases(self)
    }

    /// The home the divert folder is under.
    pub fn home(&self) -> &std::path::Path {
        &self.home
    }

    /// The connection, for reads and tests.
    pub fn backend(&mut self) -> &mut Postgres {
        &mut self.pg
    }
    pub fn divert_dir(&self) -> &std::path::Path {
        &self.ledger.divert_dir
    }
    pub fn counters(&self) -> Counters {
        self.ledger.counters
    }
    pub fn sticky(&self) -> Option<turnsafe_policy::Cause> {
        self.ledger.handle.sticky
    }

    /// The failure of a stopped write, in the policy's terms.
    fn failure_of(&mut self, stop: write::Stop) -> Failure {
        let generation = self.pg.generation.clone().unwrap_or_default();
        match stop {
            write::Stop::Client(e) => self.pg.client_failure(&e, Fault::Client(&e)),
            write::Stop::Commit(e) => self.pg.client_failure(&e, Fault::Commit(&e)),
            write::Stop::Conflict => translate::failure(&Fault::UidConflict, 0),
            write::Stop::LeaseLost => Failure {
                evidence: vec![Evidence::TurnLeaseLost],
                message: "the session's turn lease is held by another writer".into(),
                ..Failure::default()
            },
            write::Stop::Replaced(found) => replaced(&self.pg.url, &generation, &found),
            write::Stop::Failed(f) => *f,
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        Backend::release_all_leases(self);
    }
}

impl PgStore {
    /// A group with LangGraph batches: those are written in a transaction
    /// of their own (no lease, no seq), the messages in theirs. With both
    /// kinds there are two transactions, so a failure that ends one is each
    /// of its batches' own failure; with graph batches only, it is the
    /// group's.
    fn write_mixed(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> GroupWrite {
        let (graphs, messages): (Vec<usize>, Vec<usize>) =
            (0..batches.len()).partition(|&k| batches[k].0.graph.is_some());
        let flushes: Vec<&Flush<'_>> = graphs.iter().map(|&k| batches[k].0).collect();
        let written = match self.pg.client.as_mut() {
            None => graph::GraphWritten {
                group: Some(write::Stop::Failed(Box::new(translate::failure(
                    &Fault::NotConnected,
                    0,
                )))),
                each: flushes.iter().map(|_| None).collect(),
            },
            Some(client) => {
                let generation = self.pg.generation.clone().unwrap_or_default();
                graph::write_group(client, &flushes, &generation)
            }
        };
        let graph_write = GroupWrite {
            group: written.group.map(|stop| self.failure_of(stop)),
            each: written
                .each
                .into_iter()
                .map(|e| e.map(|stop| self.failure_of(stop)))
                .collect(),
        };
        if messages.is_empty() {
            return graph_write;
        }
        let subset: Vec<(&Flush<'_>, WritePlan)> = messages.iter().map(|&k| batches[k]).collect();
        let message_write = self.write_group(&subset);
        let mut each = vec![None; batches.len()];
        for (write, places) in [(graph_write, &graphs), (message_write, &messages)] {
            for (own, &k) in write.each.into_iter().zip(places.iter()) {
                each[k] = own.or_else(|| write.group.clone());
            }
        }
        GroupWrite { group: None, each }
    }
}

impl Backend for PgStore {
    fn location(&self) -> String {
        self.pg.location()
    }

    fn is_open(&self) -> bool {
        self.pg.is_open()
    }

    fn durability(&self) -> Durability {
        self.pg.durability()
    }

    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    fn open(&mut self) -> Result<(), Failure> {
        if let Some(f) = self.open_failure.take() {
            return Err(f);
        }
        // Connected when the store was made (or still connected after a
        // failure the server survived): the machine learns it now.
        if self.pg.is_open() {
            return Ok(());
        }
        self.ledger.counters.open_attempts += 1;
        self.pg.open()?;
        self.ledger.counters.connections_opened += 1;
        Ok(())
    }

    fn write_group(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> GroupWrite {
        if batches.iter().any(|(f, _)| f.graph.is_some()) {
            return self.write_mixed(batches);
        }
        let Some(client) = self.pg.client.as_mut() else {
            return GroupWrite::failed(batches.len(), translate::failure(&Fault::NotConnected, 0));
        };
        let prepared = &mut self.pg.prepared;
        let generation = self.pg.generation.clone().unwrap_or_default();
        let divert_dir = self.ledger.divert_dir.clone();
        let promised = |session: &str| crate::backend::group::divert_max_seq(&divert_dir, session).map(|m| m + 1);
        let written = write::write_group(
            client,
            prepared,
            batches,
            &mut self.ledger.sessions,
            &self.lease,
            &generation,
            &promised,
        );
        if written.group.is_none() {
            // The last batch stored, for the server check at the next connect.
            if let Some(k) = written.each.iter().rposition(Option::is_none) {
                let f = batches[k].0;
                self.pg.last_stored = Some((f.session.as_str().to_string(), f.uids.clone()));
            }
            if written.lsn.is_some() {
                self.pg.last_lsn = written.lsn;
            }
        }
        let group = written.group.map(|stop| self.failure_of(stop));
        let each = written
            .each
            .into_iter()
            .map(|e| e.map(|stop| self.failure_of(stop)))
            .collect();
        GroupWrite { group, each }
    }

    fn resolve(&mut self, session: &str, uids: &[String]) -> Result<bool, Failure> {
        self.pg.resolve(session, uids)
    }

    fn resolve_graph(&mut self, batch: &crate::graph::GraphBatch) -> Result<bool, Failure> {
        let Some(client) = self.pg.client.as_mut() else {
            return Err(translate::failure(&Fault::NotConnected, 0));
        };
        graph::resolve(client, batch).map_err(|e| self.pg.client_failure(&e, Fault::Client(&e)))
    }

    fn graph_read(
        &mut self,
        query: &crate::graph::GraphQuery,
    ) -> Result<Vec<crate::graph::StoredCheckpoint>, ReadError> {
        if let Some(cause) = self.ledger.handle.sticky {
            return Err(ReadError {
                message: format!(
                    "reading {}: the store refuses to touch its database until an operator acts",
                    self.pg.url.display()
                ),
                cause: Some(cause),
            });
        }
        let target = self.pg.url.display().to_string();
        let client = self.pg.reader().map_err(|e| ReadError {
            message: e.to_string(),
            cause: Some(turnsafe_policy::Cause::Unavailable),
        })?;
        graph::read(client, query).map_err(|e| ReadError {
            message: format!("reading {target}: {e}"),
            cause: Some(edit::cause_of(&translate::failure(&Fault::Client(&e), 0))),
        })
    }

    fn graph_edit(&mut self, edit: &crate::graph::GraphEdit) -> Result<crate::graph::GraphEdited, EditError> {
        let session = edit.session();
        let now = crate::store::now_ms();
        self.edit(edit.name(), &session, |tx, _| graph::edit(tx, edit, now))
    }

    fn graph_delete_thread(
        &mut self,
        thread: &str,
        pending: &[crate::clear::PendingRecord],
    ) -> Result<crate::graph::GraphEdited, EditError> {
        let edit = crate::graph::GraphEdit::DeleteThread(thread.to_string());
        let session = edit.session();
        let now = crate::store::now_ms();
        self.edit(edit.name(), &session, |tx, _| {
            graph_marks::store_pending(tx, pending, now)?;
            graph::edit(tx, &edit, now)
        })
    }

    fn capture(&mut self, _trigger: &str, _evidence: &[Evidence]) -> Result<Capture, CaptureError> {
        Err(CaptureError {
            operation: "read",
            file: None,
            errno: None,
            message: format!(
                "{} keeps no generation on this machine to capture",
                self.pg.url.display()
            ),
        })
    }

    fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError> {
        self.pg.stored_uids(session, uids)
    }

    fn transcript(&mut self, session: &str) -> Result<Vec<Value>, BackendError> {
        self.pg.transcript(session)
    }

    fn search(
        &mut self,
        query: &str,
        session: Option<&str>,
        limit: usize,
        archived: bool,
    ) -> Result<SearchReport, BackendError> {
        self.pg.search(query, session, limit, archived)
    }

    fn identity(&mut self) -> Result<Identity, BackendError> {
        self.pg.identity()
    }

    fn rows(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<StoredMessage>, ReadError> {
        self.read_rows(session, limit)
    }

    fn pop_last(&mut self, session: &SessionId) -> Result<Option<StoredMessage>, EditError> {
        self.pop(session)
    }

    fn clear_session(&mut self, session: &SessionId) -> Result<u64, EditError> {
        Ok(PgStore::clear_archiving(self, session, &[])?.rows.len() as u64)
    }

    fn clear_archiving(
        &mut self,
        session: &SessionId,
        pending: &[crate::clear::PendingMessage],
    ) -> Result<Cleared, EditError> {
        PgStore::clear_archiving(self, session, pending)
    }

    fn archived(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<Archived>, ReadError> {
        PgStore::archived(self, session, limit)
    }

    fn restore(&mut self, session: &SessionId, selector: &Selector) -> Result<RestoreReport, EditError> {
        PgStore::restore(self, session, selector)
    }

    fn fork(
        &mut self,
        session: &SessionId,
        at_seq: i64,
        new_session: &SessionId,
    ) -> Result<Result<ForkReport, ForkRefused>, EditError> {
        PgStore::fork(self, session, at_seq, new_session)
    }

    fn replace_suffix(
        &mut self,
        session: &SessionId,
        start_seq: i64,
        items: &[crate::message::Message],
        expected: Option<&[String]>,
        prune_below: Option<i64>,
    ) -> Result<bool, EditError> {
        PgStore::replace_suffix(self, session, start_seq, items, expected, prune_below)
    }

    fn lineage(&mut self, session: &str) -> Option<Lineage> {
        PgStore::lineage(self, session)
    }

    fn prune(&mut self, opts: &crate::history::PruneOptions) -> Result<crate::history::PruneReport, EditError> {
        PgStore::prune(self, opts)
    }

    fn delete_session(&mut self, session: &SessionId) -> Result<(u64, u64), EditError> {
        PgStore::delete_session(self, session)
    }

    /// Every lease this handle holds, given back in one statement.
    fn release_all_leases(&mut self) {
        let (ids, tokens): (Vec<String>, Vec<String>) = self
            .ledger
            .sessions
            .iter_mut()
            .filter_map(|(id, c)| Some((id.clone(), c.lease_token.take()?)))
            .unzip();
        if ids.is_empty() || self.ledger.handle.sticky.is_some() {
            return;
        }
        // A connection lost since the last batch (a server restarted) is
        // made again once, so the leases go back now rather than blocking
        // replay until they expire.
        if !self.pg.is_open() && self.pg.open().is_err() {
            tracing::warn!(
                sessions = ids.len(),
                "could not reconnect to give the turn leases back; they expire on their own"
            );
            return;
        }
        let Some(client) = self.pg.client.as_mut().filter(|c| !c.is_closed()) else {
            return;
        };
        if let Err(e) = client.execute(
            "UPDATE sessions s SET lease_token = NULL, lease_holder = NULL, lease_expires_ms = NULL \
             FROM unnest($1::text[], $2::text[]) AS v(id, t) WHERE s.id = v.id AND s.lease_token = v.t",
            &[&ids, &tokens],
        ) {
            // The leases then expire on their own.
            tracing::warn!(error = %e, sessions = ids.len(), "could not release the turn leases");
        }
    }

    fn release_lease(&mut self, session: &SessionId) {
        let token = self
            .ledger
            .sessions
            .get_mut(session.as_str())
            .and_then(|c| c.lease_token.take());
        let (Some(token), None) = (token, self.ledger.handle.sticky) else {
            return;
        };
        if !self.pg.is_open() && self.pg.open().is_err() {
            tracing::warn!(
                session = session.as_str(),
                "could not reconnect to give the turn lease back"
            );
            return;
        }
        if let Some(client) = self.pg.client.as_mut().filter(|c| !c.is_closed()) {
            let _ = client.execute(
                "UPDATE sessions SET lease_token = NULL, lease_holder = NULL, lease_expires_ms = NULL \
                 WHERE id = $1 AND lease_token = $2",
                &[&session.as_str(), &token],
            );
        }
    }
}

/// Whether a stored object's JSON text holds exactly `m`'s object.
pub(crate) fn same_item(stored: &str, m: &crate::message::Message) -> bool {
    crate::same::same_object_text(stored, m.item())
}
