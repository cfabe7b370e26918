//! Reads and edits of a session's rows on PostgreSQL, outside the flush.
//!
//! An edit is one transaction that locks the session's row, checks that no
//! other writer holds its live turn lease, edits, and commits; a failure is
//! the policy's to decide, as for SQLite (`crate::store::edit`): `locked`
//! is retried on its plan, anything else fails the edit with its cause and
//! changes nothing.

use postgres::Transaction;
use turnsafe_policy::machine::Failure;
use turnsafe_policy::{Cause, Operation};

use super::PgStore;
use super::translate::{self, Fault};
use super::write::Stop;
use crate::backend::ReadError;
use crate::store::{EditError, SessionId, now_ms};
use crate::transcript::StoredMessage;

impl PgStore {
    /// The newest `limit` messages of `session` (all with `None`), in `seq` order.
    pub(super) fn read_rows(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<StoredMessage>, ReadError> {
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
        let limit = limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let client = self.pg.reader().map_err(|e| ReadError {
            message: e.to_string(),
            cause: Some(Cause::Unavailable),
        })?;
        let rows = client
            .query(
                "SELECT uid, seq, item FROM \
                 (SELECT id, uid, seq, item FROM messages WHERE session_id = $1 \
                  ORDER BY seq DESC, id DESC LIMIT $2) t ORDER BY seq, id",
                &[&session, &limit],
            )
            .map_err(|e| ReadError {
                message: format!("reading {target}: {e}"),
                cause: Some(cause_of(&translate::failure(&Fault::Client(&e), 0))),
            })?;
        Ok(rows
            .into_iter()
            .map(|r| stored(r.get(0), r.get(1), &r.get::<_, String>(2)))
            .collect())
    }

    /// Remove and return the newest message of `session`.
    pub(super) fn pop(&mut self, session: &SessionId) -> Result<Option<StoredMessage>, EditError> {
        self.edit("pop", session, |tx, session| {
            Ok(tx
                .query_opt(
                    "DELETE FROM messages WHERE id = \
                     (SELECT id FROM messages WHERE session_id = $1 ORDER BY seq DESC, id DESC LIMIT 1) \
                     RETURNING uid, seq, item",
                    &[&session],
                )?
                .map(|r| stored(r.get(0), r.get(1), &r.get::<_, String>(2))))
        })
    }

    /// Remove every stored message of `session`; returns how many.
    pub(super) fn clear(&mut self, session: &SessionId) -> Result<u64, EditError> {
        self.edit("clear", session, |tx, session| {
            tx.execute("DELETE FROM messages WHERE session_id = $1", &[&session])
        })
    }

    // A `Failure` is the policy's own input, handed to it as it is; a
    // failed edit is rare, so its size on the error path costs nothing.
    #[allow(clippy::result_large_err)]
    fn edit<T>(
        &mut self,
        edit: &'static str,
        session: &SessionId,
        mut f: impl FnMut(&mut Transaction<'_>, &str) -> Result<T, postgres::Error>,
    ) -> Result<T, EditError> {
        let sticky = self.ledger.handle.sticky;
        let ours = self
            .ledger
            .sessions
            .get(session.as_str())
            .and_then(|c| c.lease_token.clone());
        crate::store::run_edit(edit, session, sticky, |_, elapsed_ms| {
            let at = |mut f: Failure| {
                f.elapsed_ms = elapsed_ms;
                f
            };
            if !self.pg.is_open() {
                self.ledger.counters.open_attempts += 1;
                self.pg.open().map_err(at)?;
                self.ledger.counters.connections_opened += 1;
            }
            let Some(client) = self.pg.client.as_mut() else {
                return Err(at(translate::failure(&Fault::NotConnected, 0)));
            };
            let result = (|| -> Result<T, Stop> {
                let mut tx = client.transaction()?;
                // Another writer's live turn lease fences the session.
                let lease: Option<(Option<String>, Option<i64>)> = tx
                    .query_opt(
                        "SELECT lease_token, lease_expires_ms FROM sessions WHERE id = $1 FOR UPDATE",
                        &[&session.as_str()],
                    )?
                    .map(|r| (r.get(0), r.get(1)));
                if let Some((Some(token), Some(expires))) = lease
                    && expires > now_ms()
                    && ours.as_deref() != Some(token.as_str())
                {
                    return Err(Stop::LeaseLost);
                }
                let v = f(&mut tx, session.as_str())?;
                tx.commit().map_err(Stop::Commit)?;
                Ok(v)
            })();
            result.map_err(|stop| at(self.failure_of(stop)))
        })
    }
}

/// A row as read back.
fn stored(uid: String, seq: i64, item: &str) -> StoredMessage {
    StoredMessage {
        uid,
        seq,
        message: serde_json::from_str(item).unwrap_or_default(),
    }
}

/// The policy's cause of a failure outside a flush.
fn cause_of(f: &Failure) -> Cause {
    let obs = turnsafe_policy::Observation {
        engine: f.engine,
        sqlstate: f.sqlstate.clone(),
        code: f.code,
        extended_code: f.extended_code,
        message: f.message.clone(),
        errno: f.errno,
        evidence: f.evidence.clone(),
        ..turnsafe_policy::Observation::new(Operation::Replay)
    };
    turnsafe_policy::decide(&obs).classification.cause
}
