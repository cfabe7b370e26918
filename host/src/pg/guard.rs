//! The identity guard: whether the server a new connection reached still
//! holds what this handle stored there last.
//!
//! Every batch that commits (messages, a LangGraph checkpoint or writes,
//! either side of a mixed group, a lost COMMIT found stored) leaves what
//! it stored and the server's WAL position read after its COMMIT. Every connection the
//! handle makes, for a write or a read, is checked here before its first
//! use: on another server (another identity or timeline, or a WAL position
//! behind that one) the last batch stored is looked up, and a server that
//! lacks it is refused for good: the handle never uses a connection again.

use std::sync::{Arc, Mutex, MutexGuard};

use postgres::Client;
use turnsafe_policy::Evidence;
use turnsafe_policy::machine::Failure;

use super::translate::{self, Fault};
use super::url::DbUrl;
use crate::graph::GraphBatch;

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
        ServerMark {
            system_identifier,
            timeline,
            lsn: wal_position(client),
        }
    }
}

/// The server's WAL position now: where its next record goes (`None` on a
/// standby, or when it cannot be read). The insert position, not the
/// write position: it is past a COMMIT just made even when that COMMIT
/// did not wait for its WAL (`synchronous_commit = off`).
pub(super) fn wal_position(client: &mut Client) -> Option<i64> {
    client
        .query_opt(
            "SELECT CASE WHEN pg_is_in_recovery() THEN NULL \
             ELSE (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8 END",
            &[],
        )
        .ok()
        .flatten()
        .and_then(|r| r.get(0))
}

/// The last batch this handle stored, as it is looked up again.
#[derive(Debug, Clone)]
pub(super) enum LastStored {
    /// A turn's messages: its session and uids.
    Messages { session: String, uids: Vec<String> },
    /// A LangGraph checkpoint or one task's writes.
    Graph(GraphBatch),
}

/// Where the server's WAL stood after the last batch stored committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// Nothing stored yet.
    Unknown,
    At(i64),
    /// A batch committed and the position could not be read after it (the
    /// connection went with the answer): any server the next connection
    /// reaches may be behind it, so that connection looks the batch up.
    Unread,
}

/// One guard for every connection of a pipeline: what any of them stored
/// last is what every new connection is checked against, and a server one
/// of them refused is refused by all.
#[derive(Debug, Clone, Default)]
pub(super) struct Shared(Arc<Mutex<Guard>>);

impl Shared {
    /// The guard, even after a thread panicked holding it: each of its
    /// changes is one assignment, so it is never half made.
    pub(super) fn lock(&self) -> MutexGuard<'_, Guard> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the guard knows across connections.
#[derive(Debug)]
pub(super) struct Guard {
    /// The generation of the database the first open found; a later open
    /// that finds another is a replaced store.
    generation: Option<String>,
    /// The server this handle last connected to.
    server: Option<ServerMark>,
    last: Option<LastStored>,
    position: Position,
    /// Why a connection was refused: every later connection is refused the
    /// same way without being made (the policy makes the handle sticky).
    refused: Option<Failure>,
}

impl Default for Guard {
    fn default() -> Self {
        Guard {
            generation: None,
            server: None,
            last: None,
            position: Position::Unknown,
            refused: None,
        }
    }
}

impl Guard {
    /// The generation every connection must find, once one found it.
    pub(super) fn generation(&self) -> Option<&String> {
        self.generation.as_ref()
    }

    /// The first open found `generation` (a later one found the same).
    pub(super) fn found(&mut self, generation: String) {
        self.generation.get_or_insert(generation);
    }

    pub(super) fn refused(&self) -> Option<&Failure> {
        self.refused.as_ref()
    }

    /// A connection found the URL leads elsewhere: no later one is used.
    pub(super) fn refuse(&mut self, f: &Failure) {
        self.refused = Some(f.clone());
    }

    /// A batch was stored: `last`, committed before `lsn` was read (`None`
    /// when it could not be). Connections of one pipeline report in any
    /// order: a batch read at a position behind the one kept is not the
    /// later one, and the check keeps the furthest (a server restored to a
    /// point between the two lacks the one kept, and is caught by it).
    pub(super) fn committed(&mut self, last: LastStored, lsn: Option<i64>) {
        if let (Position::At(seen), Some(lsn)) = (self.position, lsn)
            && lsn < seen
        {
            return;
        }
        self.last = Some(last);
        self.position = lsn.map_or(Position::Unread, Position::At);
    }

    /// Check a new connection before its first use: if the server is not
    /// the one this handle last wrote to (another identity or timeline, or
    /// a WAL position behind the one read at the last batch stored), the
    /// last batch stored must still be there. It is after a failover with
    /// synchronous replication; it is not after a restore from an older
    /// backup, and then the store is `replaced`: every later batch is
    /// diverted.
    // A `Failure`, as `Backend::open` returns it.
    #[allow(clippy::result_large_err)]
    pub(super) fn check(&mut self, client: &mut Client, url: &DbUrl) -> Result<(), Failure> {
        let now = ServerMark::read(client);
        let changed = match &self.server {
            None => false,
            Some(before) => {
                let differs = |a: &Option<String>, b: &Option<String>| a.is_some() && b.is_some() && a != b;
                differs(&before.system_identifier, &now.system_identifier)
                    || (before.timeline.is_some() && now.timeline.is_some() && before.timeline != now.timeline)
                    || match (self.position, now.lsn) {
                        (Position::At(seen), Some(lsn)) => lsn < seen,
                        (Position::Unread, _) => true,
                        _ => false,
                    }
            }
        };
        self.server = Some(now.clone());
        let Some(last) = self.last.clone().filter(|_| changed) else {
            return Ok(());
        };
        let lacking = match &last {
            LastStored::Messages { session, uids } => {
                let stored = super::write::stored_uids(client, session, uids)
                    .map_err(|e| translate::failure(&Fault::Client(&e), 0))?;
                (stored.len() < uids.len()).then(|| {
                    format!(
                        "{} of the {} messages of the last batch this handle stored there",
                        uids.len() - stored.len(),
                        uids.len()
                    )
                })
            }
            LastStored::Graph(batch) => {
                let all =
                    super::graph::resolve(client, batch).map_err(|e| translate::failure(&Fault::Client(&e), 0))?;
                (!all).then(|| match batch {
                    GraphBatch::Checkpoint(_) => "the LangGraph checkpoint this handle stored there last".to_string(),
                    GraphBatch::Writes(w) => {
                        format!("the {} LangGraph writes this handle stored there last", w.len())
                    }
                })
            }
        };
        let Some(lacking) = lacking else {
            tracing::warn!(
                target_db = url.display(),
                "another server now, and it holds the last batch stored"
            );
            // It holds the batch at its position now: a later server behind
            // that position may lack it.
            if let Some(lsn) = now.lsn {
                self.position = Position::At(lsn);
            }
            return Ok(());
        };
        tracing::error!(
            target_db = url.display(),
            "the server lacks the last batch this handle stored"
        );
        let f = Failure {
            evidence: vec![Evidence::DbReplaced],
            message: format!(
                "turnsafe guard: {} lacks {lacking} (a restore from an older backup, or a failover that lost commits)",
                url.display(),
            ),
            engine: turnsafe_policy::Engine::Postgres,
            ..Failure::default()
        };
        self.refuse(&f);
        Err(f)
    }
}
