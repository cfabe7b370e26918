//! The flush of a group of batches: one policy flush machine per batch,
//! all reading and changing the handle's one [`HandleState`], and one
//! transaction for every batch that asks to write.
//!
//! Each round polls every machine still running and performs one kind of
//! effect for all the machines that ask for it, in this order:
//! - open: once, its result fed to every machine waiting on it;
//! - capture: once per handle, its receipt (or its failure) fed to each;
//! - divert: one per batch, each with its own receipt;
//! - write: one transaction for all of them, each batch in its own
//!   savepoint (see [`super::write`]);
//! - wait: the longest wait asked for, then every waiting machine goes on.
//!
//! A batch done with the database (diverting, say) never waits for another
//! batch's retry, and no machine reaches [`Step::Done`] as committed before
//! the COMMIT that made its batch durable.

use std::time::{Duration, Instant};

use turnsafe_policy::Cause;
use turnsafe_policy::machine::{Event, FlushMachine, FlushReport, FlushStart, HandleState, Step, WritePlan};

use super::{Artifacts, Flush, OpenFailure, SessionId, SessionStore, failure_of, failure_of_write};
use crate::capture::CaptureError;
use crate::divert;
use crate::message::Message;
use crate::outcome::FlushOutcome;

/// The most batches one transaction commits together.
pub const GROUP_MAX_BATCHES: usize = 64;
/// The most message bytes (as JSON text) one transaction commits together;
/// a single larger batch is still committed, alone.
pub const GROUP_MAX_BYTES: usize = 1 << 20;

/// One batch of a group, from its start to its outcome.
pub(super) struct Member<'a> {
    flush: Flush<'a>,
    machine: FlushMachine,
    made: Artifacts,
    outcome: Option<FlushOutcome>,
}

impl<'a> Member<'a> {
    fn new(
        session: &'a SessionId,
        messages: &'a [Message],
        handle: &HandleState,
        holds: &[crate::captures::Hold],
        durability: turnsafe_policy::Durability,
    ) -> Member<'a> {
        let started = Instant::now();
        let (uids, minted) = crate::message::uids_minting(messages);
        let pending_capture =
            holds
                .iter()
                .find(|h| h.holds(session.as_str()))
                .map(|h| turnsafe_policy::machine::PendingCapture {
                    path: h.path.clone(),
                    cause: h.cause,
                });
        let start = FlushStart {
            session: session.as_str().to_string(),
            uids: uids.clone(),
            minted_uids: minted,
            seed: super::random_u64(),
            pending_capture,
            durability,
        };
        Member {
            flush: Flush {
                session,
                messages,
                uids,
                started,
            },
            machine: FlushMachine::new(start, handle),
            made: Artifacts::default(),
            outcome: None,
        }
    }

    /// The batch's outcome; a flush that never reached its end (a machine
    /// that refused an event) hands the batch back.
    pub(super) fn finish(self) -> FlushOutcome {
        match self.outcome {
            Some(outcome) => outcome,
            None => self.made.into_outcome(self.machine.abandon()),
        }
    }

    fn settle(&mut self, report: FlushReport) {
        tracing::debug!(
            session = self.flush.session.as_str(),
            persisted = report.persisted,
            cause = ?report.cause.map(|c| c.label()),
            action = ?report.action.map(|a| a.label()),
            attempts = report.attempts,
            "flush done"
        );
        self.outcome = Some(std::mem::take(&mut self.made).into_outcome(report));
    }

    /// Feed back what the step did.
    fn feed(&mut self, handle: &mut HandleState, event: Event) {
        if let Event::Failed(f) = &event {
            self.made.failure = Some(f.clone());
        }
        if let Err(e) = self.machine.handle(handle, event) {
            tracing::error!(error = %e, "the flush machine refused an event; the batch is handed back");
            let report = self.machine.clone().abandon();
            self.outcome = Some(std::mem::take(&mut self.made).into_outcome(report));
        }
    }
}

/// Whether every one of `uids` is stored for `session`.
pub(super) fn all_stored(conn: &rusqlite::Connection, session: &str, uids: &[String]) -> rusqlite::Result<bool> {
    let mut stmt = conn.prepare_cached("SELECT 1 FROM messages WHERE session_id = ?1 AND uid = ?2")?;
    for uid in uids {
        if !stmt.exists(rusqlite::params![session, uid])? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What the machines asked for in one round.
#[derive(Default)]
struct Round {
    open: Vec<usize>,
    capture: Vec<usize>,
    divert: Vec<(usize, Cause)>,
    write: Vec<(usize, WritePlan)>,
    resolve: Vec<usize>,
    wait: Vec<usize>,
    wait_ms: u64,
}

impl SessionStore {
    /// Flush several batches at once, each under its own flush machine and
    /// with its own outcome (in the order given). Batches that write are
    /// committed together, with one sync: a failure of one batch alone (a
    /// uid conflict, a lost lease) fails only that batch; a failure that
    /// ends the transaction is every batch's failure, and each then
    /// settles as the policy says. No batch is ever half committed.
    pub fn append_group(&mut self, batches: &[(&SessionId, &[Message])]) -> Vec<FlushOutcome> {
        let holds = self.pending_holds();
        let mut members: Vec<Member<'_>> = batches
            .iter()
            .map(|&(session, messages)| {
                Member::new(
                    session,
                    messages,
                    &self.handle,
                    &holds,
                    self.opts.synchronous.durability(),
                )
            })
            .collect();
        self.run_group(&mut members);
        members.into_iter().map(Member::finish).collect()
    }

    /// The outcome of a batch that never ran: handed back whole, cause
    /// `unknown`.
    pub(crate) fn handed_back(&self, session: &SessionId, messages: &[Message]) -> FlushOutcome {
        self.member(session, messages).finish()
    }

    /// A member for one batch, started on this handle.
    pub(super) fn member<'a>(&self, session: &'a SessionId, messages: &'a [Message]) -> Member<'a> {
        Member::new(
            session,
            messages,
            &self.handle,
            &self.pending_holds(),
            self.opts.synchronous.durability(),
        )
    }

    /// The unsettled captures under the home that hold some session's
    /// rows, read before every group: a capture another process made since
    /// the last group counts at once.
    pub fn pending_holds(&self) -> Vec<crate::captures::Hold> {
        match crate::captures::holds(&self.home) {
            Ok(h) => h,
            Err(e) => {
                // The open that follows meets whatever keeps the home from
                // being read, and fails with its own cause.
                tracing::warn!(error = %e, "cannot list the home's captures");
                Vec::new()
            }
        }
    }

    /// Drive every member's machine to its outcome.
    pub(super) fn run_group(&mut self, members: &mut [Member<'_>]) {
        loop {
            let mut round = Round::default();
            for (i, m) in members.iter_mut().enumerate() {
                if m.outcome.is_some() {
                    continue;
                }
                match m.machine.poll(&self.handle) {
                    Step::Done(report) => m.settle(*report),
                    Step::Open => round.open.push(i),
                    Step::Capture => round.capture.push(i),
                    Step::Divert { cause } => round.divert.push((i, cause)),
                    Step::Write(plan) => round.write.push((i, plan)),
                    Step::Resolve => round.resolve.push(i),
                    Step::Wait { ms } => {
                        round.wait.push(i);
                        round.wait_ms = round.wait_ms.max(ms);
                    }
                }
            }
            let events = if !round.open.is_empty() {
                self.open_for(members, &round.open)
            } else if !round.capture.is_empty() {
                self.capture_for(members, &round.capture)
            } else if !round.divert.is_empty() {
                round
                    .divert
                    .iter()
                    .map(|&(i, cause)| {
                        let m = &mut members[i];
                        (i, self.perform_divert(&m.flush, cause, &mut m.made))
                    })
                    .collect()
            } else if !round.resolve.is_empty() {
                round
                    .resolve
                    .iter()
                    .map(|&i| (i, self.resolve(&members[i].flush)))
                    .collect()
            } else if !round.write.is_empty() {
                self.write_for(members, &round.write)
            } else if !round.wait.is_empty() {
                std::thread::sleep(Duration::from_millis(round.wait_ms));
                round
                    .wait
                    .iter()
                    .map(|&i| {
                        let elapsed_ms = members[i].flush.elapsed_ms();
                        (i, Event::Waited { elapsed_ms })
                    })
                    .collect()
            } else {
                return;
            };
            for (i, event) in events {
                members[i].feed(&mut self.handle, event);
            }
        }
    }

    /// Open the store once for every member that waits on it. A failed
    /// open's connection, if SQLite made one, is held until the next open
    /// or the handle's end, so a quarantined file is opened exactly once.
    fn open_for(&mut self, members: &[Member<'_>], waiting: &[usize]) -> Vec<(usize, Event)> {
        let failure = match self.open_failure.take() {
            Some(f) => f,
            None => {
                self.quarantined = None;
                match self.ensure_open() {
                    Ok(()) => return waiting.iter().map(|&i| (i, Event::Opened)).collect(),
                    Err(f) => f,
                }
            }
        };
        let OpenFailure { error, errno, conn } = *failure;
        self.quarantined = conn;
        tracing::warn!(batches = waiting.len(), error = %error, errno = ?errno, "store open failed");
        waiting
            .iter()
            .map(|&i| {
                let elapsed_ms = members[i].flush.elapsed_ms();
                (i, Event::Failed(failure_of(&error, errno, Vec::new(), elapsed_ms)))
            })
            .collect()
    }

    /// Capture the retired generation the handle still holds, once, for
    /// every member that asks.
    fn capture_for(&mut self, members: &mut [Member<'_>], waiting: &[usize]) -> Vec<(usize, Event)> {
        let trigger = waiting
            .first()
            .map(|&i| members[i].made.trigger.clone())
            .unwrap_or_default();
        let evidence = waiting
            .first()
            .and_then(|&i| members[i].made.failure.as_ref())
            .map(|f| f.evidence.clone())
            .unwrap_or_default();
        let result = match self.retire_generation(&trigger, &evidence) {
            Some(result) => result,
            // Already tried by this handle, or no generation was recorded
            // (the guard is off).
            None => match &self.captured {
                Some(result) => result.clone(),
                None => Err(CaptureError {
                    operation: "read",
                    file: None,
                    errno: None,
                    message: "no retired generation is recorded by this handle".into(),
                }),
            },
        };
        waiting
            .iter()
            .map(|&i| {
                members[i].made.capture = Some(result.clone());
                let event = match &result {
                    Ok(receipt) => Event::Captured(receipt.clone()),
                    Err(e) => Event::CaptureFailed {
                        failure: e.to_failure(),
                        error: e.to_string(),
                    },
                };
                (i, event)
            })
            .collect()
    }

    /// One transaction for every member that asks to write.
    fn write_for(&mut self, members: &mut [Member<'_>], writers: &[(usize, WritePlan)]) -> Vec<(usize, Event)> {
        self.counters.append_attempts += 1;
        let batches: Vec<(&Flush<'_>, WritePlan)> =
            writers.iter().map(|&(i, plan)| (&members[i].flush, plan)).collect();
        let result = self.write_group(&batches);
        if result.group.is_none() {
            // Counted by the benches: batches per commit.
            let failed_alone = result.each.iter().filter(|f| f.is_some()).count();
            tracing::debug!(target: "turnsafe::commit", batches = batches.len() - failed_alone, "group committed");
        }
        let events: Vec<(usize, Event)> = writers
            .iter()
            .zip(&result.each)
            .map(|(&(i, _), local)| {
                // The policy's patience counts time without progress: a lock
                // that passed between other writers meanwhile does not spend it.
                let elapsed_ms = self.lock_watch.stalled_ms(members[i].flush.started);
                let failure = match (local, &result.group) {
                    (Some(own), _) => failure_of_write(own, elapsed_ms),
                    (None, Some(all)) => failure_of_write(all, elapsed_ms),
                    (None, None) => return (i, Event::Committed),
                };
                tracing::info!(
                    session = members[i].flush.session.as_str(),
                    code = ?failure.extended_code,
                    errno = ?failure.errno,
                    evidence = ?failure.evidence,
                    msg = %failure.message,
                    whole_group = local.is_none(),
                    "append attempt failed"
                );
                members[i].made.trigger = format!("flush: {}", failure.message);
                (i, Event::Failed(failure))
            })
            .collect();
        events
    }

    /// Whether every uid of the batch is stored. SQLite always knows how
    /// its COMMIT ended, so the machine asks this only of hosts that lost
    /// an answer; it is answered all the same, from the live connection.
    fn resolve(&mut self, flush: &Flush<'_>) -> Event {
        let stored = self
            .connection()
            .map(|conn| all_stored(conn, flush.session.as_str(), &flush.uids));
        match stored {
            Some(Ok(all_stored)) => Event::Resolved { all_stored },
            Some(Err(e)) => Event::Failed(failure_of(&e, None, Vec::new(), flush.elapsed_ms())),
            None => Event::Failed(failure_of(
                &rusqlite::Error::InvalidQuery,
                None,
                Vec::new(),
                flush.elapsed_ms(),
            )),
        }
    }

    /// Append one batch to its session's divert file.
    fn perform_divert(&mut self, flush: &Flush<'_>, cause: Cause, made: &mut Artifacts) -> Event {
        let state = self.sessions.entry(flush.session.as_str().to_string()).or_default();
        self.counters.diverts += 1;
        let (event, error) = divert::divert_step(
            &self.divert_dir,
            flush.session.as_str(),
            flush.messages,
            &flush.uids,
            &mut state.next_seq,
            cause,
        );
        made.divert_error = error;
        event
    }
}
