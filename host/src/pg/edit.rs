//! Reads and edits of a session's rows on PostgreSQL, outside the flush.
//!
//! An edit is one transaction that locks the session's row, checks that no
//! other writer holds its live turn lease, edits, and commits; a failure is
//! the policy's to decide, as for SQLite (`crate::store::edit`): `locked`
//! is retried on its plan, anything else fails the edit with its cause and
//! changes nothing. History rewrites archive what they take out (see
//! [`crate::history`]).

use postgres::{Client, GenericClient, Transaction};
use turnsafe_policy::machine::Failure;
use turnsafe_policy::{Cause, Operation};

use super::PgStore;
use super::translate::{self, Fault};
use super::write::Stop;
use crate::backend::EditError;
use crate::backend::ReadError;
use crate::history::{Archived, Cleared, ForkRefused, ForkReport, Lineage, Reason, RestoreReport, Selector, fork_uid};
use crate::ids::{SessionId, now_ms};
use crate::message::Message;
use crate::transcript::StoredMessage;

impl super::Postgres {
    /// The archived rows of `session`, newest archived first.
    pub fn archived(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<Archived>, ReadError> {
        let target = self.url.display().to_string();
        let limit = limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let client = self.read_client()?;
        archived(client, session, limit).map_err(|e| ReadError {
            message: format!("reading {target}: {e}"),
            cause: Some(cause_of(&translate::failure(&Fault::Client(&e), 0))),
        })
    }

    /// A session's lineage, when it is a fork.
    pub fn lineage(&mut self, session: &str) -> Option<Lineage> {
        let client = self.reader().ok()?;
        lineage(client, session).ok().flatten()
    }
}

impl PgStore {
    /// The newest `limit` messages of `session` (all with `None`), in `seq` order.
    pub(super) fn read_rows(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<StoredMessage>, ReadError> {
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display())?;
        let target = self.pg.url.display().to_string();
        let limit = limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let client = self.pg.read_client()?;
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

    /// Move the newest message of `session` to the archive and return it.
    pub(super) fn pop(&mut self, session: &SessionId) -> Result<Option<StoredMessage>, EditError> {
        let stamp = self.stamp(Reason::Pop);
        self.edit("pop", session, |tx, session| {
            let last = tx.query_opt(
                "SELECT uid, seq, item FROM messages WHERE session_id = $1 ORDER BY seq DESC, id DESC LIMIT 1",
                &[&session],
            )?;
            let Some(last) = last.map(|r| stored(r.get(0), r.get(1), &r.get::<_, String>(2))) else {
                return Ok(None);
            };
            archive_rows(tx, session, Some(&last.uid), None, None, &stamp)?;
            Ok(Some(last))
        })
    }

    /// Move every stored message of `session`, and `pending` (the divert
    /// lines [`crate::clear::clear`] took and read), to the archive.
    pub(super) fn clear_archiving(
        &mut self,
        session: &SessionId,
        pending: &[crate::pending::PendingMessage],
    ) -> Result<Cleared, EditError> {
        let stamp = self.stamp(Reason::Clear);
        self.edit("clear", session, |tx, session| {
            let rows: Vec<StoredMessage> = tx
                .query(
                    "SELECT uid, seq, item FROM messages WHERE session_id = $1 ORDER BY seq, id",
                    &[&session],
                )?
                .into_iter()
                .map(|r| stored(r.get(0), r.get(1), &r.get::<_, String>(2)))
                .collect();
            archive_rows(tx, session, None, None, None, &stamp)?;
            let mut lines = Vec::new();
            for p in pending {
                let (uid, seq, m) = (&p.uid, &p.seq, &p.message);
                tx.execute(
                    "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, \
                     reason, holder, edit) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10)",
                    &[
                        &session,
                        uid,
                        &seq.unwrap_or(0),
                        &m.role(),
                        &m.content_text(),
                        &m.item_text(),
                        &stamp.at_ms,
                        &stamp.reason.label(),
                        &stamp.holder,
                        &stamp.edit,
                    ],
                )?;
                lines.push(StoredMessage {
                    uid: uid.clone(),
                    seq: seq.unwrap_or(0),
                    message: m.item().clone(),
                });
            }
            Ok(Cleared { rows, pending: lines })
        })
    }

    /// The archived rows of `session`, newest archived first.
    pub fn archived(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<Archived>, ReadError> {
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display())?;
        self.pg.archived(session, limit)
    }

    /// Bring archived rows back, at their seqs (see [`crate::history`]).
    pub fn restore(&mut self, session: &SessionId, selector: &Selector) -> Result<RestoreReport, EditError> {
        self.edit("restore", session, |tx, session| restore_in(tx, session, selector))
    }

    /// Copy `session`'s prefix up to `at_seq` into `new_session`.
    pub fn fork(
        &mut self,
        session: &SessionId,
        at_seq: i64,
        new_session: &SessionId,
    ) -> Result<Result<ForkReport, ForkRefused>, EditError> {
        if session == new_session {
            return Ok(Err(ForkRefused::Same));
        }
        self.edit("fork", new_session, |tx, new| {
            fork_in(tx, session.as_str(), at_seq, new)
        })
    }

    /// Replace the suffix from `start_seq` on (see
    /// [`crate::store::SessionStore::replace_suffix`]).
    pub fn replace_suffix(
        &mut self,
        session: &SessionId,
        start_seq: i64,
        items: &[Message],
        expected: Option<&[String]>,
        prune_below: Option<i64>,
    ) -> Result<bool, EditError> {
        let stamp = self.stamp(Reason::Compaction);
        let (uids, _) = crate::message::uids_minting(items);
        self.edit("replace", session, |tx, session| {
            let suffix: Vec<String> = tx
                .query(
                    "SELECT uid FROM messages WHERE session_id = $1 AND seq >= $2 ORDER BY seq, id",
                    &[&session, &start_seq],
                )?
                .into_iter()
                .map(|r| r.get(0))
                .collect();
            if expected.is_some_and(|e| e != suffix.as_slice()) {
                return Ok(false);
            }
            archive_rows(tx, session, None, Some(start_seq), None, &stamp)?;
            if let Some(below) = prune_below {
                archive_rows(tx, session, None, None, Some(below), &stamp)?;
            }
            ensure_session(tx, session)?;
            let now = now_ms();
            for (k, (m, uid)) in items.iter().zip(&uids).enumerate() {
                tx.execute(
                    "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    &[
                        &session,
                        uid,
                        &(start_seq + k as i64),
                        &m.role(),
                        &m.content_text(),
                        &m.item_text(),
                        &now,
                    ],
                )?;
            }
            Ok(true)
        })
    }

    /// A session's lineage, when it is a fork.
    pub fn lineage(&mut self, session: &str) -> Option<Lineage> {
        // A sticky handle has no lineage to tell: it reads nothing.
        crate::backend::readable(self.ledger.handle.sticky, &self.pg.url.display()).ok()?;
        self.pg.lineage(session)
    }

    fn stamp(&self, reason: Reason) -> Stamp {
        Stamp {
            reason,
            holder: self.lease.holder.clone(),
            edit: crate::ids::mint(),
            at_ms: now_ms(),
        }
    }

    // A `Failure` is the policy's own input, handed to it as it is; a
    // failed edit is rare, so its size on the error path costs nothing.
    #[allow(clippy::result_large_err)]
    pub(super) fn edit<T>(
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
        crate::backend::run_edit(edit, session, sticky, |_, elapsed_ms| {
            let at = |mut f: Failure| {
                f.elapsed_ms = elapsed_ms;
                f
            };
            if !self.pg.is_open() {
                self.ledger.counters.open_attempts += 1;
                self.pg.open().map_err(at)?;
                self.ledger.counters.connections_opened += 1;
            }
            let sync_level = self.pg.sync_level;
            let Some(client) = self.pg.client.as_mut() else {
                return Err(at(translate::failure(&Fault::NotConnected, 0)));
            };
            let result = (|| -> Result<T, Stop> {
                let mut tx = super::tx::begin(client, sync_level)?;
                // Another writer's live turn lease fences the session.
                // Its lease ends on its expiry, or on the policy's word that
                // its holder is gone.
                let lease: Option<(Option<String>, Option<i64>, Option<String>)> = tx
                    .query_opt(
                        "SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = $1 FOR UPDATE",
                        &[&session.as_str()],
                    )?
                    .map(|r| (r.get(0), r.get(1), r.get(2)));
                if let Some((Some(token), expires, stored)) = lease
                    && ours.as_deref() != Some(token.as_str())
                {
                    let proof = crate::lease_proof::Proof::read(stored.as_deref());
                    let server = super::write::backend_probe(&mut tx, &proof)?;
                    if let crate::lease_proof::Judged::Fenced(holder) =
                        crate::lease_proof::judge(session.as_str(), stored.as_deref(), expires, now_ms(), server)
                    {
                        return Err(Stop::LeaseLost(Some(holder)));
                    }
                }
                let v = f(&mut tx, session.as_str())?;
                crate::failpoint::hit("edit.before_commit");
                tx.commit().map_err(Stop::Commit)?;
                crate::failpoint::hit("edit.after_commit");
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
        message: crate::json_in::object(item).unwrap_or_default(),
    }
}

/// The policy's cause of a failure outside a flush.
pub(super) fn cause_of(f: &Failure) -> Cause {
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

/// Who edits, and which edit: stamped on every archived row.
struct Stamp {
    reason: Reason,
    holder: String,
    edit: String,
    at_ms: i64,
}

/// Move `session`'s rows (one uid, `seq >= from`, `seq < below`, or all)
/// to the archive. The search entries go with the rows (`ON DELETE CASCADE`).
fn archive_rows(
    tx: &mut Transaction<'_>,
    session: &str,
    uid: Option<&str>,
    from: Option<i64>,
    below: Option<i64>,
    stamp: &Stamp,
) -> Result<u64, postgres::Error> {
    let filter = "session_id = $1 AND ($2::text IS NULL OR uid = $2) AND ($3::int8 IS NULL OR seq >= $3) \
                  AND ($4::int8 IS NULL OR seq < $4)";
    tx.execute(
        &format!(
            "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, reason, \
             holder, edit) SELECT session_id, uid, seq, role, content, item, created_ms, $5, $6, $7, $8 \
             FROM messages WHERE {filter} ORDER BY seq, id"
        ),
        &[
            &session,
            &uid,
            &from,
            &below,
            &stamp.at_ms,
            &stamp.reason.label(),
            &stamp.holder,
            &stamp.edit,
        ],
    )?;
    crate::failpoint::hit("edit.after_archive");
    tx.execute(
        &format!("DELETE FROM messages WHERE {filter}"),
        &[&session, &uid, &from, &below],
    )
}

fn ensure_session(tx: &mut Transaction<'_>, session: &str) -> Result<(), postgres::Error> {
    tx.execute(
        "INSERT INTO sessions(id, created_ms) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
        &[&session, &now_ms()],
    )?;
    Ok(())
}

fn archived(client: &mut Client, session: &str, limit: Option<i64>) -> Result<Vec<Archived>, postgres::Error> {
    Ok(client
        .query(
            "SELECT uid, seq, item, archived_ms, reason, holder, edit FROM archive \
             WHERE session_id = $1 ORDER BY archived_ms DESC, id DESC LIMIT $2",
            &[&session, &limit],
        )?
        .into_iter()
        .map(|r| Archived {
            uid: r.get(0),
            seq: r.get(1),
            message: crate::json_in::object(&r.get::<_, String>(2)).unwrap_or_default(),
            archived_ms: r.get(3),
            reason: r.get(4),
            holder: r.get(5),
            edit: r.get(6),
        })
        .collect())
}

fn lineage(client: &mut impl GenericClient, session: &str) -> Result<Option<Lineage>, postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT forked_from, forked_at_seq FROM sessions WHERE id = $1",
            &[&session],
        )?
        .and_then(|r| {
            Some(Lineage {
                session: r.get::<_, Option<String>>(0)?,
                seq: r.get::<_, Option<i64>>(1)?,
            })
        }))
}

type ArchivedRow = (i64, String, i64, Option<String>, Option<String>, String, i64);

fn restore_in(tx: &mut Transaction<'_>, session: &str, selector: &Selector) -> Result<RestoreReport, postgres::Error> {
    if let Selector::Reason {
        reason: Reason::Delete,
        since_ms,
    } = selector
    {
        let (checkpoints, writes) = super::graph_marks::restore_marked(tx, session, *since_ms)?;
        return Ok(RestoreReport {
            checkpoints_restored: checkpoints,
            writes_restored: writes,
            ..RestoreReport::default()
        });
    }
    let cols = "id, uid, seq, role, content, item, created_ms";
    let row =
        |r: &postgres::Row| -> ArchivedRow { (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)) };
    let mut report = RestoreReport::default();
    let mut chosen: Vec<ArchivedRow> = Vec::new();
    match selector {
        Selector::Uids(uids) => {
            for uid in uids {
                match tx.query_opt(
                    &format!("SELECT {cols} FROM archive WHERE session_id = $1 AND uid = $2 ORDER BY id DESC LIMIT 1"),
                    &[&session, uid],
                )? {
                    Some(r) => chosen.push(row(&r)),
                    None => report.not_archived.push(uid.clone()),
                }
            }
        }
        Selector::Reason { reason, since_ms } => {
            let mut seen = std::collections::HashSet::new();
            for r in tx.query(
                &format!(
                    "SELECT {cols} FROM archive WHERE session_id = $1 AND reason = $2 \
                     AND ($3::int8 IS NULL OR archived_ms >= $3) ORDER BY id DESC"
                ),
                &[&session, &reason.label(), since_ms],
            )? {
                let r = row(&r);
                if seen.insert(r.1.clone()) {
                    chosen.push(r);
                }
            }
        }
    }
    chosen.sort_by_key(|r| (r.2, r.0));
    ensure_session(tx, session)?;
    for (id, uid, seq, role, content, item, created) in chosen {
        let inserted = tx.execute(
            "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (session_id, uid) DO NOTHING",
            &[&session, &uid, &seq, &role, &content, &item, &created],
        )?;
        if inserted == 0 {
            report.skipped_active.push(uid);
            continue;
        }
        tx.execute("DELETE FROM archive WHERE id = $1", &[&id])?;
        report.restored.push((uid, seq));
        crate::failpoint::hit("edit.between_rows");
    }
    Ok(report)
}

fn fork_in(
    tx: &mut Transaction<'_>,
    source: &str,
    at_seq: i64,
    new: &str,
) -> Result<Result<ForkReport, ForkRefused>, postgres::Error> {
    let existing = tx
        .query_opt("SELECT forked_from, forked_at_seq FROM sessions WHERE id = $1", &[&new])?
        .map(|r| (r.get::<_, Option<String>>(0), r.get::<_, Option<i64>>(1)));
    let rows = tx.query(
        "SELECT uid, seq, role, content, item, created_ms FROM messages \
         WHERE session_id = $1 AND seq <= $2 ORDER BY seq, id",
        &[&source, &at_seq],
    )?;
    match existing {
        Some((Some(from), Some(at))) if from == source && at == at_seq => {}
        Some(_) => {
            return Ok(Err(ForkRefused::Exists {
                session: new.to_string(),
                source_session: source.to_string(),
                at_seq,
            }));
        }
        None if rows.is_empty() => return Ok(Err(ForkRefused::NothingToFork(source.to_string(), at_seq))),
        None => {
            tx.execute(
                "INSERT INTO sessions(id, created_ms, forked_from, forked_at_seq) VALUES ($1, $2, $3, $4)",
                &[&new, &now_ms(), &source, &at_seq],
            )?;
        }
    }
    let (mut copied, mut already) = (0, 0);
    for r in rows {
        let uid: String = r.get(0);
        let n = tx.execute(
            "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (session_id, uid) DO NOTHING",
            &[
                &new,
                &fork_uid(new, &uid),
                &r.get::<_, i64>(1),
                &r.get::<_, Option<String>>(2),
                &r.get::<_, Option<String>>(3),
                &r.get::<_, String>(4),
                &r.get::<_, i64>(5),
            ],
        )?;
        if n == 1 {
            copied += 1;
        } else {
            already += 1;
        }
        crate::failpoint::hit("edit.between_rows");
    }
    Ok(Ok(ForkReport {
        source: source.to_string(),
        at_seq,
        session: new.to_string(),
        copied,
        already,
    }))
}

const ACTIVE_FILTER: &str =
    "session_id = $1 AND ($2::int8 IS NULL OR seq < $2) AND ($3::int8 IS NULL OR created_ms < $3)";
const ARCHIVED_FILTER: &str = "session_id = $1 AND (($2::int8 IS NOT NULL AND archived_ms < $2) OR ($3::int8 IS NOT NULL \
     AND id NOT IN (SELECT id FROM archive WHERE session_id = $1 ORDER BY archived_ms DESC, id DESC LIMIT $3)))";

impl PgStore {
    /// Retention on PostgreSQL, as [`crate::store::SessionStore::prune`]
    /// does on SQLite; the freed space is made reusable (`VACUUM`), not
    /// given back to the file system.
    pub fn prune(&mut self, opts: &crate::history::PruneOptions) -> Result<crate::history::PruneReport, EditError> {
        use crate::history::{Keep, PruneReport, PrunedSession};
        let now = now_ms();
        let cutoff_ms = match opts.keep {
            Keep::NewerThanMs(d) => now.saturating_sub(d),
            Keep::Last(_) => now,
        };
        let sessions: Vec<String> = match &opts.session {
            Some(s) => vec![s.clone()],
            None => match self.pg.reader() {
                Ok(client) => client
                    .query(
                        "SELECT id FROM sessions UNION SELECT DISTINCT session_id FROM archive ORDER BY 1",
                        &[],
                    )
                    .map(|rows| rows.into_iter().map(|r| r.get(0)).collect())
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            },
        };
        let (before, last) = match opts.keep {
            Keep::NewerThanMs(_) => (Some(cutoff_ms), None),
            Keep::Last(n) => (None, Some(i64::try_from(n).unwrap_or(i64::MAX))),
        };
        let mut report = PruneReport {
            dry_run: opts.dry_run,
            ..PruneReport::default()
        };
        let stamp = self.stamp(Reason::Prune);
        for id in sessions {
            let Ok(session) = SessionId::new(&id) else { continue };
            let (archived_only, dry, keep) = (opts.archived_only, opts.dry_run, opts.keep);
            let done = self.edit("prune", &session, |tx, session| {
                let count = |tx: &mut Transaction<'_>, sql: &str, p: &[&(dyn postgres::types::ToSql + Sync)]| {
                    tx.query_one(sql, p)
                        .map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0))
                };
                let deleted = if dry {
                    count(
                        tx,
                        &format!("SELECT count(*) FROM archive WHERE {ARCHIVED_FILTER}"),
                        &[&session, &before, &last],
                    )?
                } else {
                    tx.execute(
                        &format!("DELETE FROM archive WHERE {ARCHIVED_FILTER}"),
                        &[&session, &before, &last],
                    )?
                };
                let mut archived = 0;
                if !archived_only {
                    let (below, stored_before): (Option<i64>, Option<i64>) = match keep {
                        Keep::NewerThanMs(_) => (None, Some(cutoff_ms)),
                        Keep::Last(0) => (None, None),
                        Keep::Last(n) => {
                            let cut: Option<i64> = tx
                                .query_opt(
                                    "SELECT seq FROM messages WHERE session_id = $1 ORDER BY seq DESC, id DESC \
                                     LIMIT 1 OFFSET $2",
                                    &[&session, &i64::try_from(n - 1).unwrap_or(i64::MAX)],
                                )?
                                .map(|r| r.get(0));
                            match cut {
                                Some(seq) => (Some(seq), None),
                                None => (Some(i64::MIN), None),
                            }
                        }
                    };
                    archived = if dry {
                        count(
                            tx,
                            &format!("SELECT count(*) FROM messages WHERE {ACTIVE_FILTER}"),
                            &[&session, &below, &stored_before],
                        )?
                    } else {
                        tx.execute(
                            &format!(
                                "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, \
                                 archived_ms, reason, holder, edit) \
                                 SELECT session_id, uid, seq, role, content, item, created_ms, $4, 'prune', $5, $6 \
                                 FROM messages WHERE {ACTIVE_FILTER} ORDER BY seq, id"
                            ),
                            &[
                                &session,
                                &below,
                                &stored_before,
                                &stamp.at_ms,
                                &stamp.holder,
                                &stamp.edit,
                            ],
                        )?;
                        crate::failpoint::hit("edit.after_archive");
                        tx.execute(
                            &format!("DELETE FROM messages WHERE {ACTIVE_FILTER}"),
                            &[&session, &below, &stored_before],
                        )?
                    };
                }
                Ok(PrunedSession {
                    session: session.to_string(),
                    archived,
                    deleted,
                })
            });
            match done {
                Ok(p) => report.sessions.push(p),
                Err(e) if e.cause == Cause::TurnLease => report.skipped.push(id),
                Err(e) => return Err(e),
            }
        }
        // LangGraph rows a delete or prune marked: removed for good once
        // marked before the cutoff (`--keep-last` keeps none of them).
        if opts.session.is_none() {
            let dry = opts.dry_run;
            let (checkpoints, writes) = self.edit("prune", &SessionId::graph("langgraph"), |tx, _| {
                if dry {
                    let r = tx.query_one(
                        "SELECT (SELECT count(*) FROM checkpoints WHERE deleted_ms <= $1),
                                (SELECT count(*) FROM checkpoint_writes WHERE deleted_ms <= $1)",
                        &[&cutoff_ms],
                    )?;
                    Ok((r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64))
                } else {
                    super::graph::purge_deleted(tx, cutoff_ms)
                }
            })?;
            report.checkpoints_purged = checkpoints;
            report.writes_purged = writes;
        }
        report.space = if opts.dry_run || report.removed() == 0 {
            "none".into()
        } else {
            // VACUUM cannot run inside a transaction; it makes the space of
            // deleted rows reusable by later rows (a full VACUUM would give
            // it back, holding an exclusive lock for as long as it takes).
            match self
                .pg
                .client
                .as_mut()
                .map(|c| c.batch_execute("VACUUM archive, messages"))
            {
                Some(Ok(())) => "reusable".into(),
                Some(Err(e)) => format!("not_reclaimed: VACUUM failed: {e}"),
                None => "not_reclaimed: not connected".into(),
            }
        };
        Ok(report)
    }

    /// Delete a session for good (see [`crate::store::SessionStore::delete_session`]).
    pub fn delete_session(&mut self, session: &SessionId) -> Result<(u64, u64), EditError> {
        let done = self.edit("delete", session, |tx, session| {
            let rows = tx.execute("DELETE FROM messages WHERE session_id = $1", &[&session])?;
            let archived = tx.execute("DELETE FROM archive WHERE session_id = $1", &[&session])?;
            tx.execute("DELETE FROM sessions WHERE id = $1", &[&session])?;
            Ok((rows, archived))
        })?;
        self.ledger.sessions.remove(session.as_str());
        Ok(done)
    }
}
