//! SQLite's edits: each attempt one `BEGIN IMMEDIATE` transaction that
//! first checks the generation guard and the session's turn lease, run by
//! [`crate::backend::edit::run_edit`].

use crate::lease_proof::{Judged, judge};
use rusqlite::{Connection, OptionalExtension};
use turnsafe_policy::Evidence;
use turnsafe_policy::machine::Failure;

use super::{EditError, SessionId, SessionStore, schema};
use crate::backend::run_edit;
use crate::guard::Verdict;
use crate::ids::now_ms;
use crate::observe;

enum Stop {
    Sqlite(rusqlite::Error, Vec<Evidence>),
    Evidence(Evidence, String),
}

impl From<rusqlite::Error> for Stop {
    fn from(e: rusqlite::Error) -> Self {
        Stop::Sqlite(e, Vec::new())
    }
}

impl SessionStore {
    // A `Failure` is the policy's own input, handed to it as it is; a
    // failed edit is rare, so its size on the error path costs nothing.
    #[allow(clippy::result_large_err)]
    pub(super) fn edit<T>(
        &mut self,
        edit: &'static str,
        session: &SessionId,
        mut f: impl FnMut(&Connection, &str) -> rusqlite::Result<T>,
    ) -> Result<T, EditError> {
        let sticky = self.ledger.handle.sticky;
        run_edit(edit, session, sticky, |degrade_fts, elapsed_ms| {
            // The handle opens its database once; a failed open is tried once per edit.
            self.open_failure = None;
            let (stop, errno) = match self.ensure_open() {
                Err(open) => {
                    let open = *open;
                    self.quarantined = open.conn;
                    (Stop::Sqlite(open.error, Vec::new()), open.errno)
                }
                Ok(()) => match self.edit_once(session, degrade_fts, &mut f) {
                    Ok(v) => return Ok(v),
                    Err(stop) => (stop, self.conn.as_ref().and_then(observe::system_errno)),
                },
            };
            Err(match stop {
                Stop::Sqlite(e, evidence) => super::failure_of(&e, errno, evidence, elapsed_ms),
                Stop::Evidence(evidence, detail) => Failure {
                    message: detail,
                    evidence: vec![evidence],
                    elapsed_ms,
                    ..Failure::default()
                },
            })
        })
    }

    /// One transaction: guard, lease, the edit, COMMIT.
    fn edit_once<T>(
        &mut self,
        session: &SessionId,
        degrade_fts: bool,
        f: &mut impl FnMut(&Connection, &str) -> rusqlite::Result<T>,
    ) -> Result<T, Stop> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(Stop::Sqlite(rusqlite::Error::InvalidQuery, Vec::new()));
        };
        let ours = self
            .ledger
            .sessions
            .get(session.as_str())
            .and_then(|s| s.lease_token.clone());
        let guard = &mut self.guard;
        let result = (|| -> Result<T, Stop> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            if let Some(g) = guard.as_mut() {
                match g.check(conn) {
                    Ok(Verdict::Intact) => {}
                    Ok(Verdict::Mismatch { evidence, detail }) => return Err(Stop::Evidence(evidence, detail)),
                    Err(e) => {
                        return Err(Stop::Sqlite(
                            rusqlite::Error::SqliteFailure(
                                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                                Some(format!("turnsafe {e}")),
                            ),
                            Vec::new(),
                        ));
                    }
                }
            }
            // Another writer's live turn lease fences the session.
            // Its lease ends on its expiry, or on the policy's word that
            // its holder is gone.
            let lease: Option<(Option<String>, Option<i64>, Option<String>)> = conn
                .query_row(
                    "SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = ?1",
                    [session.as_str()],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            if let Some((Some(token), expires, stored)) = lease
                && ours.as_deref() != Some(token.as_str())
                && let Judged::Fenced(_) = judge(
                    session.as_str(),
                    stored.as_deref(),
                    expires,
                    now_ms(),
                    turnsafe_policy::ServerProbe::Unrecorded,
                )
            {
                return Err(Stop::Evidence(
                    Evidence::TurnLeaseLost,
                    "the session's turn lease is held by another writer".into(),
                ));
            }
            if degrade_fts {
                // The index's trigger failed: mark it for rebuild, so the
                // trigger leaves it alone and search stops trusting it.
                schema::disable_fts(conn)?;
            }
            let v = f(conn, session.as_str())?;
            crate::failpoint::hit("edit.before_commit");
            // A failed COMMIT may have written the edit (`commit_sent`):
            // the policy tells from its code.
            conn.execute_batch("COMMIT")
                .map_err(|e| Stop::Sqlite(e, vec![Evidence::CommitSent]))?;
            crate::failpoint::hit("edit.after_commit");
            Ok(v)
        })();
        if result.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        result
    }
}
