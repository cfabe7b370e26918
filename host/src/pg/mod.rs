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
mod import;
pub mod replay;
pub mod schema;
mod server;
pub mod translate;
mod tx;
pub mod url;
mod write;

use serde_json::Value;
use turnsafe_policy::machine::{Failure, WritePlan};
use turnsafe_policy::{Durability, Evidence};

use crate::backend::{
    Backend, BackendError, Flush, GroupWrite, Identity, Lease, LeaseOptions, Ledger, ReadError, SearchReport,
};
use crate::backend::{Counters, EditError, History};
use crate::capture::{Capture, CaptureError};
use crate::history::{Archived, Cleared, ForkRefused, ForkReport, Lineage, RestoreReport, Selector};
use crate::ids::SessionId;
use crate::transcript::StoredMessage;
use server::replaced;
pub use server::{PgOptions, Postgres, ServerState, inspect};
use translate::Fault;
use tx::TxRules;
pub use url::DbUrl;

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
        PgStore::connected(pg, home, opts.lease())
    }

    fn connected(pg: Postgres, home: &std::path::Path, lease: Lease) -> PgStore {
        let mut store = PgStore {
            pg,
            home: home.to_path_buf(),
            ledger: Ledger::new(home),
            lease,
            open_failure: None,
        };
        store.ledger.counters.open_attempts += 1;
        match store.pg.open() {
            Ok(()) => store.ledger.counters.connections_opened += 1,
            Err(f) => store.open_failure = Some(f),
        }
        store
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
        let generation = self.pg.generation();
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
        if self.refused() {
            // The next open is refused as that one was.
            self.pg.client = None;
        }
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
            self.pg.guard.lock().committed(last, lsn);
        }
        write
    }

    /// Whether the guard refused a server, on any connection of this
    /// handle's pipeline: then no connection of it writes again, one still
    /// open included.
    fn refused(&self) -> bool {
        self.pg.guard.lock().refused().is_some()
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
        let generation = self.pg.generation();
        let written = match self.pg.client.as_mut() {
            None => graph::GraphWritten {
                group: Some(write::Stop::Failed(Box::new(translate::failure(
                    &Fault::NotConnected,
                    0,
                )))),
                each: flushes.iter().map(|_| None).collect(),
            },
            Some(client) => {
                let rules = TxRules {
                    generation: &generation,
                    sync_level: self.pg.sync_level,
                };
                graph::write_group(client, &flushes, rules)
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
        let generation = self.pg.generation();
        let Some(client) = self.pg.client.as_mut() else {
            return (
                GroupWrite::failed(batches.len(), translate::failure(&Fault::NotConnected, 0)),
                None,
            );
        };
        let prepared = &mut self.pg.prepared;
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
            TxRules {
                generation: &generation,
                sync_level: self.pg.sync_level,
            },
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

    /// Further connections to the same server, each a handle of its own
    /// (its ledger, its lease holder's backend) sharing this one's
    /// identity guard and generation.
    fn pipeline(&self) -> Option<crate::backend::Pipeline> {
        let depth = self.pg.opts.pipeline;
        if depth < 2 {
            return None;
        }
        let template = self.pg.lane();
        let home = self.home.clone();
        let lease = self.lease.clone();
        Some(crate::backend::Pipeline {
            depth,
            make: Box::new(move || {
                Box::new(PgStore::connected(template.make(), &home, lease.clone()))
                    as Box<dyn crate::backend::Engine + Send>
            }),
        })
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

    fn import_group(
        &mut self,
        group: &[crate::import_rows::ImportSession],
        write: bool,
    ) -> Result<Vec<crate::import_rows::ImportCounts>, EditError> {
        if write {
            PgStore::import_group(self, group)
        } else {
            PgStore::import_dry(self, group)
        }
    }
}

/// Whether a stored object's JSON text holds exactly `m`'s object.
pub(crate) fn same_item(stored: &str, m: &crate::message::Message) -> bool {
    crate::same::same_object_text(stored, m.item())
}
