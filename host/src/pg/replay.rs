//! Replay into PostgreSQL: the same files, ledger and settlements as
//! SQLite's replay ([`crate::replay`]); each chunk is one transaction that
//! holds the session row locked, so live writers of the session wait.

use postgres::Client;

use super::connect;
use super::url::DbUrl;
use crate::graph::{GraphLine, StoredGraph};
use crate::ids::now_ms;
use crate::replay::{Lease, ReplayError, Row, Target};

/// The replay target on a PostgreSQL server.
pub struct PgTarget {
    url: String,
    client: Client,
}

impl PgTarget {
    /// Connect and migrate; a held lock is waited on for up to 10 s.
    pub fn open(url: &DbUrl) -> Result<PgTarget, ReplayError> {
        let target = url.display().to_string();
        let err = |message: String| ReplayError::Postgres {
            target: target.clone(),
            message,
        };
        let mut client = connect::connect(url).map_err(|e| err(e.to_string()))?;
        client
            .batch_execute("SET lock_timeout = '10s'")
            .map_err(|e| err(e.to_string()))?;
        match super::schema::migrate(&mut client).map_err(|e| err(e.to_string()))? {
            super::schema::Migrated::Ready { .. } => {}
            super::schema::Migrated::Newer { found } => {
                return Err(err(format!(
                    "schema version {found} is newer than this turnsafe knows ({})",
                    super::schema::VERSION
                )));
            }
        }
        Ok(PgTarget { url: target, client })
    }

    fn err(&self, e: postgres::Error) -> ReplayError {
        ReplayError::Postgres {
            target: self.url.clone(),
            message: e.to_string(),
        }
    }
}

impl Target for PgTarget {
    fn lease(&mut self, session: &str) -> Result<Option<Lease>, ReplayError> {
        let row = self
            .client
            .query_opt(
                "SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = $1",
                &[&session],
            )
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
    }
    fn start(&mut self) -> Result<(), ReplayError> {
        Ok(())
    }
    fn begin(&mut self, session: &str, _first: bool) -> Result<(), ReplayError> {
        let result = (|| {
            // Always waiting for the flush, whatever the server's setting:
            // a settled divert file leaves the server the only copy.
            self.client.batch_execute("BEGIN; SET LOCAL synchronous_commit = on")?;
            self.client.execute(
                "INSERT INTO sessions(id, created_ms) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                &[&session, &now_ms()],
            )?;
            self.client
                .execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&session])
        })();
        result.map(|_| ()).map_err(|e| self.err(e))
    }
    fn commit(&mut self) -> Result<(), ReplayError> {
        self.client.batch_execute("COMMIT").map_err(|e| self.err(e))
    }
    fn rollback(&mut self) {
        let _ = self.client.batch_execute("ROLLBACK");
    }
    fn stored_item(&mut self, session: &str, uid: &str) -> Result<Option<String>, ReplayError> {
        let row = self
            .client
            .query_opt(
                "SELECT item FROM messages WHERE session_id = $1 AND uid = $2",
                &[&session, &uid],
            )
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| r.get(0)))
    }
    fn insert(&mut self, session: &str, uid: &str, seq: Option<i64>, row: &Row<'_>) -> Result<bool, ReplayError> {
        let m = row.message;
        let inserted = self
            .client
            .query_opt(
                // Back to its place unless another message holds it; then at the end.
                "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                 VALUES ($1, $2, \
                         CASE WHEN $3::bigint IS NOT NULL \
                               AND NOT EXISTS (SELECT 1 FROM messages WHERE session_id = $1 AND seq = $3::bigint) \
                              THEN $3::bigint \
                              ELSE (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = $1) END, \
                         $4, $5, $6, $7) \
                 ON CONFLICT (session_id, uid) DO NOTHING RETURNING uid",
                &[
                    &session,
                    &uid,
                    &seq,
                    &m.role(),
                    &m.content_text(),
                    &m.item_text(),
                    &now_ms(),
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(inserted.is_some())
    }
    fn cleared_items(&mut self, session: &str, uid: &str) -> Result<Vec<String>, ReplayError> {
        let rows = self
            .client
            .query(
                "SELECT item FROM archive WHERE session_id = $1 AND uid = $2 AND reason = 'clear'",
                &[&session, &uid],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
    fn finish(&mut self) -> Result<(), ReplayError> {
        Ok(())
    }
    fn graph_stored(&mut self, line: &GraphLine) -> Result<Option<StoredGraph>, ReplayError> {
        // Locked, so no live writer of the thread changes it before the
        // chunk commits (a dry run outside a transaction locks nothing).
        super::graph::stored(&mut self.client, line, true).map_err(|e| self.err(e))
    }
    fn graph_put(
        &mut self,
        line: &GraphLine,
        created_ms: i64,
        deleted_ms: Option<i64>,
        over: bool,
    ) -> Result<bool, ReplayError> {
        super::graph::replay_put(&mut self.client, line, created_ms, deleted_ms, over).map_err(|e| self.err(e))
    }
}

/// Replay the divert files under `home` into `url`.
pub fn replay(
    home: &std::path::Path,
    url: &DbUrl,
    opts: &crate::replay::ReplayOptions,
) -> Result<crate::replay::ReplayRun, ReplayError> {
    crate::replay::replay_into(home, opts, || {
        PgTarget::open(url).map(|t| Box::new(t) as Box<dyn Target>)
    })
}
