//! Another runtime's history written into PostgreSQL
//! ([`crate::import_hermes`] with `--db`): the same rules as SQLite's
//! import (`store/import.rs`, [`crate::import_rows`]), in one edit per
//! group of sessions ([`PgStore::edit`]: the session row locked, the
//! generation and the first session's lease checked, the policy deciding
//! a failure).

use std::collections::HashMap;

use postgres::Transaction;

use super::PgStore;
use crate::backend::EditError;
use crate::ids::now_ms;
use crate::import_rows::{IMPORT_EDIT, IMPORT_HOLDER, ImportCounts, ImportSession, with_seq_base};

impl PgStore {
    /// Import a group of sessions in one transaction. Every session's
    /// lease is checked inside; one whose live turn lease another writer
    /// holds is skipped and counted `refused`.
    pub fn import_group(&mut self, group: &[ImportSession]) -> Result<Vec<ImportCounts>, EditError> {
        let Some(first) = group.first() else {
            return Ok(Vec::new());
        };
        self.edit("import", &first.session, |tx, _| {
            group.iter().map(|s| import_session(tx, s, true)).collect()
        })
    }

    /// What [`PgStore::import_group`] would do, in a transaction rolled
    /// back: nothing is written.
    pub fn import_dry(&mut self, group: &[ImportSession]) -> Result<Vec<ImportCounts>, EditError> {
        let Some(first) = group.first() else {
            return Ok(Vec::new());
        };
        // `edit` commits what its closure did; the closure rolls its own
        // work back first, so the COMMIT finds nothing to keep.
        self.edit("import", &first.session, |tx, _| {
            let mut sp = tx.transaction()?;
            let counts = group
                .iter()
                .map(|s| import_session(&mut sp, s, false))
                .collect::<Result<_, _>>()?;
            sp.rollback()?;
            Ok(counts)
        })
    }
}

/// Whether `session`'s live turn lease is held (by anyone: an import holds
/// none): live until its expiry, or until the server shows its holder gone.
fn lease_live(tx: &mut Transaction<'_>, session: &str) -> Result<bool, postgres::Error> {
    let row = tx.query_opt(
        "SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = $1 FOR UPDATE",
        &[&session],
    )?;
    let Some(row) = row else { return Ok(false) };
    let (token, expires, stored): (Option<String>, Option<i64>, Option<String>) = (row.get(0), row.get(1), row.get(2));
    if token.is_none() {
        return Ok(false);
    }
    let proof = crate::lease_proof::Proof::read(stored.as_deref());
    let server = super::write::backend_probe(tx, &proof)?;
    Ok(matches!(
        crate::lease_proof::judge(session, stored.as_deref(), expires, now_ms(), server),
        crate::lease_proof::Judged::Fenced(_)
    ))
}

/// Import `s` inside the caller's transaction; with `write` false nothing
/// is written and the counts say what would be.
fn import_session(tx: &mut Transaction<'_>, s: &ImportSession, write: bool) -> Result<ImportCounts, postgres::Error> {
    let mut counts = ImportCounts::default();
    let session = s.session.as_str();
    if lease_live(tx, session)? {
        counts.refused = true;
        return Ok(counts);
    }
    // Uids of the session already archived: a duplicate, whether an
    // earlier import put them there or an edit since did.
    let mut archived: HashMap<String, String> = tx
        .query("SELECT uid, item FROM archive WHERE session_id = $1", &[&session])?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let active: HashMap<String, String> = tx
        .query("SELECT uid, item FROM messages WHERE session_id = $1", &[&session])?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let base = seq_base(tx, session)?;
    if write {
        tx.execute(
            "INSERT INTO sessions(id, created_ms) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
            &[&session, &s.created_ms],
        )?;
        if let Some((origin, origin_id, meta)) = &s.meta {
            let meta = with_seq_base(meta, base);
            tx.execute(
                "INSERT INTO session_meta(session_id, origin, origin_id, meta, imported_ms) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (session_id) DO UPDATE SET origin = EXCLUDED.origin, origin_id = EXCLUDED.origin_id, \
                 meta = EXCLUDED.meta WHERE session_meta.meta IS DISTINCT FROM EXCLUDED.meta",
                &[&session, origin, origin_id, &meta, &now_ms()],
            )?;
        }
    }
    let insert = "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                  VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (session_id, uid) DO NOTHING";
    let to_archive = "INSERT INTO archive(session_id, uid, seq, role, content, item, created_ms, archived_ms, \
                      reason, holder, edit) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
    let at_ms = now_ms();
    for row in &s.rows {
        if let Some(stored) = archived.get(&row.uid).or_else(|| active.get(&row.uid)) {
            counts.held(crate::same::same_object_text(stored, row.message.item()));
            continue;
        }
        let seq = base + row.seq;
        match row.archive {
            None => {
                let written = if write {
                    let (role, content) = crate::rows::projection(row.message.item());
                    tx.execute(
                        insert,
                        &[
                            &session,
                            &row.uid,
                            &seq,
                            &role,
                            &content,
                            &row.message.item_text(),
                            &row.created_ms,
                        ],
                    )?
                } else {
                    1
                };
                if written == 1 {
                    counts.imported += 1;
                } else {
                    // Another writer stored the uid since the read above.
                    let stored: Option<String> = tx
                        .query_opt(
                            "SELECT item FROM messages WHERE session_id = $1 AND uid = $2",
                            &[&session, &row.uid],
                        )?
                        .map(|r| r.get(0));
                    counts.held(stored.is_some_and(|s| crate::same::same_object_text(&s, row.message.item())));
                }
            }
            Some(reason) => {
                if write {
                    tx.execute(
                        to_archive,
                        &[
                            &session,
                            &row.uid,
                            &seq,
                            &row.message.role(),
                            &row.message.content_text(),
                            &row.message.item_text(),
                            &row.created_ms,
                            &at_ms,
                            &reason.label(),
                            &IMPORT_HOLDER,
                            &IMPORT_EDIT,
                        ],
                    )?;
                }
                // A source's rows have distinct uids; one archived twice in
                // this run meets its first copy.
                archived.insert(row.uid.clone(), row.message.item_text());
                counts.archived += 1;
            }
        }
    }
    Ok(counts)
}

/// Where the imported rows' seqs start: `seq_base` in the session's record
/// once it was imported; before, just past the session's rows, else 0.
fn seq_base(tx: &mut Transaction<'_>, session: &str) -> Result<i64, postgres::Error> {
    let recorded: Option<String> = tx
        .query_opt("SELECT meta FROM session_meta WHERE session_id = $1", &[&session])?
        .map(|r| r.get(0));
    if let Some(meta) = recorded {
        return Ok(crate::json_in::value(&meta)
            .ok()
            .and_then(|m| m.get("seq_base").and_then(serde_json::Value::as_i64))
            .unwrap_or(0));
    }
    tx.query_one(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE session_id = $1",
        &[&session],
    )
    .map(|r| r.get(0))
}
