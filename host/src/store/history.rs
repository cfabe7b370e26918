//! SQLite's [`History`]: its reads, and the history rewrites (see
//! [`crate::history`] for the rules), each one edit
//! ([`SessionStore::edit`]): one `BEGIN IMMEDIATE`
//! transaction that checks the generation guard and the session's turn
//! lease first, and whose failure the policy decides. An edit that fails
//! changes nothing.

use rusqlite::{Connection, OptionalExtension, params};

use super::{EditError, SessionId, SessionStore, mint_id};
use crate::backend::{BackendError, History, Identity, ReadError, SearchReport, readable};
use crate::history::{
    Archived, Cleared, ForkRefused, ForkReport, Keep, Lineage, PruneOptions, PruneReport, PrunedSession, Reason,
    RestoreReport, Selector, fork_uid,
};
use crate::ids::now_ms;
use crate::message::Message;
use crate::transcript::{self, StoredMessage};
use serde_json::Value;

/// Who edits, and which edit: stamped on every archived row.
struct Stamp<'a> {
    reason: Reason,
    holder: &'a str,
    edit: &'a str,
    at_ms: i64,
}

/// Move `session`'s rows (one uid, every row with `seq >= from_seq`, or
/// all) to the archive. Returns how many moved.
fn archive_rows(conn: &Connection, session: &str, which: Which<'_>, stamp: &Stamp<'_>) -> rusqlite::Result<u64> {
    let (uid, from_seq, below_seq) = match which {
        Which::Uid(u) => (Some(u), None, None),
        Which::From(s) => (None, Some(s), None),
        Which::Below(s) => (None, None, Some(s)),
        Which::All => (None, None, None),
    };
    let filter = "session_id = ?1 AND (?2 IS NULL OR uid = ?2) AND (?3 IS NULL OR seq >= ?3) \
                  AND (?4 IS NULL OR seq < ?4)";
    conn.prepare_cached(&format!(
        "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, reason, holder, edit) \
         SELECT session_id, uid, seq, role, content, item, created_ms, ?5, ?6, ?7, ?8 FROM messages \
         WHERE {filter} ORDER BY seq, id"
    ))?
    .execute(params![
        session,
        uid,
        from_seq,
        below_seq,
        stamp.at_ms,
        stamp.reason.label(),
        stamp.holder,
        stamp.edit
    ])?;
    crate::failpoint::hit("edit.after_archive");
    // The schema's `messages_fts_unindex` trigger takes indexed rows out
    // of the full-text index and keeps its watermark true.
    let n = conn
        .prepare_cached(&format!("DELETE FROM messages WHERE {filter}"))?
        .execute(params![session, uid, from_seq, below_seq])?;
    Ok(n as u64)
}

#[derive(Clone, Copy)]
enum Which<'a> {
    Uid(&'a str),
    From(i64),
    Below(i64),
    All,
}

/// Archive a message that never reached the database (a pending divert line).
fn archive_line(
    conn: &Connection,
    session: &str,
    uid: &str,
    seq: Option<i64>,
    m: &Message,
    stamp: &Stamp<'_>,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, reason, holder, edit) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        session,
        uid,
        seq.unwrap_or(0),
        m.role(),
        m.content_text(),
        m.item_text(),
        stamp.at_ms,
        stamp.reason.label(),
        stamp.holder,
        stamp.edit
    ])?;
    Ok(())
}

fn has_archive(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'archive')",
        [],
        |r| r.get(0),
    )
}

/// The archived rows of `session`, newest archived first (at most `limit`).
pub fn archived(conn: &Connection, session: &str, limit: Option<u64>) -> rusqlite::Result<Vec<Archived>> {
    if !has_archive(conn)? {
        // A database of an earlier version (read without migrating) has none.
        return Ok(Vec::new());
    }
    let limit = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    let mut stmt = conn.prepare_cached(
        "SELECT uid, seq, item, archived_ms, reason, holder, edit FROM archive \
         WHERE session_id = ?1 ORDER BY archived_ms DESC, id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![session, limit], |r| {
        Ok(Archived {
            uid: r.get(0)?,
            seq: r.get(1)?,
            message: crate::json_in::object(&r.get::<_, String>(2)?).unwrap_or_default(),
            archived_ms: r.get(3)?,
            reason: r.get(4)?,
            holder: r.get(5)?,
            edit: r.get(6)?,
        })
    })?;
    rows.collect()
}

/// A session's lineage, when it is a fork.
pub fn lineage(conn: &Connection, session: &str) -> rusqlite::Result<Option<Lineage>> {
    let has: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('sessions') WHERE name = 'forked_from')",
        [],
        |r| r.get(0),
    )?;
    if !has {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            "SELECT forked_from, forked_at_seq FROM sessions WHERE id = ?1",
            [session],
            |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, Option<i64>>(1)?)),
        )
        .optional()?
        .and_then(|(s, q)| Some(Lineage { session: s?, seq: q? })))
}

fn ensure_session(conn: &Connection, session: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)")?
        .execute(params![session, now_ms()])?;
    Ok(())
}

impl SessionStore {
    fn stamp_holder(&self) -> String {
        self.opts.holder.clone()
    }
}

#[allow(clippy::result_large_err)]
impl History for SessionStore {
    fn graph_read(
        &mut self,
        query: &crate::graph::GraphQuery,
    ) -> Result<Vec<crate::graph::StoredCheckpoint>, ReadError> {
        let db = self.db_path.clone();
        readable(self.ledger.handle.sticky, &db.display())?;
        if self.conn.is_none() {
            // Opening migrates: a home written before version 6 gains the
            // tables. A file that cannot be opened is held, as by a flush.
            if let Err(f) = self.ensure_open() {
                self.quarantined = f.conn;
            }
        }
        match self.conn.as_ref() {
            Some(conn) => super::graph::read(conn, query),
            None => super::open_read_only(&db).and_then(|conn| super::graph::read(&conn, query)),
        }
        .map_err(|e| ReadError {
            message: format!("reading {}: {e}", db.display()),
            cause: Some(crate::observe::cause_of(turnsafe_policy::Operation::Replay, &e)),
        })
    }

    fn graph_edit(&mut self, edit: &crate::graph::GraphEdit) -> Result<crate::graph::GraphEdited, EditError> {
        let session = edit.session();
        self.edit(edit.name(), &session, |conn, _| {
            super::graph::edit(conn, edit, crate::ids::now_ms())
        })
    }

    fn graph_delete_thread(
        &mut self,
        thread: &str,
        pending: &[crate::pending::PendingRecord],
    ) -> Result<crate::graph::GraphEdited, EditError> {
        let edit = crate::graph::GraphEdit::DeleteThread(thread.to_string());
        let session = edit.session();
        self.edit(edit.name(), &session, |conn, _| {
            let now = crate::ids::now_ms();
            super::graph_marks::store_pending(conn, pending, now)?;
            super::graph::edit(conn, &edit, now)
        })
    }

    fn rows(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<StoredMessage>, ReadError> {
        let db = self.db_path.clone();
        readable(self.ledger.handle.sticky, &db.display())?;
        match self.conn.as_ref() {
            Some(conn) => crate::transcript::stored_messages(conn, session, limit),
            // The writer could not open it; a reader may still.
            None => {
                super::open_read_only(&db).and_then(|conn| crate::transcript::stored_messages(&conn, session, limit))
            }
        }
        .map_err(|e| ReadError {
            message: format!("reading {}: {e}", db.display()),
            cause: Some(crate::observe::cause_of(turnsafe_policy::Operation::Replay, &e)),
        })
    }

    fn stored_uids(&mut self, session: &str, uids: &[String]) -> Result<Vec<String>, BackendError> {
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
        let conn = self.live()?;
        let mut stmt = conn
            .prepare_cached("SELECT 1 FROM messages WHERE session_id = ?1 AND uid = ?2")
            .map_err(|e| self.read_error(e))?;
        let mut out = Vec::new();
        for uid in uids {
            let found = stmt
                .query_row(params![session, uid], |_| Ok(()))
                .optional()
                .map_err(|e| self.read_error(e))?;
            if found.is_some() {
                out.push(uid.clone());
            }
        }
        Ok(out)
    }

    fn transcript(&mut self, session: &str) -> Result<Vec<Value>, BackendError> {
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
        super::transcript(self.live()?, session).map_err(|e| self.read_error(e))
    }

    fn search(
        &mut self,
        query: &str,
        session: Option<&str>,
        limit: usize,
        archived: bool,
    ) -> Result<SearchReport, BackendError> {
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
        let opts = crate::store::search::SearchOptions {
            session: session.map(String::from),
            limit,
            archived,
            ..crate::store::search::SearchOptions::default()
        };
        let writable = !self.opts.read_only;
        match crate::store::search::search_in(self.live()?, writable, query, &opts) {
            Ok(report) => Ok(SearchReport {
                hits: report.hits,
                unindexed: report.unindexed,
            }),
            Err(crate::store::search::SearchError::EmptyQuery) => Err(BackendError::EmptyQuery),
            Err(e) => Err(BackendError::Unavailable {
                target: self.db_path.display().to_string(),
                message: e.to_string(),
            }),
        }
    }

    fn identity(&mut self) -> Result<Identity, BackendError> {
        readable(self.ledger.handle.sticky, &self.db_path.display())?;
        let conn = self.live()?;
        let generation: String = conn
            .query_row("SELECT value FROM state_meta WHERE key = 'generation'", [], |r| {
                r.get(0)
            })
            .map_err(|e| self.read_error(e))?;
        Ok(Identity {
            generation,
            location: self.db_path.display().to_string(),
        })
    }

    /// Move the newest message of `session` to the archive and return it
    /// (`None` when it has none).
    fn pop_last(&mut self, session: &SessionId) -> Result<Option<StoredMessage>, EditError> {
        let holder = self.stamp_holder();
        let edit_id = mint_id();
        self.edit("pop", session, |conn, session| {
            let Some(last) = transcript::stored_messages(conn, session, Some(1))?.pop() else {
                return Ok(None);
            };
            let stamp = Stamp {
                reason: Reason::Pop,
                holder: &holder,
                edit: &edit_id,
                at_ms: now_ms(),
            };
            archive_rows(conn, session, Which::Uid(&last.uid), &stamp)?;
            Ok(Some(last))
        })
    }

    /// Move every stored message of `session` to the archive. Returns the
    /// rows archived. Its pending divert lines are not touched:
    /// [`crate::clear::clear`] archives and settles them with the rows.
    fn clear_session(&mut self, session: &SessionId) -> Result<u64, EditError> {
        Ok(self.clear_archiving(session, &[])?.rows.len() as u64)
    }

    /// Move every stored message of `session`, and `pending` (the divert
    /// lines [`crate::clear::clear`] took and read), to the archive in one
    /// transaction; returns what it archived.
    fn clear_archiving(
        &mut self,
        session: &SessionId,
        pending: &[crate::pending::PendingMessage],
    ) -> Result<Cleared, EditError> {
        let holder = self.stamp_holder();
        let edit_id = mint_id();
        self.edit("clear", session, |conn, session| {
            let rows = transcript::stored_messages(conn, session, None)?;
            let stamp = Stamp {
                reason: Reason::Clear,
                holder: &holder,
                edit: &edit_id,
                at_ms: now_ms(),
            };
            archive_rows(conn, session, Which::All, &stamp)?;
            let mut lines = Vec::new();
            for p in pending {
                archive_line(conn, session, &p.uid, p.seq, &p.message, &stamp)?;
                lines.push(StoredMessage {
                    uid: p.uid.clone(),
                    seq: p.seq.unwrap_or(0),
                    message: p.message.item().clone(),
                });
            }
            Ok(Cleared { rows, pending: lines })
        })
    }

    /// The archived rows of `session`, newest archived first.
    fn archived(&mut self, session: &str, limit: Option<u64>) -> Result<Vec<Archived>, ReadError> {
        let db = self.db_path.clone();
        crate::backend::readable(self.ledger.handle.sticky, &db.display())?;
        let read = match self.conn.as_ref() {
            Some(conn) => archived(conn, session, limit),
            None => super::open_read_only(&db).and_then(|conn| archived(&conn, session, limit)),
        };
        read.map_err(|e| ReadError {
            message: format!("reading {}: {e}", db.display()),
            cause: Some(crate::observe::cause_of(turnsafe_policy::Operation::Replay, &e)),
        })
    }

    /// Bring archived rows of `session` back, at their seqs, in one
    /// transaction: each uid's newest archived copy; a uid active again is
    /// skipped and reported.
    fn restore(&mut self, session: &SessionId, selector: &Selector) -> Result<RestoreReport, EditError> {
        self.edit("restore", session, |conn, session| restore_in(conn, session, selector))
    }

    /// Copy `session`'s rows up to and including `at_seq` into
    /// `new_session`, in one transaction, with the lineage.
    fn fork(
        &mut self,
        session: &SessionId,
        at_seq: i64,
        new_session: &SessionId,
    ) -> Result<Result<ForkReport, ForkRefused>, EditError> {
        if session == new_session {
            return Ok(Err(ForkRefused::Same));
        }
        self.edit("fork", new_session, |conn, new| {
            fork_in(conn, session.as_str(), at_seq, new)
        })
    }

    /// Replace the suffix of `session` from `start_seq` on with `items`, in
    /// one transaction: the replaced rows go to the archive (reason
    /// `compaction`), and with `prune_below` the rows before that seq too.
    /// With `expected`, nothing happens (`Ok(false)`) unless the stored
    /// suffix is exactly those uids, in order: the history changed since
    /// it was read.
    fn replace_suffix(
        &mut self,
        session: &SessionId,
        start_seq: i64,
        items: &[Message],
        expected: Option<&[String]>,
        prune_below: Option<i64>,
    ) -> Result<bool, EditError> {
        let holder = self.stamp_holder();
        let edit_id = mint_id();
        let (uids, _) = crate::message::uids_minting(items);
        self.edit("replace", session, |conn, session| {
            let suffix: Vec<String> = conn
                .prepare_cached("SELECT uid FROM messages WHERE session_id = ?1 AND seq >= ?2 ORDER BY seq, id")?
                .query_map(params![session, start_seq], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            if expected.is_some_and(|e| e != suffix.as_slice()) {
                return Ok(false);
            }
            let stamp = Stamp {
                reason: Reason::Compaction,
                holder: &holder,
                edit: &edit_id,
                at_ms: now_ms(),
            };
            archive_rows(conn, session, Which::From(start_seq), &stamp)?;
            if let Some(below) = prune_below {
                archive_rows(conn, session, Which::Below(below), &stamp)?;
            }
            ensure_session(conn, session)?;
            let mut insert = conn.prepare_cached(
                "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            let now = now_ms();
            for (k, (m, uid)) in items.iter().zip(&uids).enumerate() {
                insert.execute(params![
                    session,
                    uid,
                    start_seq + k as i64,
                    m.role(),
                    m.content_text(),
                    m.item_text(),
                    now
                ])?;
            }
            Ok(true)
        })
    }

    /// A session's lineage, when it is a fork.
    fn lineage(&mut self, session: &str) -> Option<Lineage> {
        // A sticky handle has no lineage to tell: it reads nothing.
        crate::backend::readable(self.ledger.handle.sticky, &self.db_path.display()).ok()?;
        let conn = self.conn.as_ref()?;
        lineage(conn, session).ok().flatten()
    }

    /// Retention: per session, move the active rows `keep` does not keep to
    /// the archive (reason `prune`) unless `archived_only`, and delete the
    /// archived rows it does not keep, for good; then give the freed pages
    /// back to the file system. A session another writer holds a live lease
    /// on is skipped and named. See `turnsafe prune --help`.
    fn prune(&mut self, opts: &PruneOptions) -> Result<PruneReport, EditError> {
        let now = now_ms();
        let cutoff_ms = match opts.keep {
            Keep::NewerThanMs(d) => now.saturating_sub(d),
            Keep::Last(_) => now,
        };
        let sessions = match &opts.session {
            Some(s) => vec![s.clone()],
            None => {
                self.open_failure = None;
                let listed = match self.ensure_open() {
                    Ok(()) => self.conn.as_ref().map(all_sessions),
                    Err(_) => None,
                };
                match listed {
                    Some(Ok(list)) => list,
                    // The edits below meet whatever keeps the store from
                    // opening, and fail with its cause.
                    _ => Vec::new(),
                }
            }
        };
        let mut report = PruneReport {
            dry_run: opts.dry_run,
            ..PruneReport::default()
        };
        let holder = self.stamp_holder();
        for id in sessions {
            let Ok(session) = SessionId::new(&id) else { continue };
            let edit_id = mint_id();
            let (archived_only, dry, keep) = (opts.archived_only, opts.dry_run, opts.keep);
            let done = self.edit("prune", &session, |conn, session| {
                let (before, last) = archived_filter(keep, cutoff_ms);
                let deleted = if dry {
                    conn.query_row(
                        &format!("SELECT count(*) FROM archive WHERE {ARCHIVED_FILTER}"),
                        params![session, before, last],
                        |r| r.get::<_, i64>(0),
                    )? as u64
                } else {
                    conn.execute(
                        &format!("DELETE FROM archive WHERE {ARCHIVED_FILTER}"),
                        params![session, before, last],
                    )? as u64
                };
                let mut archived = 0;
                if !archived_only
                    && let Some((below, stored_before)) = prune_active(conn, session, keep, cutoff_ms)?.filter()
                {
                    archived = if dry {
                        conn.query_row(
                            &format!("SELECT count(*) FROM messages WHERE {ACTIVE_FILTER}"),
                            params![session, below, stored_before],
                            |r| r.get::<_, i64>(0),
                        )? as u64
                    } else {
                        conn.execute(
                            &format!(
                                "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, \
                                 archived_ms, reason, holder, edit) \
                                 SELECT session_id, uid, seq, role, content, item, created_ms, ?4, 'prune', ?5, ?6 \
                                 FROM messages WHERE {ACTIVE_FILTER} ORDER BY seq, id"
                            ),
                            params![session, below, stored_before, now_ms(), holder, edit_id],
                        )?;
                        crate::failpoint::hit("edit.after_archive");
                        conn.execute(
                            &format!("DELETE FROM messages WHERE {ACTIVE_FILTER}"),
                            params![session, below, stored_before],
                        )? as u64
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
                Err(e) if e.cause == turnsafe_policy::Cause::TurnLease => report.skipped.push(id),
                Err(e) => return Err(e),
            }
        }
        // LangGraph rows a delete or prune marked: removed for good once
        // marked before the cutoff (`--keep-last` keeps none of them).
        if opts.session.is_none() {
            let dry = opts.dry_run;
            let (checkpoints, writes) = self.edit("prune", &SessionId::graph("langgraph"), |conn, _| {
                if dry {
                    conn.query_row(
                        "SELECT (SELECT count(*) FROM checkpoints WHERE deleted_ms <= ?1),
                                (SELECT count(*) FROM checkpoint_writes WHERE deleted_ms <= ?1)",
                        [cutoff_ms],
                        |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
                    )
                } else {
                    super::graph::purge_deleted(conn, cutoff_ms)
                }
            })?;
            report.checkpoints_purged = checkpoints;
            report.writes_purged = writes;
        }
        let freed = report.removed() + report.archived();
        report.space = if opts.dry_run || report.removed() == 0 {
            if freed == 0 {
                "none".into()
            } else {
                "none (rows moved to the archive only)".into()
            }
        } else {
            match self.reclaim() {
                Ok(bytes) => {
                    report.reclaimed_bytes = Some(bytes);
                    "reclaimed".into()
                }
                Err(why) => format!("not_reclaimed: {why}"),
            }
        };
        Ok(report)
    }

    /// Delete a session for good: its rows, its archive, its lineage, and
    /// its pending divert lines (settled as `cleared`). Refused while
    /// another writer holds its live lease. Returns `(rows, archived rows)`.
    fn delete_session(&mut self, session: &SessionId) -> Result<(u64, u64), EditError> {
        let done = self.edit("delete", session, |conn, session| {
            let rows = conn.execute("DELETE FROM messages WHERE session_id = ?1", [session])? as u64;
            let archived = conn.execute("DELETE FROM archive WHERE session_id = ?1", [session])? as u64;
            conn.execute("DELETE FROM sessions WHERE id = ?1", [session])?;
            Ok((rows, archived))
        })?;
        self.ledger.sessions.remove(session.as_str());
        Ok(done)
    }

    fn import_group(
        &mut self,
        group: &[crate::import_rows::ImportSession],
        write: bool,
    ) -> Result<Vec<crate::import_rows::ImportCounts>, EditError> {
        if write {
            return SessionStore::import_group(self, group);
        }
        let Some(first) = group.first() else {
            return Ok(Vec::new());
        };
        self.edit("import", &first.session, |conn, _| {
            group
                .iter()
                .map(|s| super::import::import_session(conn, s, false))
                .collect()
        })
    }
}

fn restore_in(conn: &Connection, session: &str, selector: &Selector) -> rusqlite::Result<RestoreReport> {
    if let Selector::Reason {
        reason: Reason::Delete,
        since_ms,
    } = selector
    {
        let (checkpoints, writes) = super::graph_marks::restore_marked(conn, session, *since_ms)?;
        return Ok(RestoreReport {
            checkpoints_restored: checkpoints,
            writes_restored: writes,
            ..RestoreReport::default()
        });
    }
    type Row = (i64, String, i64, Option<String>, Option<String>, String, i64);
    let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<Row> {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
        ))
    };
    let cols = "id, uid, seq, role, content, item, created_ms";
    let mut report = RestoreReport::default();
    let mut chosen: Vec<Row> = Vec::new();
    match selector {
        Selector::Uids(uids) => {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {cols} FROM archive WHERE session_id = ?1 AND uid = ?2 ORDER BY id DESC LIMIT 1"
            ))?;
            for uid in uids {
                match stmt.query_row(params![session, uid], read).optional()? {
                    Some(row) => chosen.push(row),
                    None => report.not_archived.push(uid.clone()),
                }
            }
        }
        Selector::Reason { reason, since_ms } => {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {cols} FROM archive WHERE session_id = ?1 AND reason = ?2 \
                 AND (?3 IS NULL OR archived_ms >= ?3) ORDER BY id DESC"
            ))?;
            let mut seen = std::collections::HashSet::new();
            for row in stmt.query_map(params![session, reason.label(), since_ms], read)? {
                let row = row?;
                if seen.insert(row.1.clone()) {
                    chosen.push(row);
                }
            }
        }
    }
    chosen.sort_by_key(|r| (r.2, r.0));
    ensure_session(conn, session)?;
    let mut active = conn.prepare_cached("SELECT 1 FROM messages WHERE session_id = ?1 AND uid = ?2")?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let mut unarchive = conn.prepare_cached("DELETE FROM archive WHERE id = ?1")?;
    for (id, uid, seq, role, content, item, created) in chosen {
        if active.exists(params![session, uid])? {
            report.skipped_active.push(uid);
            continue;
        }
        insert.execute(params![session, uid, seq, role, content, item, created])?;
        crate::failpoint::hit("edit.between_rows");
        unarchive.execute([id])?;
        report.restored.push((uid, seq));
    }
    Ok(report)
}

fn fork_in(
    conn: &Connection,
    source: &str,
    at_seq: i64,
    new: &str,
) -> rusqlite::Result<Result<ForkReport, ForkRefused>> {
    let refused_exists = || ForkRefused::Exists {
        session: new.to_string(),
        source_session: source.to_string(),
        at_seq,
    };
    let existing = conn
        .query_row(
            "SELECT forked_from, forked_at_seq FROM sessions WHERE id = ?1",
            [new],
            |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, Option<i64>>(1)?)),
        )
        .optional()?;
    type Source = (String, i64, Option<String>, Option<String>, String, i64);
    let rows: Vec<Source> = conn
        .prepare_cached(
            "SELECT uid, seq, role, content, item, created_ms FROM messages \
             WHERE session_id = ?1 AND seq <= ?2 ORDER BY seq, id",
        )?
        .query_map(params![source, at_seq], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    match existing {
        Some((Some(from), Some(at))) if from == source && at == at_seq => {}
        Some(_) => return Ok(Err(refused_exists())),
        None if rows.is_empty() => return Ok(Err(ForkRefused::NothingToFork(source.to_string(), at_seq))),
        None => {
            conn.execute(
                "INSERT INTO sessions(id, created_ms, forked_from, forked_at_seq) VALUES (?1, ?2, ?3, ?4)",
                params![new, now_ms(), source, at_seq],
            )?;
        }
    }
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO messages(session_id, uid, seq, role, content, item, created_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let (mut copied, mut already) = (0, 0);
    for (uid, seq, role, content, item, created) in rows {
        let n = insert.execute(params![new, fork_uid(new, &uid), seq, role, content, item, created])?;
        crate::failpoint::hit("edit.between_rows");
        if n == 1 {
            copied += 1;
        } else {
            already += 1;
        }
    }
    Ok(Ok(ForkReport {
        source: source.to_string(),
        at_seq,
        session: new.to_string(),
        copied,
        already,
    }))
}

/// Active rows of `session` a prune takes: `(count, below_seq)` for
/// [`Keep::Last`], or the rows stored before a time.
fn prune_active(conn: &Connection, session: &str, keep: Keep, cutoff_ms: i64) -> rusqlite::Result<PruneActive> {
    Ok(match keep {
        Keep::Last(n) => {
            let cut: Option<i64> = conn
                .query_row(
                    "SELECT seq FROM messages WHERE session_id = ?1 ORDER BY seq DESC, id DESC LIMIT 1 OFFSET ?2",
                    params![session, i64::try_from(n.saturating_sub(1)).unwrap_or(i64::MAX)],
                    |r| r.get(0),
                )
                .optional()?;
            match (n, cut) {
                (0, _) => PruneActive::All,
                (_, Some(seq)) => PruneActive::Below(seq),
                (_, None) => PruneActive::Nothing,
            }
        }
        Keep::NewerThanMs(_) => PruneActive::StoredBefore(cutoff_ms),
    })
}

enum PruneActive {
    Nothing,
    All,
    Below(i64),
    StoredBefore(i64),
}

impl PruneActive {
    /// `(seq below, stored before)` filters, `None` for nothing.
    fn filter(&self) -> Option<(Option<i64>, Option<i64>)> {
        match self {
            PruneActive::Nothing => None,
            PruneActive::All => Some((None, None)),
            PruneActive::Below(s) => Some((Some(*s), None)),
            PruneActive::StoredBefore(t) => Some((None, Some(*t))),
        }
    }
}

const ACTIVE_FILTER: &str = "session_id = ?1 AND (?2 IS NULL OR seq < ?2) AND (?3 IS NULL OR created_ms < ?3)";
const ARCHIVED_FILTER: &str = "session_id = ?1 AND ((?2 IS NOT NULL AND archived_ms < ?2) OR (?3 IS NOT NULL AND id NOT IN \
     (SELECT id FROM archive WHERE session_id = ?1 ORDER BY archived_ms DESC, id DESC LIMIT ?3)))";

/// `(before time, keep last)` for the archived rows a prune deletes.
fn archived_filter(keep: Keep, cutoff_ms: i64) -> (Option<i64>, Option<i64>) {
    match keep {
        Keep::NewerThanMs(_) => (Some(cutoff_ms), None),
        Keep::Last(n) => (None, Some(i64::try_from(n).unwrap_or(i64::MAX))),
    }
}

/// Every session with rows or archived rows.
fn all_sessions(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT id FROM sessions UNION SELECT DISTINCT session_id FROM archive ORDER BY 1")?;
    stmt.query_map([], |r| r.get(0))?.collect()
}

impl SessionStore {
    /// Give freed pages back to the file system. A database made before
    /// incremental vacuum needs one full `VACUUM` first, which writes a copy
    /// about the size of the file: it is done only when the file system has
    /// that much free, and otherwise refused with why.
    fn reclaim(&mut self) -> Result<u64, String> {
        let conn = self.conn.as_ref().ok_or("the store is not open")?;
        let pages = |conn: &Connection| -> rusqlite::Result<(i64, i64)> {
            Ok((
                conn.query_row("PRAGMA page_count", [], |r| r.get(0))?,
                conn.query_row("PRAGMA page_size", [], |r| r.get(0))?,
            ))
        };
        let (before, size) = pages(conn).map_err(|e| e.to_string())?;
        let mode: i64 = conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        if mode != 2 {
            let need = u64::try_from(before * size).unwrap_or(u64::MAX);
            let free = rustix::fs::statvfs(&self.home)
                .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
                .map_err(|e| format!("cannot read the free space under {}: {e}", self.home.display()))?;
            if free < need.saturating_mul(2) {
                return Err(format!(
                    "switching state.db to incremental vacuum needs one full VACUUM, which needs about {need} bytes \
                     free (twice the file, for its copy and the WAL); {} has {free}. The freed pages are reused by \
                     new rows meanwhile",
                    self.home.display()
                ));
            }
            conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
                .map_err(|e| format!("the one-time VACUUM failed: {e}"))?;
        } else {
            conn.execute_batch("PRAGMA incremental_vacuum")
                .map_err(|e| format!("incremental vacuum failed: {e}"))?;
        }
        // Moves the pages out of the WAL into the file, which then shrinks.
        let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
        let (after, _) = pages(conn).map_err(|e| e.to_string())?;
        Ok(u64::try_from((before - after).max(0) * size).unwrap_or(0))
    }
}
