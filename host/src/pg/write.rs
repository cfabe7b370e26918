//! One attempt at writing a batch to PostgreSQL: a single transaction.
//!
//! The session's row is locked first (`SELECT ... FOR UPDATE`), so writers
//! of one session and replay take turns, and a held lock fails after
//! `lock_timeout` with 55P03 instead of waiting. Stored uids are compared
//! before the insert; the insert itself is `ON CONFLICT (session_id, uid)
//! DO NOTHING RETURNING uid`, and any uid it did not insert is compared
//! with what is stored. No error is caught and continued inside the
//! transaction: in PostgreSQL any error aborts it.

use std::collections::{HashMap, HashSet};

use postgres::{Client, Transaction};
use turnsafe_policy::machine::WritePlan;

use crate::backend::{Batch, Cursor, Lease};
use crate::store::{mint_id, now_ms};

pub(super) enum Stop {
    Client(postgres::Error),
    /// COMMIT was sent and did not answer success: a lost connection
    /// leaves the batch's fate unknown until its uids are looked up.
    Commit(postgres::Error),
    /// A uid of the batch is stored with different content.
    Conflict,
    /// Another writer holds this session's turn lease.
    LeaseLost,
    /// The database's generation is not the one the handle opened.
    Replaced(String),
}

impl From<postgres::Error> for Stop {
    fn from(e: postgres::Error) -> Self {
        Stop::Client(e)
    }
}

/// A message as stored: its object's JSON text.
type Stored = String;

/// A message of the batch: uid, role, content projection, object text.
type Fresh = (String, Option<String>, Option<String>, String);

pub(super) fn write(
    client: &mut Client,
    batch: &Batch<'_>,
    plan: &WritePlan,
    cursor: &mut Cursor,
    lease: &Lease,
    generation: &str,
) -> Result<Option<i64>, Stop> {
    let session = batch.session.as_str();
    let mut tx = client.transaction()?;
    let (token, lsn) = take_lease(&mut tx, session, cursor, plan.recreate_session, lease, generation)?;
    let stored_max: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = $1",
            &[&session],
        )?
        .get(0);
    let first_seq = cursor.next_seq.map_or(stored_max, |k| k.max(stored_max));

    // Rows of the batch already stored: identical ones count as committed
    // (an idempotent resend), a different one is a conflict.
    let rows: Vec<(Fresh, &crate::message::Message)> = batch
        .messages
        .iter()
        .zip(batch.uids)
        .map(|(m, uid)| {
            (
                (uid.clone(), m.role().map(String::from), m.content_text(), m.item_text()),
                m,
            )
        })
        .collect();
    let stored = stored_rows(&mut tx, session, batch.uids)?;
    let mut seen = HashSet::new();
    let mut fresh = Vec::new();
    for (row, m) in &rows {
        match stored.get(&row.0) {
            Some(s) if !super::same_item(s, m) => return Err(Stop::Conflict),
            Some(_) => {}
            None if seen.insert(row.0.clone()) => fresh.push((row, *m)),
            None => {}
        }
    }
    let n = fresh.len() as i64;
    let seqs: Vec<i64> = (first_seq..first_seq + n).collect();
    let uids: Vec<&str> = fresh.iter().map(|r| r.0.0.as_str()).collect();
    let roles: Vec<Option<&str>> = fresh.iter().map(|r| r.0.1.as_deref()).collect();
    let contents: Vec<Option<&str>> = fresh.iter().map(|r| r.0.2.as_deref()).collect();
    let items: Vec<&str> = fresh.iter().map(|r| r.0.3.as_str()).collect();
    let created = now_ms();
    let inserted: HashSet<String> = tx
        .query(
            "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
             SELECT $1, u, s, r, c, i, $7 \
             FROM unnest($2::text[], $3::int8[], $4::text[], $5::text[], $6::text[]) AS t(u, s, r, c, i) \
             ON CONFLICT (session_id, uid) DO NOTHING RETURNING uid",
            &[&session, &uids, &seqs, &roles, &contents, &items, &created],
        )?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    if inserted.len() != fresh.len() {
        // Someone stored one of these uids since we looked: compare again.
        let missing: Vec<String> = fresh
            .iter()
            .filter(|r| !inserted.contains(&r.0.0))
            .map(|r| r.0.0.clone())
            .collect();
        let now = stored_rows(&mut tx, session, &missing)?;
        for (row, m) in fresh.iter().filter(|r| !inserted.contains(&r.0.0)) {
            if !now.get(&row.0).is_some_and(|s| super::same_item(s, m)) {
                return Err(Stop::Conflict);
            }
        }
    }
    crate::failpoint::hit("pg.before_commit");
    tx.commit().map_err(Stop::Commit)?;
    cursor.lease_token = Some(token);
    cursor.next_seq = Some(first_seq + n);
    Ok(lsn)
}

fn stored_rows(tx: &mut Transaction<'_>, session: &str, uids: &[String]) -> Result<HashMap<String, Stored>, Stop> {
    Ok(tx
        .query(
            "SELECT uid, item FROM messages WHERE session_id = $1 AND uid = ANY($2)",
            &[&session, &uids],
        )?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// Which of `uids` are stored for `session`, in the order asked.
pub(super) fn stored_uids(client: &mut Client, session: &str, uids: &[String]) -> Result<Vec<String>, postgres::Error> {
    let stored: HashSet<String> = client
        .query(
            "SELECT uid FROM messages WHERE session_id = $1 AND uid = ANY($2)",
            &[&session, &uids],
        )?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    Ok(uids.iter().filter(|u| stored.contains(*u)).cloned().collect())
}

/// Take, or confirm and renew, the session's turn lease, holding the
/// session row locked until the transaction ends. The row is inserted at
/// the first batch (or when the policy said `recreate_session`); a row
/// that vanished after our first batch is left missing, so the insert
/// fails on the foreign key and the policy decides. Also returns the
/// server's WAL position, read in the same statement (no round trip of its
/// own), for the handle's server check.
fn take_lease(
    tx: &mut Transaction<'_>,
    session: &str,
    cursor: &Cursor,
    recreate: bool,
    lease: &Lease,
    generation: &str,
) -> Result<(String, Option<i64>), Stop> {
    let now = now_ms();
    let expires = now + lease.ttl_ms;
    for _ in 0..2 {
        // The session row, locked, and the database's generation: is this
        // still the database the handle opened?
        let row = tx.query_opt(
            "SELECT (SELECT value FROM state_meta WHERE key = 'generation'), s.lease_token, s.lease_expires_ms, \
             (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8 \
             FROM sessions s WHERE s.id = $1 FOR UPDATE OF s",
            &[&session],
        )?;
        let found: Option<String> = match &row {
            Some(r) => r.get(0),
            None => tx
                .query_opt("SELECT value FROM state_meta WHERE key = 'generation'", &[])?
                .map(|r| r.get(0)),
        };
        if found.as_deref() != Some(generation) {
            return Err(Stop::Replaced(found.unwrap_or_default()));
        }
        let lsn: Option<i64> = row.as_ref().map(|r| r.get(3));
        let row: Option<(Option<String>, Option<i64>)> = row.map(|r| (r.get(1), r.get(2)));
        let ours = cursor.lease_token.clone();
        match (row, ours) {
            (Some((Some(t), held_until)), Some(mine)) if t == mine => {
                // Still ours. Renewed once half its time has passed, not
                // with every batch, as the SQLite store does.
                if held_until.is_none_or(|e| e - now < lease.ttl_ms - lease.ttl_ms / 2) {
                    tx.execute(
                        "UPDATE sessions SET lease_expires_ms = $2 WHERE id = $1",
                        &[&session, &expires],
                    )?;
                }
                return Ok((mine, lsn));
            }
            // We held the lease and someone else took it: fenced.
            (Some(_), Some(_)) => return Err(Stop::LeaseLost),
            (Some((token, exp)), None) => {
                if token.is_some() && exp.is_some_and(|e| e > now) {
                    return Err(Stop::LeaseLost);
                }
                let mine = mint_id();
                tx.execute(
                    "UPDATE sessions SET lease_token = $2, lease_holder = $3, lease_expires_ms = $4 WHERE id = $1",
                    &[&session, &mine, &lease.holder, &expires],
                )?;
                return Ok((mine, lsn));
            }
            (None, Some(mine)) if !recreate => return Ok((mine, lsn)),
            (None, ours) => {
                let mine = ours.unwrap_or_else(mint_id);
                let n = tx.execute(
                    "INSERT INTO sessions(id, created_ms, lease_token, lease_holder, lease_expires_ms) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                    &[&session, &now, &mine, &lease.holder, &expires],
                )?;
                if n == 1 {
                    return Ok((mine, lsn));
                }
                // Another writer created the row meanwhile: look again.
            }
        }
    }
    Err(Stop::LeaseLost)
}
