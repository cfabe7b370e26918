//! The one executor: a group of batches flushed over any [`Backend`], one
//! policy flush machine per batch, all reading and changing the handle's
//! one [`HandleState`], and one transaction for every batch that asks to
//! write.
//!
//! Each round polls every machine still running and performs one kind of
//! effect for all the machines that ask for it, in this order:
//! - open: once, its result fed to every machine waiting on it;
//! - capture: once per handle, its receipt (or its failure) fed to each;
//! - divert: one per batch, each with its own receipt;
//! - resolve: one uid lookup per batch whose COMMIT answer was lost;
//! - write: one transaction for all of them, each batch in its own
//!   savepoint ([`Backend::write_group`]);
//! - wait: the longest wait asked for, then every waiting machine goes on.
//!
//! A batch done with the database (diverting, say) never waits for another
//! batch's retry, and no machine reaches [`Step::Done`] as committed before
//! the COMMIT that made its batch durable. The executor performs steps and
//! feeds back events; it never changes the handle's state itself: a
//! connection lost between flushes is learnt by the machine from the next
//! write's failure (no connection held: `unavailable`, then an open).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use turnsafe_policy::Cause;
use turnsafe_policy::machine::{Event, Failure, FlushMachine, FlushReport, FlushStart, HandleState, Step, WritePlan};

use super::{Backend, Cursor};
use crate::backend::Counters;
use crate::capture::{Capture, CaptureError};
use crate::captures::Hold;
use crate::divert::{self, DivertError};
use crate::graph::GraphBatch;
use crate::ids::SessionId;
use crate::message::Message;
use crate::outcome::FlushOutcome;

/// The most batches one transaction commits together.
pub const GROUP_MAX_BATCHES: usize = 64;
/// The most message bytes (as JSON text) one transaction commits together;
/// a single larger batch is still committed, alone.
pub const GROUP_MAX_BYTES: usize = 1 << 20;

/// What a handle keeps between flushes, whatever the engine.
#[derive(Debug)]
pub struct Ledger {
    /// What the policy's machines know across batches: open or not,
    /// sticky or not, captured or not.
    pub handle: HandleState,
    /// `<home>/sessions/`.
    pub divert_dir: PathBuf,
    /// Each session's lease token and next seq, as committed.
    pub sessions: HashMap<String, Cursor>,
    pub counters: Counters,
}

impl Ledger {
    pub fn new(home: &Path) -> Ledger {
        Ledger {
            handle: HandleState::default(),
            divert_dir: home.join("sessions"),
            sessions: HashMap::new(),
            counters: Counters::default(),
        }
    }

    /// Append one batch to its session's divert file.
    fn divert(&mut self, flush: &Flush<'_>, cause: Cause) -> (Event, Option<DivertError>) {
        let cursor = self.sessions.entry(flush.session.as_str().to_string()).or_default();
        self.counters.diverts += 1;
        if let Some(graph) = flush.graph {
            return divert::divert_graph_step(&self.divert_dir, flush.session.as_str(), graph, cause);
        }
        divert::divert_step(
            &self.divert_dir,
            flush.session.as_str(),
            flush.messages,
            &flush.uids,
            &mut cursor.next_seq,
            cause,
        )
    }
}

/// One batch in flight.
pub struct Flush<'a> {
    pub session: &'a SessionId,
    pub messages: &'a [Message],
    /// A LangGraph checkpoint or writes instead of messages (`messages`
    /// is then empty, and `uids` are the records' keys).
    pub graph: Option<&'a GraphBatch>,
    /// The uid of every message, minted where the caller gave none.
    pub uids: Vec<String>,
    pub started: Instant,
}

impl Flush<'_> {
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What one transaction did with each batch in it.
#[derive(Debug, Default)]
pub struct GroupWrite {
    /// A failure that ended the whole transaction: no batch of it is
    /// stored, and every batch without a failure of its own failed with it.
    pub group: Option<Failure>,
    /// Each batch's own failure (its savepoint rolled back), in order.
    pub each: Vec<Option<Failure>>,
}

impl GroupWrite {
    /// The whole transaction failed with `f`.
    pub fn failed(n: usize, f: Failure) -> GroupWrite {
        GroupWrite {
            group: Some(f),
            each: vec![None; n],
        }
    }
}

/// The host's values of the effects, beside the machine's outcome.
#[derive(Default)]
struct Made {
    divert_error: Option<DivertError>,
    capture: Option<Result<Capture, CaptureError>>,
    /// The failure that asked for a capture, for its manifest.
    trigger: String,
    /// The last failed open or write, as handed to the machine.
    failure: Option<Failure>,
}

impl Made {
    fn into_outcome(self, report: FlushReport) -> FlushOutcome {
        let mut out = FlushOutcome::new(report, self.divert_error, self.capture);
        out.failure = self.failure;
        out
    }
}

/// One batch of a group, from its start to its outcome.
pub struct Member<'a> {
    flush: Flush<'a>,
    machine: FlushMachine,
    made: Made,
    outcome: Option<FlushOutcome>,
}

impl<'a> Member<'a> {
    /// A member for one batch, started on `backend`'s handle.
    pub fn new<B: Backend + ?Sized>(
        backend: &mut B,
        session: &'a SessionId,
        messages: &'a [Message],
        graph: Option<&'a GraphBatch>,
        holds: &[Hold],
    ) -> Member<'a> {
        let started = Instant::now();
        let (uids, minted) = match graph {
            Some(g) => (g.uids(), Vec::new()),
            None => crate::message::uids_minting(messages),
        };
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
            seed: crate::ids::seed(),
            pending_capture,
            durability: backend.durability(),
        };
        Member {
            flush: Flush {
                session,
                messages,
                graph,
                uids,
                started,
            },
            machine: FlushMachine::new(start, &backend.ledger().handle),
            made: Made::default(),
            outcome: None,
        }
    }

    /// The batch's outcome; a flush that never reached its end (a machine
    /// that refused an event) hands the batch back.
    pub fn finish(self) -> FlushOutcome {
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

/// Flush `batches` over `backend`, each with its own outcome, in order.
/// Batches that write are committed together, with one sync: a failure of
/// one batch alone fails only that batch; a failure that ends the
/// transaction is every batch's failure, and each then settles as the
/// policy says. No batch is ever half committed.
pub fn append_group<B: Backend + ?Sized>(backend: &mut B, batches: &[(&SessionId, &[Message])]) -> Vec<FlushOutcome> {
    let items: Vec<Item<'_>> = batches.iter().map(|&(s, m)| (s, m, None)).collect();
    flush_group(backend, &items)
}

/// One batch of a group: its session, its messages, or a graph batch.
pub type Item<'a> = (&'a SessionId, &'a [Message], Option<&'a GraphBatch>);

/// [`append_group`] for batches of messages and graph batches alike.
pub fn flush_group<B: Backend + ?Sized>(backend: &mut B, batches: &[Item<'_>]) -> Vec<FlushOutcome> {
    let holds = backend.pending_holds();
    let mut members: Vec<Member<'_>> = batches
        .iter()
        .map(|&(session, messages, graph)| Member::new(backend, session, messages, graph, &holds))
        .collect();
    run(backend, &mut members);
    members.into_iter().map(Member::finish).collect()
}

/// Flush one LangGraph checkpoint or one task's writes: committed,
/// diverted with a receipt, or handed back, as for a turn's messages.
pub fn put_graph<B: Backend + ?Sized>(backend: &mut B, graph: &GraphBatch) -> FlushOutcome {
    let session = SessionId::graph(graph.thread_id());
    let mut out = flush_group(backend, &[(&session, &[], Some(graph))]);
    match out.pop() {
        Some(outcome) => outcome,
        None => graph_handed_back(backend, graph),
    }
}

/// The outcome of a graph batch that never ran: handed back, cause `unknown`.
pub fn graph_handed_back<B: Backend + ?Sized>(backend: &mut B, graph: &GraphBatch) -> FlushOutcome {
    let session = SessionId::graph(graph.thread_id());
    let holds = backend.pending_holds();
    Member::new(backend, &session, &[], Some(graph), &holds).finish()
}

/// Flush one batch over `backend`: the one executor, with a group of one.
pub fn append_one<B: Backend + ?Sized>(backend: &mut B, session: &SessionId, messages: &[Message]) -> FlushOutcome {
    match append_group(backend, &[(session, messages)]).pop() {
        Some(outcome) => outcome,
        None => handed_back(backend, session, messages),
    }
}

/// The outcome of a batch that never ran: handed back whole, cause
/// `unknown`.
pub fn handed_back<B: Backend + ?Sized>(backend: &mut B, session: &SessionId, messages: &[Message]) -> FlushOutcome {
    let holds = backend.pending_holds();
    Member::new(backend, session, messages, None, &holds).finish()
}

/// Drive every member's machine to its outcome.
pub fn run<B: Backend + ?Sized>(backend: &mut B, members: &mut [Member<'_>]) {
    loop {
        let mut round = Round::default();
        for (i, m) in members.iter_mut().enumerate() {
            if m.outcome.is_some() {
                continue;
            }
            match m.machine.poll(&backend.ledger().handle) {
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
            open_for(backend, members, &round.open)
        } else if !round.capture.is_empty() {
            capture_for(backend, members, &round.capture)
        } else if !round.divert.is_empty() {
            round
                .divert
                .iter()
                .map(|&(i, cause)| {
                    let m = &mut members[i];
                    let (event, error) = backend.ledger().divert(&m.flush, cause);
                    m.made.divert_error = error;
                    (i, event)
                })
                .collect()
        } else if !round.resolve.is_empty() {
            round
                .resolve
                .iter()
                .map(|&i| (i, resolve(backend, &members[i].flush)))
                .collect()
        } else if !round.write.is_empty() {
            write_for(backend, members, &round.write)
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
        let handle = &mut backend.ledger().handle;
        for (i, event) in events {
            members[i].feed(handle, event);
        }
    }
}

/// Open the store once for every member that waits on it.
fn open_for<B: Backend + ?Sized>(backend: &mut B, members: &[Member<'_>], waiting: &[usize]) -> Vec<(usize, Event)> {
    let failure = match backend.open() {
        Ok(()) => return waiting.iter().map(|&i| (i, Event::Opened)).collect(),
        Err(f) => f,
    };
    tracing::warn!(
        batches = waiting.len(),
        target_db = %backend.location(),
        code = ?failure.extended_code.or(failure.code),
        sqlstate = ?failure.sqlstate,
        errno = ?failure.errno,
        msg = %failure.message,
        "store open failed"
    );
    waiting
        .iter()
        .map(|&i| {
            let mut f = failure.clone();
            f.elapsed_ms = members[i].flush.elapsed_ms();
            (i, Event::Failed(f))
        })
        .collect()
}

/// Capture the retired generation the handle still holds, once, for every
/// member that asks.
fn capture_for<B: Backend + ?Sized>(
    backend: &mut B,
    members: &mut [Member<'_>],
    waiting: &[usize],
) -> Vec<(usize, Event)> {
    let first = waiting.first().map(|&i| &members[i].made);
    let trigger = first.map(|m| m.trigger.clone()).unwrap_or_default();
    let evidence = first
        .and_then(|m| m.failure.as_ref())
        .map(|f| f.evidence.clone())
        .unwrap_or_default();
    let result = backend.capture(&trigger, &evidence);
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
fn write_for<B: Backend + ?Sized>(
    backend: &mut B,
    members: &mut [Member<'_>],
    writers: &[(usize, WritePlan)],
) -> Vec<(usize, Event)> {
    backend.ledger().counters.append_attempts += 1;
    let batches: Vec<(&Flush<'_>, WritePlan)> = writers.iter().map(|&(i, plan)| (&members[i].flush, plan)).collect();
    let result = backend.write_group(&batches);
    if result.group.is_none() {
        // Counted by the benches: batches per commit.
        let failed_alone = result.each.iter().filter(|f| f.is_some()).count();
        tracing::debug!(target: "turnsafe::commit", batches = batches.len() - failed_alone, "group committed");
    }
    writers
        .iter()
        .enumerate()
        .map(|(k, &(i, _))| {
            let local = result.each.get(k).and_then(Option::as_ref);
            let mut failure = match (local, &result.group) {
                (Some(own), _) => own.clone(),
                (None, Some(all)) => all.clone(),
                (None, None) => return (i, Event::Committed),
            };
            // The policy's patience counts time without progress: a lock
            // that passed between other writers meanwhile does not spend it.
            failure.elapsed_ms = backend.patience_ms(members[i].flush.started);
            tracing::info!(
                session = members[i].flush.session.as_str(),
                target_db = %backend.location(),
                code = ?failure.extended_code.or(failure.code),
                sqlstate = ?failure.sqlstate,
                errno = ?failure.errno,
                evidence = ?failure.evidence,
                msg = %failure.message,
                whole_group = local.is_none(),
                "append attempt failed"
            );
            members[i].made.trigger = format!("flush: {}", failure.message);
            (i, Event::Failed(failure))
        })
        .collect()
}

/// After a COMMIT whose answer was lost: which of the batch's uids does
/// the store hold, on the connection just opened?
fn resolve<B: Backend + ?Sized>(backend: &mut B, flush: &Flush<'_>) -> Event {
    crate::failpoint::hit("flush.before_resolve");
    let found = match flush.graph {
        Some(graph) => backend.resolve_graph(graph),
        None => backend.resolve(flush.session.as_str(), &flush.uids, flush.messages),
    };
    match found {
        Ok(all_stored) => {
            tracing::warn!(
                session = flush.session.as_str(),
                all_stored,
                "a lost COMMIT looked up by uid"
            );
            Event::Resolved { all_stored }
        }
        Err(mut f) => {
            f.elapsed_ms = flush.elapsed_ms();
            Event::Failed(f)
        }
    }
}

/// The first `seq` a commit of `session` may take: one past the highest
/// already promised to its diverted lines (pending or being replayed), so
/// no commit reuses one and replay can put them back in place. `None` when
/// no line holds one. Both engines' group writes ask this, and only this.
pub fn promised_seq(divert_dir: &Path, session: &str) -> Option<i64> {
    divert_max_seq(divert_dir, session).map(|max| max + 1)
}

fn divert_max_seq(divert_dir: &Path, session: &str) -> Option<i64> {
    use std::io::BufRead;
    let mut files = vec![divert_dir.join(format!("{session}.jsonl"))];
    if let Ok(rd) = std::fs::read_dir(divert_dir.join("settling")) {
        files.extend(rd.flatten().map(|e| e.path()).filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(crate::settle::session_of_settling)
                == Some(session)
        }));
    }
    let mut max = None;
    for f in files {
        let Ok(file) = std::fs::File::open(&f) else { continue };
        for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
            let seq = crate::json_in::value(&line).ok().and_then(|v| v["seq"].as_i64());
            if let Some(s) = seq {
                max = Some(max.map_or(s, |m: i64| m.max(s)));
            }
        }
    }
    max
}
