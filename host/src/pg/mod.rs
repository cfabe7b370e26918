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
mod guard;
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
use crate::backend::{Counters, EditError, History};
use crate::capture::{Capture, CaptureError};
use crate::history::{Archived, Cleared, ForkRefused, ForkReport, Lineage, RestoreReport, Selector};
use crate::ids::SessionId;
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
    /// What the last batch stored left for the check of every new
    /// connection (see [`guard`]).
    guard: guard::Guard,
    /// Whether this connection's COMMIT waits for its WAL flush
    /// (`synchronous_commit`), read at every connect.
    durability: Durability,
    /// This connection's server backend: its pid and `backend_start` (in
    /// microseconds since the epoch), recorded with every lease it takes.
    pub(crate) backend: Option<(i32, i64)>,
}

/// Why no connection was made ready.
enum Unready {
    Failed(Failure),
    /// The database was written by a newer turnsafe: a read says so as
    /// such, a write takes it as the policy's failure.
    NewerSchema {
        found: i64,
    },
}

impl Unready {
    fn into_failure(self) -> Failure {
        match self {
            Unready::Failed(f) => f,
            Unready::NewerSchema { found } => translate::failure(&Fault::NewerSchema { found }, 0),
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
            guard: guard::Guard::default(),
            durability: Durability::Synced,
            backend: None,
        }
    }

    pub fn url(&self) -> &DbUrl {
        &self.url
    }

    /// The live connection, for tests and read commands.
    pub fn client(&mut self) -> Option<&mut Client> {
        self.client.as_mut()
    }

    /// A connection for a read: the live one, or a new one made ready as
    /// a writer's is ([`Postgres::open`]).
    fn reader(&mut self) -> Result<&mut Client, BackendError> {
        if !self.is_open() {
            self.ready().map_err(|u| match u {
                Unready::Failed(f) => self.unavailable(&f.message),
                Unready::NewerSchema { found } => BackendError::NewerSchema {
                    target: self.url.display().to_string(),
                    found,
                    known: schema::VERSION,
                },
            })?;
        }
        self.client.as_mut().ok_or_else(|| BackendError::Unavailable {
            target: String::new(),
            message: "no connection".into(),
        })
    }

    /// [`Postgres::reader`] for the reads that answer a [`ReadError`]: a
    /// connection refused says its cause (`replaced` when the guard
    /// refused the server).
    pub(super) fn read_client(&mut self) -> Result<&mut Client, ReadError> {
        if !self.is_open() {
            self.ready().map_err(|u| {
                let f = u.into_failure();
                ReadError {
                    message: format!("reading {}: {}", self.url.display(), f.message),
                    cause: Some(edit::cause_of(&f)),
                }
            })?;
        }
        self.client.as_mut().ok_or_else(|| ReadError {
            message: format!("reading {}: no connection", self.url.display()),
            cause: Some(turnsafe_policy::Cause::Unavailable),
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

    /// Connect, for a write or a read alike, and make the connection ready
    /// (see [`Postgres::ready`]).
    // A `Failure`, as `Backend::open` returns it.
    #[allow(clippy::result_large_err)]
    pub fn open(&mut self) -> Result<(), Failure> {
        self.ready().map_err(Unready::into_failure)
    }

    /// The one way this handle connects. Before its first use a connection
    /// gets the writer's `lock_timeout`, is migrated, must hold the
    /// generation this handle first found, passes the identity guard, and
    /// tells whether its COMMIT waits for the WAL flush. A read that
    /// connects does it all too: its connection is the one the next batch
    /// writes on. Once the guard or the generation refused a server, no
    /// connection is made again.
    // A `Failure` inside, as `Backend::open` returns it.
    #[allow(clippy::result_large_err)]
    fn ready(&mut self) -> Result<(), Unready> {
        self.client = None;
        if let Some(f) = self.guard.refused() {
            return Err(Unready::Failed(f.clone()));
        }
        let failed = |fault: Fault<'_>| Unready::Failed(translate::failure(&fault, 0));
        let mut client = match connect::connect(&self.url) {
            Ok(c) => c,
            Err(connect::ConnectError::Url(e)) => return Err(failed(Fault::Config(&e))),
            Err(connect::ConnectError::Postgres(e)) => return Err(failed(Fault::Connect(&e))),
            Err(connect::ConnectError::Stalled { after }) => return Err(failed(Fault::ConnectStalled { after })),
            Err(connect::ConnectError::Thread(e)) => return Err(failed(Fault::NoThread(&e))),
        };
        let lock_timeout = format!("SET lock_timeout = {}", self.opts.lock_timeout.as_millis().max(1));
        if let Err(e) = client.batch_execute(&lock_timeout) {
            return Err(failed(Fault::Client(&e)));
        }
        let generation = match schema::migrate(&mut client) {
            Ok(Migrated::Ready { generation }) => generation,
            Ok(Migrated::Newer { found }) => return Err(Unready::NewerSchema { found }),
            Err(e) => return Err(failed(Fault::Client(&e))),
        };
        match &self.generation {
            Some(known) if *known != generation => {
                tracing::error!(
                    target_db = self.url.display(),
                    "the database at the URL is not the one this handle wrote to"
                );
                let f = replaced(&self.url, known, &generation);
                self.guard.refuse(&f);
                return Err(Unready::Failed(f));
            }
            _ => {}
        }
        self.guard.check(&mut client, &self.url).map_err(Unready::Failed)?;
        // `off` returns from COMMIT before the WAL is flushed: a crash of
        // the server may lose it. A setting that cannot be read claims the
        // less.
        self.durability = match client.query_one("SHOW synchronous_commit", &[]) {
            Ok(row) if row.get::<_, String>(0) != "off" => Durability::Synced,
            _ => Durability::Unsynced,
        };
        // Who this connection is on the server, for the leases it takes: a
        // backend the server no longer lists is proof that its writer is gone.
        self.backend = client
            .query_opt(
                "SELECT pid, (EXTRACT(EPOCH FROM backend_start) * 1000000)::int8 FROM pg_stat_activity \
                 WHERE pid = pg_backend_pid()",
                &[],
            )
            .ok()
            .flatten()
            .and_then(|r| Some((r.get::<_, Option<i32>>(0)?, r.get::<_, Option<i64>>(1)?)));
        tracing::debug!(target_db = self.url.display(), "postgres store opened");
        self.generation = Some(generation);
        self.prepared.clear();
        self.client = Some(client);
        Ok(())
    }

    /// LangGraph checkpoints, as [`crate::backend::History::graph_read`].
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
    pub fn resolve(
        &mut self,
        session: &str,
        uids: &[String],
        messages: &[crate::message::Message],
    ) -> Result<bool, Failure> {
        let Some(client) = self.client.as_mut() else {
            return Err(translate::failure(&Fault::NotConnected, 0));
        };
        match write::stored_same(client, session, uids, messages) {
            Ok(all) => {
                if all {
                    // Committed after all: the last batch stored, at a WAL
                    // position read now (the one read inside its
                    // transaction went with the answer).
                    let lsn = guard::wal_position(client);
                    let last = guard::LastStored::Messages {
                        session: session.to_string(),
                        uids: uids.to_vec(),
                    };
                    self.guard.committed(last, lsn);
                }
                Ok(all)
            }
            Err(e) => Err(self.client_failure(&e, Fault::Client(&e))),
        }
    }

    /// [`Postgres::resolve`] for a LangGraph batch.
    #[allow(clippy::result_large_err)]
    pub fn resolve_graph(&mut self, batch: &crate::graph::GraphBatch) -> Result<bool, Failure> {
        let Some(client) = self.client.as_mut() else {
            return Err(translate::failure(&Fault::NotConnected, 0));
        };
        match graph::resolve(client, batch) {
            Ok(all) => {
                if all {
                    let lsn = guard::wal_position(client);
                    self.guard.committed(guard::LastStored::Graph(batch.clone()), lsn);
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
                archived: Some(crate::backend::hits::ArchivedHit::new(r.get(5), r.get(6))),
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
        &[&crate::ids::now_ms()],
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
            write::Stop::LeaseLost(holder) => Failure {
                evidence: vec![Evidence::TurnLeaseLost],
                message: "the session's turn lease is held by another writer".into(),
                lease: holder,
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
    /// Write a group: its messages, or its LangGraph batches and messages
    /// ([`PgStore::write_mixed`]). Once a transaction of it stored a batch,
    /// the guard learns the last batch stored and the server's WAL
    /// position, read after the last COMMIT: one round trip per group.
    fn write_any(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> GroupWrite {
        let (write, last) = if batches.iter().any(|(f, _)| f.graph.is_some()) {
            self.write_mixed(batches)
        } else {
            self.write_messages(batches)
        };
        if let Some(last) = last {
            // Read after the COMMIT, so the position is past the batch's own
            // WAL: a server restored from a backup taken just before it
            // starts behind it even with the checkpoint its recovery adds.
            let lsn = self.pg.client.as_mut().and_then(guard::wal_position);
            self.pg.guard.committed(last, lsn);
        }
        write
    }

    /// A group with LangGraph batches: those are written in a transaction
    /// of their own (no lease, no seq), the messages in theirs. With both
    /// kinds there are two transactions, so a failure that ends one is each
    /// of its batches' own failure; with graph batches only, it is the
    /// group's. Returns the last batch stored, the messages' if their
    /// transaction stored one (it commits after the graph one).
    fn write_mixed(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> (GroupWrite, Option<guard::LastStored>) {
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
        let graph_last = match written.group {
            Some(_) => None,
            None => written
                .each
                .iter()
                .rposition(Option::is_none)
                .and_then(|j| flushes[j].graph)
                .map(|g| guard::LastStored::Graph(g.clone())),
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
            return (graph_write, graph_last);
        }
        let subset: Vec<(&Flush<'_>, WritePlan)> = messages.iter().map(|&k| batches[k]).collect();
        let (message_write, message_last) = self.write_messages(&subset);
        let mut each = vec![None; batches.len()];
        for (write, places) in [(graph_write, &graphs), (message_write, &messages)] {
            for (own, &k) in write.each.into_iter().zip(places.iter()) {
                each[k] = own.or_else(|| write.group.clone());
            }
        }
        (GroupWrite { group: None, each }, message_last.or(graph_last))
    }

    /// A group of message batches, in one transaction. Returns the last
    /// batch it stored.
    fn write_messages(&mut self, batches: &[(&Flush<'_>, WritePlan)]) -> (GroupWrite, Option<guard::LastStored>) {
        let Some(client) = self.pg.client.as_mut() else {
            return (
                GroupWrite::failed(batches.len(), translate::failure(&Fault::NotConnected, 0)),
                None,
            );
        };
        let prepared = &mut self.pg.prepared;
        let generation = self.pg.generation.clone().unwrap_or_default();
        let divert_dir = self.ledger.divert_dir.clone();
        let promised = |session: &str| crate::backend::group::promised_seq(&divert_dir, session);
        // The lease names this process and this connection's backend.
        let (backend_pid, backend_start) = self.pg.backend.unzip();
        let lease = Lease {
            holder: crate::lease_proof::Proof {
                backend_pid,
                backend_start,
                ..crate::lease_proof::Proof::mine(&self.lease.holder)
            }
            .to_text(),
            ttl_ms: self.lease.ttl_ms,
        };
        let written = write::write_group(
            client,
            prepared,
            batches,
            &mut self.ledger.sessions,
            &lease,
            &generation,
            &promised,
        );
        let last = match written.group {
            Some(_) => None,
            None => written.each.iter().rposition(Option::is_none).map(|k| {
                let f = batches[k].0;
                guard::LastStored::Messages {
                    session: f.session.as_str().to_string(),
                    uids: f.uids.clone(),
                }
            }),
        };
        let group = written.group.map(|stop| self.failure_of(stop));
        let each = written
            .each
            .into_iter()
            .map(|e| e.map(|stop| self.failure_of(stop)))
            .collect();
        (GroupWrite { group, each }, last)
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
        self.write_any(batches)
    }

    fn resolve(
        &mut self,
        session: &str,
        uids: &[String],
        messages: &[crate::message::Message],
    ) -> Result<bool, Failure> {
        self.pg.resolve(session, uids, messages)
    }

    fn resolve_graph(&mut self, batch: &crate::graph::GraphBatch) -> Result<bool, Failure> {
        self.pg.resolve_graph(batch)
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

impl History for PgStore {
    fn graph_read(
        &mut self,
        query: &crate::graph::GraphQuery,
    ) -> Result<Vec<crate::graph::StoredCheckpoint>, ReadError> {
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display())?;
        let target = self.pg.url.display().to_string();
        let client = self.pg.read_client()?;
        graph::read(client, query).map_err(|e| ReadError {
            message: format!("reading {target}: {e}"),
            cause: Some(edit::cause_of(&translate::failure(&Fault::Client(&e), 0))),
        })
    }

    fn graph_edit(&mut self, edit: &crate::graph::GraphEdit) -> Result<crate::graph::GraphEdited, EditError> {
        let session = edit.session();
        let now = crate::ids::now_ms();
        self.edit(edit.name(), &session, |tx, _| graph::edit(tx, edit, now))
    }

    fn graph_delete_thread(
        &mut self,
        thread: &str,
        pending: &[crate::pending::PendingRecord],
    ) -> Result<crate::graph::GraphEdited, EditError> {
        let edit = crate::graph::GraphEdit::DeleteThread(thread.to_string());
        let session = edit.session();
        let now = crate::ids::now_ms();
        self.edit(edit.name(), &session, |tx, _| {
            graph_marks::store_pending(tx, pending, now)?;
            graph::edit(tx, &edit, now)
        })
    }

    fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError> {
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display())?;
        self.pg.stored_uids(session, uids)
    }

    fn transcript(&mut self, session: &str) -> Result<Vec<Value>, BackendError> {
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display())?;
        self.pg.transcript(session)
    }

    fn search(
        &mut self,
        query: &str,
        session: Option<&str>,
        limit: usize,
        archived: bool,
    ) -> Result<SearchReport, BackendError> {
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display())?;
        self.pg.search(query, session, limit, archived)
    }

    fn identity(&mut self) -> Result<Identity, BackendError> {
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display())?;
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
        pending: &[crate::pending::PendingMessage],
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
}

/// Whether a stored object's JSON text holds exactly `m`'s object.
pub(crate) fn same_item(stored: &str, m: &crate::message::Message) -> bool {
    crate::same::same_object_text(stored, m.item())
}
