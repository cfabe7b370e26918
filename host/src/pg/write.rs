//! One attempt at writing a group of batches to PostgreSQL: a single
//! transaction, one COMMIT (one WAL flush) for every batch in it.
//!
//! In PostgreSQL any error aborts the whole transaction unless it happened
//! inside a savepoint, so what one batch alone may fail on is either
//! decided before anything is written, or written inside a savepoint:
//! - The sessions' rows are locked in one statement
//!   (`FOR UPDATE SKIP LOCKED`, in id order), their leases taken or renewed
//!   in one `UPDATE`, and missing rows inserted in one `INSERT`. A session
//!   whose row another transaction holds, or that another writer created
//!   meanwhile, is locked on its own inside a savepoint, so a
//!   `lock_timeout` (55P03) fails only its batches.
//! - A fenced lease, and a uid stored with different content (read for
//!   every batch in one statement), fail their batch before any insert.
//! - Every batch's messages go in one `INSERT ... ON CONFLICT DO NOTHING`
//!   inside a savepoint. If it fails, or did not insert every row (another
//!   writer stored one of these uids meanwhile), it is rolled back to the
//!   savepoint and each batch is written again in its own savepoint, so
//!   only the batch at fault fails.
//!
//! A failure no savepoint contains fails the whole group: the policy says
//! which (`failure_scope`: the connection lost, the server shutting down,
//! out of space, a serialization failure or deadlock, a failed COMMIT;
//! never a lock wait that timed out, 55P03). Nothing is half committed,
//! and each batch settles as the policy says.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use postgres::{Client, Statement, Transaction};
use turnsafe_policy::machine::WritePlan;

use super::tx::TxRules;
use crate::backend::{Cursor, Flush, Lease};
use crate::ids::{mint, now_ms};
use crate::lease_proof::{Judged, Proof, judge};
use turnsafe_policy::{LeaseHolder, ServerProbe};

pub(super) enum Stop {
    Client(postgres::Error),
    /// COMMIT was sent and did not answer success: a lost connection
    /// leaves the batch's fate unknown until its uids are looked up.
    Commit(postgres::Error),
    /// A uid of the batch is stored with different content.
    Conflict,
    /// Another writer holds this session's turn lease (named, when its
    /// row names it).
    LeaseLost(Option<Box<LeaseHolder>>),
    /// The database's generation is not the one the handle opened.
    Replaced(String),
    /// A failure already in the policy's terms (one statement's error,
    /// shared by every batch of a session).
    Failed(Box<turnsafe_policy::machine::Failure>),
}

impl From<postgres::Error> for Stop {
    fn from(e: postgres::Error) -> Self {
        Stop::Client(e)
    }
}

/// The write path's statements, prepared once per connection: a query
/// sent as text is prepared first, a round trip of its own every time.
/// Cleared whenever the handle connects again (a statement belongs to the
/// connection that prepared it).
#[derive(Default)]
pub(super) struct Prepared(HashMap<&'static str, Statement>);

impl Prepared {
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    fn get(&mut self, tx: &mut Transaction<'_>, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.0.get(sql) {
            return Ok(s.clone());
        }
        let s = tx.prepare(sql)?;
        self.0.insert(sql, s.clone());
        Ok(s)
    }
}

/// What one transaction did.
pub(super) struct Written {
    /// A failure that ended the transaction: nothing of it is stored.
    pub group: Option<Stop>,
    /// Each batch's own failure, in order.
    pub each: Vec<Option<Stop>>,
}

/// A message of the batch as it is inserted.
struct Row<'a> {
    batch: usize,
    session: &'a str,
    message: &'a crate::message::Message,
    uid: &'a str,
    seq: i64,
    role: Option<String>,
    content: Option<String>,
    item: String,
}

/// Write `batches` in one transaction. `cursors` are the sessions' cursors
/// as committed; they move only when the COMMIT succeeds. `promised` gives,
/// for a session this handle holds no lease on, the first seq its diverted
/// lines leave free.
pub(super) fn write_group(
    client: &mut Client,
    prepared: &mut Prepared,
    batches: &[(&Flush<'_>, WritePlan)],
    cursors: &mut HashMap<String, Cursor>,
    lease: &Lease,
    rules: TxRules<'_>,
    promised: &dyn Fn(&str) -> Option<i64>,
) -> Written {
    let n = batches.len();
    let mut each: Vec<Option<Stop>> = (0..n).map(|_| None).collect();
    let mut pending: HashMap<String, Cursor> = HashMap::new();
    let result = (|| -> Result<(), Stop> {
        // The level is set by the first statement (take_leases), not by a
        // `SET LOCAL` of its own: one round trip less per group.
        let mut tx = client.transaction()?;
        take_leases(
            &mut tx,
            prepared,
            batches,
            cursors,
            lease,
            rules,
            &mut each,
            &mut pending,
        )?;
        let rows = plan_rows(&mut tx, prepared, batches, &mut each, &mut pending, promised)?;
        insert_rows(&mut tx, prepared, batches.len(), &rows, &mut each)?;
        crate::failpoint::hit("pg.before_commit");
        tx.commit().map_err(Stop::Commit)?;
        crate::failpoint::hit("pg.after_commit");
        Ok(())
    })();
    match result {
        Ok(()) => {
            cursors.extend(pending);
            Written { group: None, each }
        }
        Err(stop) => Written {
            group: Some(stop),
            each,
        },
    }
}

/// Lock every session's row, check the database's generation, and take or
/// renew each lease. Sessions whose lease another writer holds get
/// [`Stop::LeaseLost`] in `each`; the others' cursors, with their lease
/// token, go to `pending`.
#[allow(clippy::too_many_arguments)]
fn take_leases(
    tx: &mut Transaction<'_>,
    prepared: &mut Prepared,
    batches: &[(&Flush<'_>, WritePlan)],
    cursors: &HashMap<String, Cursor>,
    lease: &Lease,
    rules: TxRules<'_>,
    each: &mut [Option<Stop>],
    pending: &mut HashMap<String, Cursor>,
) -> Result<(), Stop> {
    let sessions: BTreeSet<&str> = batches.iter().map(|(f, _)| f.session.as_str()).collect();
    let recreate: HashSet<&str> = batches
        .iter()
        .filter(|(_, p)| p.recreate_session)
        .map(|(f, _)| f.session.as_str())
        .collect();
    let ids: Vec<&str> = sessions.iter().copied().collect();
    // The generation always comes back (the left side is one row), and
    // with it the transaction's `synchronous_commit` is set, as `SET LOCAL`
    // would (`sync`, referenced so it is always evaluated); the sessions'
    // rows that no other transaction holds come locked, in id order, so two
    // groups never wait on each other in a cycle.
    let lock = prepared.get(
        tx,
        concat!(
            "SELECT g.value, s.id, s.lease_token, s.lease_expires_ms, s.lease_holder, g.sync \
             FROM (SELECT (SELECT value FROM state_meta WHERE key = 'generation') AS value, ",
            super::tx::set_level_sql!(2),
            " AS sync) g \
             LEFT JOIN LATERAL (SELECT id, lease_token, lease_expires_ms, lease_holder FROM sessions \
                 WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED) s ON true"
        ),
    )?;
    let found = tx.query(&lock, &[&ids, &rules.sync_level])?;
    let found_generation: Option<String> = found.first().and_then(|r| r.get(0));
    if found_generation.as_deref() != Some(rules.generation) {
        return Err(Stop::Replaced(found_generation.unwrap_or_default()));
    }
    let locked: BTreeMap<String, LeaseRow> = found
        .iter()
        .filter_map(|r| Some((r.get::<_, Option<String>>(1)?, (r.get(2), r.get(3), r.get(4)))))
        .collect();

    let now = now_ms();
    let expires = now.saturating_add(lease.ttl_ms);
    let mut set: Vec<(String, String)> = Vec::new();
    let mut create: Vec<(String, String)> = Vec::new();
    let mut alone: Vec<&str> = Vec::new();
    let mut fenced: Vec<(&str, Option<Box<LeaseHolder>>)> = Vec::new();
    for &id in &ids {
        let ours = cursors.get(id).and_then(|c| c.lease_token.clone());
        let decided = match locked.get(id) {
            Some(row) => decide(tx, id, row, ours, now, lease)?,
            // Missing, or held by another transaction: a session new to
            // this handle is tried in one insert, and what that cannot
            // settle (and every session we wrote before) alone.
            None if ours.is_none() || recreate.contains(id) => Decision::Create(ours.unwrap_or_else(mint)),
            None => Decision::Alone,
        };
        match decided {
            Decision::Keep(token) => keep(pending, cursors, id, token),
            Decision::Set(token) => {
                set.push((id.to_string(), token.clone()));
                keep(pending, cursors, id, token);
            }
            Decision::Create(token) => create.push((id.to_string(), token)),
            Decision::Fenced(holder) => fenced.push((id, holder)),
            Decision::Alone => alone.push(id),
        }
    }
    if !set.is_empty() {
        let (set_ids, tokens): (Vec<String>, Vec<String>) = set.into_iter().unzip();
        let renew = prepared.get(
            tx,
            "UPDATE sessions s SET lease_token = v.t, lease_holder = $3, lease_expires_ms = $4 \
             FROM unnest($1::text[], $2::text[]) AS v(id, t) WHERE s.id = v.id",
        )?;
        tx.execute(&renew, &[&set_ids, &tokens, &lease.holder, &expires])?;
    }
    if !create.is_empty() {
        let (new_ids, tokens): (Vec<String>, Vec<String>) = create.iter().cloned().unzip();
        let made: HashSet<String> = tx
            .query(
                "INSERT INTO sessions(id, created_ms, lease_token, lease_holder, lease_expires_ms) \
                 SELECT v.id, $3, v.t, $4, $5 FROM unnest($1::text[], $2::text[]) AS v(id, t) \
                 ON CONFLICT (id) DO NOTHING RETURNING id",
                &[&new_ids, &tokens, &now, &lease.holder, &expires],
            )?
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        for (id, token) in create {
            if made.contains(&id) {
                keep(pending, cursors, &id, token);
            } else if let Some(&known) = ids.iter().find(|s| **s == id) {
                // Another writer created the row meanwhile.
                alone.push(known);
            }
        }
    }
    for id in alone {
        let ours = cursors.get(id).and_then(|c| c.lease_token.clone());
        let in_savepoint = (|| -> Result<Result<String, Stop>, postgres::Error> {
            let mut sp = tx.savepoint("turnsafe_lease")?;
            match take_lease(&mut sp, id, ours.clone(), recreate.contains(id), lease) {
                Ok(token) => {
                    sp.commit()?;
                    Ok(Ok(token))
                }
                Err(Stop::Client(e)) if !super::translate::ends_transaction(&e) => {
                    sp.rollback()?;
                    Ok(Err(Stop::Failed(Box::new(super::translate::failure(
                        &super::translate::Fault::Client(&e),
                        0,
                    )))))
                }
                Err(stop) => {
                    sp.rollback()?;
                    Ok(Err(stop))
                }
            }
        })();
        match in_savepoint {
            Ok(Ok(token)) => keep(pending, cursors, id, token),
            Ok(Err(Stop::Failed(f))) => fail_session(batches, each, id, || Stop::Failed(f.clone())),
            Ok(Err(Stop::LeaseLost(holder))) => fenced.push((id, holder)),
            Ok(Err(other)) => return Err(other),
            // The savepoint itself failed: the connection is gone.
            Err(e) => return Err(Stop::Client(e)),
        }
    }
    for (id, holder) in fenced {
        fail_session(batches, each, id, || Stop::LeaseLost(holder.clone()));
    }
    Ok(())
}

/// A session row's lease: its token, expiry and holder (with its proof).
type LeaseRow = (Option<String>, Option<i64>, Option<String>);

enum Decision {
    /// Ours, as it is.
    Keep(String),
    /// Ours once the row says this token (and this writer's proof).
    Set(String),
    /// The row is inserted with this token.
    Create(String),
    /// Another writer holds the lease (named, when the row names it).
    Fenced(Option<Box<LeaseHolder>>),
    /// Locked on its own, in a savepoint.
    Alone,
}

/// What to do with a session's lease, from its locked row. A lease another
/// holder has ends on its expiry, or on the policy's word that its holder
/// is gone: its process (seen from this machine) or its server backend
/// (seen in `pg_stat_activity`).
fn decide(
    tx: &mut Transaction<'_>,
    session: &str,
    (token, held_until, stored): &LeaseRow,
    ours: Option<String>,
    now: i64,
    lease: &Lease,
) -> Result<Decision, postgres::Error> {
    Ok(match (token.as_deref(), ours) {
        (Some(t), Some(mine)) if t == mine => {
            // Still ours. Renewed once half its time has passed, not with
            // every batch, as the SQLite store does; and at once after a
            // reconnect, so the row names the backend this writer has now.
            let half_gone = held_until.is_none_or(|e| e - now < lease.ttl_ms - lease.ttl_ms / 2);
            if half_gone || stored.as_deref() != Some(lease.holder.as_str()) {
                Decision::Set(mine)
            } else {
                Decision::Keep(mine)
            }
        }
        // We held the lease and someone else took it: fenced.
        (token, Some(_)) => {
            Decision::Fenced(token.map(|_| Box::new(Proof::read(stored.as_deref()).holder(*held_until))))
        }
        (token, None) => {
            let proof = Proof::read(stored.as_deref());
            let server = match token {
                Some(_) => backend_probe(tx, &proof)?,
                None => ServerProbe::Unrecorded,
            };
            match judge(session, stored.as_deref(), token.and(*held_until), now, server) {
                Judged::Take(_) => Decision::Set(mint()),
                Judged::Fenced(holder) => Decision::Fenced(Some(holder)),
            }
        }
    })
}

/// Whether the server still runs the backend a lease's holder recorded:
/// the same pid with the same start time. Read once per transaction (the
/// server keeps one snapshot of its activity for it).
pub(super) fn backend_probe(tx: &mut Transaction<'_>, proof: &Proof) -> Result<ServerProbe, postgres::Error> {
    let (Some(pid), Some(start)) = (proof.backend_pid, proof.backend_start) else {
        return Ok(ServerProbe::Unrecorded);
    };
    let row = tx.query_opt(
        "SELECT (EXTRACT(EPOCH FROM backend_start) * 1000000)::int8 FROM pg_stat_activity WHERE pid = $1",
        &[&pid],
    )?;
    Ok(match row.map(|r| r.get::<_, Option<i64>>(0)) {
        None => ServerProbe::Gone,
        // Another role's backend whose start the server will not show.
        Some(None) => ServerProbe::Unknown,
        Some(Some(s)) if s == start => ServerProbe::Alive,
        // The pid belongs to a newer backend now.
        Some(Some(_)) => ServerProbe::Gone,
    })
}

fn keep(pending: &mut HashMap<String, Cursor>, cursors: &HashMap<String, Cursor>, id: &str, token: String) {
    let cursor = pending
        .entry(id.to_string())
        .or_insert_with(|| cursors.get(id).cloned().unwrap_or_default());
    cursor.lease_token = Some(token);
}

fn fail_session(batches: &[(&Flush<'_>, WritePlan)], each: &mut [Option<Stop>], id: &str, stop: impl Fn() -> Stop) {
    for (k, (f, _)) in batches.iter().enumerate() {
        if f.session.as_str() == id && each[k].is_none() {
            each[k] = Some(stop());
        }
    }
}

/// The rows to insert, with their seqs; a batch with a uid stored with
/// different content fails alone here, before anything is written.
fn plan_rows<'a>(
    tx: &mut Transaction<'_>,
    prepared: &mut Prepared,
    batches: &[(&'a Flush<'a>, WritePlan)],
    each: &mut [Option<Stop>],
    pending: &mut HashMap<String, Cursor>,
    promised: &dyn Fn(&str) -> Option<i64>,
) -> Result<Vec<Row<'a>>, Stop> {
    let live: Vec<usize> = (0..batches.len()).filter(|&k| each[k].is_none()).collect();
    if live.is_empty() {
        return Ok(Vec::new());
    }
    let (mut q_sessions, mut q_uids): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    for &k in &live {
        let f = batches[k].0;
        for uid in &f.uids {
            q_sessions.push(f.session.as_str());
            q_uids.push(uid);
        }
    }
    let lookup = prepared.get(
        tx,
        "SELECT m.session_id, m.uid, m.item FROM messages m \
         JOIN unnest($1::text[], $2::text[]) AS q(s, u) ON m.session_id = q.s AND m.uid = q.u",
    )?;
    let stored: HashMap<(String, String), String> = tx
        .query(&lookup, &[&q_sessions, &q_uids])?
        .into_iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    let ids: Vec<&str> = live
        .iter()
        .map(|&k| batches[k].0.session.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Each session's last seq from the index, one backward step each: a
    // `MAX(seq) ... WHERE session_id = ANY($1) GROUP BY` reads every row
    // of those sessions, so a group's cost grew with their length.
    let tails = prepared.get(
        tx,
        "SELECT q.s, (SELECT m.seq FROM messages m WHERE m.session_id = q.s ORDER BY m.seq DESC LIMIT 1) + 1 \
         FROM unnest($1::text[]) AS q(s)",
    )?;
    let mut next: HashMap<String, i64> = tx
        .query(&tails, &[&ids])?
        .into_iter()
        .filter_map(|r| Some((r.get(0), r.get::<_, Option<i64>>(1)?)))
        .collect();
    for id in &ids {
        let stored_next = next.get(*id).copied().unwrap_or(1);
        let cursor = pending.entry(id.to_string()).or_default();
        // A handle about to take the lease learns which seqs diverted lines
        // already hold, so it never commits over them.
        let known = match cursor.next_seq {
            Some(k) => Some(k),
            None => promised(id),
        };
        next.insert(id.to_string(), known.map_or(stored_next, |k| k.max(stored_next)));
    }
    let mut rows = Vec::new();
    let mut in_group: HashSet<(&str, &str)> = HashSet::new();
    for &k in &live {
        let f = batches[k].0;
        let session = f.session.as_str();
        let mut fresh = Vec::new();
        let mut conflict = false;
        for (m, uid) in f.messages.iter().zip(&f.uids) {
            match stored.get(&(session.to_string(), uid.clone())) {
                Some(s) if !super::same_item(s, m) => conflict = true,
                Some(_) => {}
                None if in_group.insert((session, uid)) => fresh.push((m, uid.as_str())),
                None => {}
            }
        }
        if conflict {
            // Its rows are not written; the uids it took are free again.
            for (_, uid) in &fresh {
                in_group.remove(&(session, *uid));
            }
            each[k] = Some(Stop::Conflict);
            continue;
        }
        let seq = next.entry(session.to_string()).or_insert(1);
        for (m, uid) in fresh {
            rows.push(Row {
                batch: k,
                session,
                message: m,
                uid,
                seq: *seq,
                role: m.role().map(String::from),
                content: m.content_text(),
                item: m.item_text(),
            });
            *seq += 1;
        }
    }
    for (id, seq) in next {
        if let Some(c) = pending.get_mut(&id) {
            c.next_seq = Some(seq);
        }
    }
    Ok(rows)
}

/// Insert every row in one statement inside a savepoint; if that fails or
/// misses a row, each batch again in its own savepoint.
fn insert_rows(
    tx: &mut Transaction<'_>,
    prepared: &mut Prepared,
    n: usize,
    rows: &[Row<'_>],
    each: &mut [Option<Stop>],
) -> Result<(), Stop> {
    if rows.is_empty() {
        return Ok(());
    }
    let batches: BTreeSet<usize> = rows.iter().map(|r| r.batch).collect();
    if n == 1 || batches.len() == 1 {
        // One batch: its failure is the transaction's.
        let missed = insert(tx, prepared, rows)?;
        return if missed.is_empty() { Ok(()) } else { Err(Stop::Conflict) };
    }
    let together = (|| -> Result<bool, postgres::Error> {
        let mut sp = tx.savepoint("turnsafe_group")?;
        match insert(&mut sp, prepared, rows) {
            Ok(missed) if missed.is_empty() => {
                sp.commit()?;
                Ok(true)
            }
            Ok(_) => {
                sp.rollback()?;
                Ok(false)
            }
            Err(e) if !super::translate::ends_transaction(&e) => {
                sp.rollback()?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    })()?;
    if together {
        return Ok(());
    }
    tracing::debug!("a group insert failed; each batch on its own");
    for k in batches {
        let own: Vec<&Row<'_>> = rows.iter().filter(|r| r.batch == k).collect();
        let mut sp = tx.savepoint("turnsafe_batch")?;
        match insert_refs(&mut sp, prepared, &own) {
            Ok(missed) if missed.is_empty() => sp.commit()?,
            Ok(_) => {
                sp.rollback()?;
                each[k] = Some(Stop::Conflict);
            }
            Err(e) if !super::translate::ends_transaction(&e) => {
                sp.rollback()?;
                each[k] = Some(Stop::Client(e));
            }
            Err(e) => return Err(Stop::Client(e)),
        }
    }
    Ok(())
}

fn insert(
    tx: &mut Transaction<'_>,
    prepared: &mut Prepared,
    rows: &[Row<'_>],
) -> Result<Vec<(String, String)>, postgres::Error> {
    let refs: Vec<&Row<'_>> = rows.iter().collect();
    insert_refs(tx, prepared, &refs)
}

/// Insert `rows`; returns the `(session, uid)` of each row not inserted
/// because the uid was stored meanwhile with other content. A uid stored
/// meanwhile with the same content counts as stored.
fn insert_refs(
    tx: &mut Transaction<'_>,
    prepared: &mut Prepared,
    rows: &[&Row<'_>],
) -> Result<Vec<(String, String)>, postgres::Error> {
    let sessions: Vec<&str> = rows.iter().map(|r| r.session).collect();
    let uids: Vec<&str> = rows.iter().map(|r| r.uid).collect();
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    let roles: Vec<Option<&str>> = rows.iter().map(|r| r.role.as_deref()).collect();
    let contents: Vec<Option<&str>> = rows.iter().map(|r| r.content.as_deref()).collect();
    let items: Vec<&str> = rows.iter().map(|r| r.item.as_str()).collect();
    let created = now_ms();
    let statement = prepared.get(
        tx,
        "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
         SELECT s, u, q, r, c, i, $7 \
         FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::text[]) \
             AS t(s, u, q, r, c, i) \
         ON CONFLICT (session_id, uid) DO NOTHING RETURNING session_id, uid",
    )?;
    let inserted: HashSet<(String, String)> = tx
        .query(
            &statement,
            &[&sessions, &uids, &seqs, &roles, &contents, &items, &created],
        )?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if inserted.len() == rows.len() {
        return Ok(Vec::new());
    }
    // Someone stored one of these uids since we looked: compare again.
    let mut missed = Vec::new();
    for r in rows {
        if inserted.contains(&(r.session.to_string(), r.uid.to_string())) {
            continue;
        }
        let now: Option<String> = tx
            .query_opt(
                "SELECT item FROM messages WHERE session_id = $1 AND uid = $2",
                &[&r.session, &r.uid],
            )?
            .map(|row| row.get(0));
        if !now.is_some_and(|s| super::same_item(&s, r.message)) {
            missed.push((r.session.to_string(), r.uid.to_string()));
        }
    }
    Ok(missed)
}

/// Lock one session's row (waiting at most `lock_timeout`) and take, or
/// confirm and renew, its lease. The row is inserted when missing (or when
/// the policy said `recreate_session`); a row that vanished after our first
/// batch is left missing, so the insert fails on the foreign key and the
/// policy decides.
fn take_lease(
    tx: &mut Transaction<'_>,
    session: &str,
    ours: Option<String>,
    recreate: bool,
    lease: &Lease,
) -> Result<String, Stop> {
    let now = now_ms();
    let expires = now.saturating_add(lease.ttl_ms);
    for _ in 0..2 {
        let row: Option<LeaseRow> = tx
            .query_opt(
                "SELECT lease_token, lease_expires_ms, lease_holder FROM sessions WHERE id = $1 FOR UPDATE",
                &[&session],
            )?
            .map(|r| (r.get(0), r.get(1), r.get(2)));
        match row {
            Some(row) => {
                return match decide(tx, session, &row, ours, now, lease)? {
                    Decision::Keep(mine) => Ok(mine),
                    Decision::Set(mine) => {
                        tx.execute(
                            "UPDATE sessions SET lease_token = $2, lease_holder = $3, lease_expires_ms = $4 \
                             WHERE id = $1",
                            &[&session, &mine, &lease.holder, &expires],
                        )?;
                        Ok(mine)
                    }
                    Decision::Fenced(holder) => Err(Stop::LeaseLost(holder)),
                    Decision::Create(_) | Decision::Alone => Err(Stop::LeaseLost(None)),
                };
            }
            None if ours.is_some() && !recreate => return Ok(ours.unwrap_or_default()),
            None => {
                let mine = ours.clone().unwrap_or_else(mint);
                let n = tx.execute(
                    "INSERT INTO sessions(id, created_ms, lease_token, lease_holder, lease_expires_ms) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                    &[&session, &now, &mine, &lease.holder, &expires],
                )?;
                if n == 1 {
                    return Ok(mine);
                }
                // Another writer created the row meanwhile: look again.
            }
        }
    }
    Err(Stop::LeaseLost(None))
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

/// Whether every one of `messages` is stored for `session` under its uid
/// (`uids`, in the same order) with its own bytes ([`crate::same`]): the
/// lookup after a lost COMMIT.
pub(super) fn stored_same(
    client: &mut Client,
    session: &str,
    uids: &[String],
    messages: &[crate::message::Message],
) -> Result<bool, postgres::Error> {
    if uids.len() != messages.len() {
        return Ok(false);
    }
    let stored: std::collections::HashMap<String, String> = client
        .query(
            "SELECT uid, item FROM messages WHERE session_id = $1 AND uid = ANY($2)",
            &[&session, &uids],
        )?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(uids
        .iter()
        .zip(messages)
        .all(|(u, m)| stored.get(u).is_some_and(|s| super::same_item(s, m))))
}
