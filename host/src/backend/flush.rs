//! [`Writer`]: the flush machine driven over any [`Backend`], with the
//! divert folder on the local disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use turnsafe_policy::Cause;
use turnsafe_policy::machine::{Event, Failure, FlushReport, FlushStart, Handle, HandleState, Step, WritePlan};

use super::{Backend, Batch, Cursor, Lease};
use crate::capture::CaptureError;
use crate::divert::{self, DivertError};
use crate::message::Message;
use crate::outcome::FlushOutcome;
use crate::store::{Counters, SessionId};

/// How a writer takes leases.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Name of this writer in the turn lease.
    pub holder: String,
    pub lease_ttl: Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            holder: format!("pid-{}", std::process::id()),
            lease_ttl: Duration::from_secs(30),
        }
    }
}

/// One handle on a backend: the policy's handle machine, each session's
/// cursor, and the divert folder `<home>/sessions/`.
pub struct Writer<B: Backend> {
    backend: B,
    divert_dir: PathBuf,
    lease: Lease,
    machine: Handle,
    /// Why the open at construction failed; the first batch observes it
    /// instead of connecting a second time.
    open_failure: Option<Failure>,
    counters: Counters,
    sessions: HashMap<String, Cursor>,
}

impl<B: Backend> Writer<B> {
    /// A writer on `backend`, diverting under `home/sessions/`. The backend
    /// is opened here; if that fails the writer still answers every batch.
    pub fn new(backend: B, home: &Path, opts: WriterOptions) -> Writer<B> {
        let mut w = Writer {
            backend,
            divert_dir: home.join("sessions"),
            lease: Lease {
                holder: opts.holder,
                ttl_ms: opts.lease_ttl.as_millis() as i64,
            },
            machine: Handle::new(),
            open_failure: None,
            counters: Counters::default(),
            sessions: HashMap::new(),
        };
        w.counters.open_attempts += 1;
        match w.backend.open() {
            Ok(()) => w.counters.connections_opened += 1,
            Err(f) => w.open_failure = Some(f),
        }
        w
    }

    pub fn backend(&mut self) -> &mut B {
        &mut self.backend
    }
    pub fn divert_dir(&self) -> &Path {
        &self.divert_dir
    }
    pub fn counters(&self) -> Counters {
        self.counters
    }
    pub fn sticky(&self) -> Option<Cause> {
        self.machine.sticky()
    }

    /// Flush one turn's batch. Every message ends committed, diverted with
    /// a receipt, or handed back; the outcome says which. The machine
    /// decides every step; this loop performs them.
    pub fn append_batch(&mut self, session: &SessionId, messages: &[Message]) -> FlushOutcome {
        let started = Instant::now();
        let (uids, minted) = crate::message::uids_minting(messages);
        let start = FlushStart {
            session: session.as_str().to_string(),
            uids: uids.clone(),
            minted_uids: minted,
            seed: random_seed(),
            pending_capture: None,
            durability: self.backend.durability(),
        };
        if self.machine.start(start.clone()).is_err() {
            tracing::error!("flush machine was busy; abandoning the old flush");
            let _ = self.machine.abandon();
            let _ = self.machine.start(start);
        }
        let batch = Batch {
            session,
            messages,
            uids: &uids,
        };
        let mut made = Made::default();
        let elapsed = || started.elapsed().as_millis() as u64;
        loop {
            let Some(step) = self.machine.poll() else {
                let report = self.machine.abandon();
                return self.finish(report, made);
            };
            let event = match step {
                Step::Done(report) => {
                    tracing::debug!(
                        session = session.as_str(),
                        persisted = report.persisted,
                        cause = ?report.cause.map(|c| c.label()),
                        attempts = report.attempts,
                        "flush done"
                    );
                    return self.finish(*report, made);
                }
                Step::Open => self.perform_open(&batch, elapsed()),
                Step::Write(plan) => self.perform_write(&batch, &plan, elapsed(), &mut made),
                Step::Wait { ms } => {
                    std::thread::sleep(Duration::from_millis(ms));
                    Event::Waited { elapsed_ms: elapsed() }
                }
                Step::Capture => {
                    let result = self.backend.capture(&made.trigger);
                    made.capture = Some(result.clone());
                    match result {
                        Ok(receipt) => Event::Captured(receipt),
                        Err(e) => Event::CaptureFailed {
                            failure: e.to_failure(),
                            error: e.to_string(),
                        },
                    }
                }
                Step::Divert { cause } => self.perform_divert(&batch, cause, &mut made),
                Step::Resolve => self.perform_resolve(&batch, elapsed()),
            };
            if let Event::Failed(f) = &event {
                made.failure = Some(f.clone());
            }
            if let Err(e) = self.machine.handle(event) {
                tracing::error!(error = %e, "the flush machine refused an event; the batch is handed back");
                let report = self.machine.abandon();
                return self.finish(report, made);
            }
        }
    }

    /// The outcome; and when the connection is gone, the handle learns it
    /// is no longer open, so the next batch's first step is an open.
    fn finish(&mut self, report: FlushReport, made: Made) -> FlushOutcome {
        if self.machine.is_open() && !self.backend.is_open() && !self.machine.in_flush() {
            self.machine = Handle::with_state(HandleState {
                open: false,
                ..self.machine.state().clone()
            });
        }
        let mut out = FlushOutcome::new(report, made.divert_error, made.capture);
        out.failure = made.failure;
        out
    }

    /// After a COMMIT whose answer was lost: which of the batch's uids does
    /// the store hold, on the connection just opened?
    fn perform_resolve(&mut self, batch: &Batch<'_>, elapsed_ms: u64) -> Event {
        match self.backend.resolve(batch.session.as_str(), batch.uids) {
            Ok(all_stored) => {
                tracing::warn!(
                    session = batch.session.as_str(),
                    all_stored,
                    "a lost COMMIT looked up by uid"
                );
                Event::Resolved { all_stored }
            }
            Err(mut f) => {
                f.elapsed_ms = elapsed_ms;
                Event::Failed(f)
            }
        }
    }

    fn perform_open(&mut self, batch: &Batch<'_>, elapsed_ms: u64) -> Event {
        let result = match self.open_failure.take() {
            Some(f) => Err(f),
            // Opened when the writer was made: the machine learns it now.
            None if self.backend.is_open() => return Event::Opened,
            None => {
                self.counters.open_attempts += 1;
                self.backend.open()
            }
        };
        match result {
            Ok(()) => {
                self.counters.connections_opened += 1;
                Event::Opened
            }
            Err(mut f) => {
                f.elapsed_ms = elapsed_ms;
                tracing::warn!(
                    session = batch.session.as_str(),
                    target_db = %self.backend.location(),
                    code = ?f.extended_code.or(f.code),
                    sqlstate = ?f.sqlstate,
                    errno = ?f.errno,
                    msg = %f.message,
                    "store open failed"
                );
                Event::Failed(f)
            }
        }
    }

    fn perform_write(&mut self, batch: &Batch<'_>, plan: &WritePlan, elapsed_ms: u64, made: &mut Made) -> Event {
        self.counters.append_attempts += 1;
        let key = batch.session.as_str();
        if !self.sessions.contains_key(key) {
            // A writer's first batch of a session learns which seqs diverted
            // lines already hold, so replay can put them back in place.
            let promised = divert_max_seq(&self.divert_dir, key).map(|m| m + 1);
            self.sessions.insert(
                key.to_string(),
                Cursor {
                    lease_token: None,
                    next_seq: promised,
                },
            );
        }
        let cursor = self.sessions.entry(key.to_string()).or_default();
        match self.backend.write(batch, plan, cursor, &self.lease) {
            Ok(()) => Event::Committed,
            Err(mut f) => {
                f.elapsed_ms = elapsed_ms;
                tracing::info!(
                    session = key,
                    target_db = %self.backend.location(),
                    code = ?f.extended_code.or(f.code),
                    errno = ?f.errno,
                    evidence = ?f.evidence,
                    "append attempt failed"
                );
                made.trigger = format!("flush: {}", f.message);
                Event::Failed(f)
            }
        }
    }

    fn perform_divert(&mut self, batch: &Batch<'_>, cause: Cause, made: &mut Made) -> Event {
        let cursor = self.sessions.entry(batch.session.as_str().to_string()).or_default();
        self.counters.diverts += 1;
        let (event, error) = divert::divert_step(
            &self.divert_dir,
            batch.session.as_str(),
            batch.messages,
            batch.uids,
            &mut cursor.next_seq,
            cause,
        );
        made.divert_error = error;
        event
    }

    /// Give back this writer's lease on `session`.
    pub fn release_lease(&mut self, session: &SessionId) {
        let token = self
            .sessions
            .get_mut(session.as_str())
            .and_then(|c| c.lease_token.take());
        if let (Some(token), None) = (token, self.machine.sticky())
            && self.backend.is_open()
        {
            self.backend.release_lease(session.as_str(), &token);
        }
    }

    /// Give back every lease this writer holds.
    pub fn release_all_leases(&mut self) {
        let held: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, c)| c.lease_token.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for id in held {
            if let Ok(s) = SessionId::new(&id) {
                self.release_lease(&s);
            }
        }
    }
}

impl<B: Backend> Drop for Writer<B> {
    fn drop(&mut self) {
        self.release_all_leases();
    }
}

/// The host's values of the effects, beside the machine's outcome.
#[derive(Default)]
struct Made {
    divert_error: Option<DivertError>,
    capture: Option<Result<crate::capture::Capture, CaptureError>>,
    /// The failure that asked for a capture, for its manifest.
    trigger: String,
    /// The last failed open or write, as handed to the machine.
    failure: Option<Failure>,
}

fn random_seed() -> u64 {
    crate::ids::seed()
}

/// The highest `seq` already promised to diverted lines of `session`
/// (pending or being replayed), so later commits never reuse it.
pub(crate) fn divert_max_seq(divert_dir: &Path, session: &str) -> Option<i64> {
    use std::io::BufRead;
    let mut files = vec![divert_dir.join(format!("{session}.jsonl"))];
    if let Ok(rd) = std::fs::read_dir(divert_dir.join("settling")) {
        files.extend(rd.flatten().map(|e| e.path()).filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(crate::replay::session_of_settling)
                == Some(session)
        }));
    }
    let mut max = None;
    for f in files {
        let Ok(file) = std::fs::File::open(&f) else { continue };
        for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
            let seq = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v["seq"].as_i64());
            if let Some(s) = seq {
                max = Some(max.map_or(s, |m: i64| m.max(s)));
            }
        }
    }
    max
}
