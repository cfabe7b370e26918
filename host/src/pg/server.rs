//! The connection to a PostgreSQL server: connect, migrate, check the
//! identity guard, and the server's own reads ([`Postgres`]); what a
//! server holds, read for `doctor` ([`inspect`]).

use std::time::Duration;

use postgres::Client;
use serde_json::Value;
use turnsafe_policy::machine::Failure;
use turnsafe_policy::{Durability, Evidence};

use super::schema::{self, Migrated};
use super::translate::{self, Fault};
use super::url::DbUrl;
use super::{connect, edit, graph, guard, write};
use crate::backend::{BackendError, Hit, Identity, ReadError, SearchReport};

/// How the executor talks to the server.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `lock_timeout` for the writer's statements: kept small, as the
    /// policy's retry plan, not the server, decides how long to wait.
    pub lock_timeout: Duration,
    /// How many groups a shared store has in flight at once, each on its
    /// own connection (see [`crate::backend::shared`]): while one group's
    /// COMMIT waits for the server's WAL flush, the next is written. 1
    /// commits one group at a time. `TURNSAFE_PG_PIPELINE` sets it (1 to 8).
    pub pipeline: usize,
}

/// Groups in flight at once when `TURNSAFE_PG_PIPELINE` does not say.
pub const DEFAULT_PIPELINE: usize = 2;
/// The most `TURNSAFE_PG_PIPELINE` may ask for: each is a connection.
pub const MAX_PIPELINE: usize = 8;

impl PgOptions {
    /// The pipeline depth `TURNSAFE_PG_PIPELINE` asks for; a value that is
    /// not a number from 1 to [`MAX_PIPELINE`] is refused with a warning
    /// and the default taken.
    pub fn pipeline_from_env() -> usize {
        let value = std::env::var("TURNSAFE_PG_PIPELINE").ok();
        pipeline_depth(value.as_deref()).unwrap_or_else(|why| {
            tracing::warn!("{why}; using {DEFAULT_PIPELINE}");
            DEFAULT_PIPELINE
        })
    }
}

/// The depth `TURNSAFE_PG_PIPELINE` names (the default when unset), or why
/// it names none.
fn pipeline_depth(value: Option<&str>) -> Result<usize, String> {
    let Some(v) = value else {
        return Ok(DEFAULT_PIPELINE);
    };
    match v.trim().parse::<usize>() {
        Ok(n @ 1..=MAX_PIPELINE) => Ok(n),
        _ => Err(format!(
            "TURNSAFE_PG_PIPELINE must be a number from 1 to {MAX_PIPELINE}, not {v:?}"
        )),
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            lock_timeout: Duration::from_millis(50),
            pipeline: PgOptions::pipeline_from_env(),
        }
    }
}

/// The PostgreSQL executor.
pub struct Postgres {
    pub(super) url: DbUrl,
    pub(super) opts: PgOptions,
    pub(super) client: Option<Client>,
    /// The write path's statements, prepared on `client`.
    pub(super) prepared: write::Prepared,
    /// What the last batch stored left for the check of every new
    /// connection (see [`guard`]), shared by every connection of one
    /// pipeline ([`Postgres::lane`]): a connection is checked against what
    /// any of them stored last.
    pub(super) guard: guard::Shared,
    /// Whether this connection's COMMIT waits for its WAL flush
    /// (`synchronous_commit`), read at every connect.
    pub(super) durability: Durability,
    /// What every write transaction on this connection sets first, so
    /// that the durability read at connect holds for each COMMIT (see
    /// [`super::tx::begin`]); `None` under [`Durability::Unsynced`].
    pub(super) sync_level: Option<&'static str>,
    /// This connection's server backend: its pid and `backend_start` (in
    /// microseconds since the epoch), recorded with every lease it takes.
    pub(crate) backend: Option<(i32, i64)>,
}

/// A connection of a pipeline, not yet made ([`Postgres::lane`]).
pub(super) struct Lane {
    url: DbUrl,
    opts: PgOptions,
    guard: guard::Shared,
}

impl Lane {
    pub(super) fn make(&self) -> Postgres {
        Postgres {
            guard: self.guard.clone(),
            ..Postgres::new(self.url.clone(), self.opts.clone())
        }
    }
}

/// Why no connection was made ready.
pub(super) enum Unready {
    Failed(Failure),
    /// The database was written by a newer turnsafe: a read says so as
    /// such, a write takes it as the policy's failure.
    NewerSchema {
        found: i64,
    },
}

impl Unready {
    pub(super) fn into_failure(self) -> Failure {
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
            guard: guard::Shared::default(),
            durability: Durability::Synced,
            sync_level: None,
            backend: None,
        }
    }

    pub fn url(&self) -> &DbUrl {
        &self.url
    }

    /// The generation this handle's connections must find (empty before
    /// the first open found one).
    pub(super) fn generation(&self) -> String {
        self.guard.lock().generation().cloned().unwrap_or_default()
    }

    /// What a second connection to the same database for a pipeline is
    /// made from: the URL and options, and this one's identity guard, with
    /// the generation the first open of any of them found.
    pub(super) fn lane(&self) -> Lane {
        Lane {
            url: self.url.clone(),
            opts: self.opts.clone(),
            guard: self.guard.clone(),
        }
    }

    /// The live connection, for tests and read commands.
    pub fn client(&mut self) -> Option<&mut Client> {
        self.client.as_mut()
    }

    /// A connection for a read: the live one, or a new one made ready as
    /// a writer's is ([`Postgres::open`]).
    pub(super) fn reader(&mut self) -> Result<&mut Client, BackendError> {
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

    pub(super) fn unavailable(&self, message: &str) -> BackendError {
        BackendError::Unavailable {
            target: self.url.display().to_string(),
            message: message.to_string(),
        }
    }

    /// The failure of a client call. A lost connection, or a server that
    /// turned read-only (a standby), drops the connection: the next open
    /// connects again, to whichever server is the primary then.
    pub(super) fn client_failure(&mut self, e: &postgres::Error, fault: Fault<'_>) -> Failure {
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
    pub(super) fn ready(&mut self) -> Result<(), Unready> {
        self.client = None;
        if let Some(f) = self.guard.lock().refused() {
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
        let known = self.guard.lock().generation().cloned();
        match &known {
            Some(known) if *known != generation => {
                tracing::error!(
                    target_db = self.url.display(),
                    "the database at the URL is not the one this handle wrote to"
                );
                let f = replaced(&self.url, known, &generation);
                self.guard.lock().refuse(&f);
                return Err(Unready::Failed(f));
            }
            _ => {}
        }
        self.guard
            .lock()
            .check(&mut client, &self.url)
            .map_err(Unready::Failed)?;
        // `off` returns from COMMIT before the WAL is flushed: a crash of
        // the server may lose it. A setting that cannot be read claims the
        // less.
        let level = client
            .query_one("SHOW synchronous_commit", &[])
            .map(|row| row.get::<_, String>(0));
        self.sync_level = level.ok().and_then(|l| super::tx::sync_level(&l));
        self.durability = match self.sync_level {
            Some(_) => Durability::Synced,
            None => Durability::Unsynced,
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
        self.guard.lock().found(generation);
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
                    self.guard.lock().committed(last, lsn);
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
                    self.guard
                        .lock()
                        .committed(guard::LastStored::Graph(batch.clone()), lsn);
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
                    "message": crate::json_in::value(&item).unwrap_or(serde_json::Value::Null),
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
pub(super) fn replaced(url: &DbUrl, known: &str, found: &str) -> Failure {
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

#[cfg(test)]
mod pipeline_tests {
    use super::*;

    #[test]
    fn the_pipeline_depth_is_a_number_from_one_to_the_most() {
        assert_eq!(pipeline_depth(None), Ok(DEFAULT_PIPELINE));
        assert_eq!(pipeline_depth(Some("1")), Ok(1));
        assert_eq!(pipeline_depth(Some(" 4 ")), Ok(4));
        assert_eq!(pipeline_depth(Some("8")), Ok(MAX_PIPELINE));
        for bad in ["0", "9", "-1", "two", ""] {
            let why = pipeline_depth(Some(bad)).expect_err(bad);
            assert!(why.contains("from 1 to 8"), "{why}");
        }
    }
}
