//! Model check of the flush protocol: every event sequence the host can
//! feed the handle machine, under bounds, over two batches on one handle
//! (so stickiness across batches is seen), with visited states deduplicated.
//!
//! Bounds:
//! - one representative failure per cause, at open and at write;
//! - elapsed time below, at and past the patience;
//! - at most 4 failures below the patience per flush, after which only
//!   successes and patience-exhausted failures are fed;
//! - capture and divert each succeeding or failing (a failed divert with
//!   and without a residue).
//!
//! On every path: it terminates; committed + diverted + handed back is the
//! batch size; no copy claims a kept copy or a capture without its
//! receipt; nothing opens or writes after a sticky cause, in the flush or
//! the next; nothing is written after a failed divert; a write right after
//! a failure runs a new one-shot remedy (each at most once); a wait follows
//! only a retryable cause; a lost COMMIT is looked up only on a new
//! connection, and every uid found stored ends the flush persisted; after
//! an unknown outcome no copy says the messages were not saved.

use std::collections::HashMap;

use turnsafe_policy::machine::{DivertReceipt, Event, Failure, FlushReport, FlushStart, Handle, Step, WritePlan};
use turnsafe_policy::{
    CaptureFailure, CaptureReceipt, Cause, DivertFailure, DivertResidue, Engine, Evidence, Observation, Operation,
    RetryPlan, classify,
};

const BATCHES: usize = 2;
const MAX_EARLY_FAILURES: u32 = 4;

/// A failure that classifies as `cause` (checked below).
fn failure_for(cause: Cause, elapsed_ms: u64) -> Failure {
    let (code, ext, evidence, message): (Option<i64>, Option<i64>, Vec<Evidence>, &str) = match cause {
        Cause::Locked => (Some(5), Some(5), vec![], "database is locked"),
        Cause::Disk => (Some(10), Some(778), vec![], "disk I/O error"),
        Cause::DiskFull => (Some(13), Some(13), vec![], "database or disk is full"),
        Cause::Replaced => (None, None, vec![Evidence::DbReplaced], "turnsafe guard: replaced"),
        Cause::DeletedWal => (None, None, vec![Evidence::DeletedWalGeneration], "turnsafe guard: wal"),
        Cause::Corrupt => (Some(11), Some(11), vec![], "database disk image is malformed"),
        Cause::FtsIndex => (Some(267), Some(267), vec![Evidence::FtsScope], "fts5: corrupt"),
        Cause::TurnLease => (None, None, vec![Evidence::TurnLeaseLost], "lease"),
        Cause::Compression => (None, None, vec![Evidence::CompressionInProgress], "compacting"),
        Cause::CompressionClosed => (None, None, vec![Evidence::CompressionClosed], "closed"),
        Cause::SessionRowMissing => (Some(19), Some(787), vec![], "FOREIGN KEY constraint failed"),
        Cause::UidConflict => (Some(19), Some(2067), vec![], "UNIQUE constraint failed"),
        Cause::Unavailable | Cause::ReadOnly | Cause::OutcomeUnknown => {
            let (sqlstate, evidence) = match cause {
                Cause::Unavailable => ("08006", vec![]),
                Cause::ReadOnly => ("25006", vec![]),
                _ => ("08006", vec![Evidence::CommitSent]),
            };
            return Failure {
                engine: Engine::Postgres,
                sqlstate: Some(sqlstate.into()),
                code: Some(10),
                message: "postgres".into(),
                evidence,
                elapsed_ms,
                ..Failure::default()
            };
        }
        Cause::Unknown => (None, None, vec![], ""),
    };
    Failure {
        engine: Engine::Sqlite,
        sqlstate: None,
        code,
        extended_code: ext,
        message: message.into(),
        errno: None,
        evidence,
        elapsed_ms,
        lease: None,
    }
}

fn cause_of(operation: Operation, f: &Failure) -> Cause {
    classify(&Observation {
        operation,
        engine: f.engine,
        sqlstate: f.sqlstate.clone(),
        code: f.code,
        extended_code: f.extended_code,
        message: f.message.clone(),
        errno: f.errno,
        evidence: f.evidence.clone(),
        attempt: 1,
        elapsed_ms: f.elapsed_ms,
        seed: 0,
        lease: f.lease.clone(),
    })
    .cause
}

fn start(batch: usize) -> FlushStart {
    FlushStart {
        session: "s1".into(),
        uids: (0..3).map(|i| format!("b{batch}-{i}")).collect(),
        minted_uids: Vec::new(),
        seed: 7 + batch as u64,
        pending_capture: None,
        durability: Default::default(),
    }
}

const RECEIPT_PATH: &str = "/h/sessions/s1.jsonl";
const CAPTURE_PATH: &str = "/h/state.db.retired-x";

/// What the path so far tells the checks about the next step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Last {
    Nothing,
    /// A failure at `operation` that classifies as `cause`, with the plan
    /// the failed write ran (none for an open).
    Failed {
        operation: Operation,
        cause: Cause,
        plan: Option<WritePlan>,
    },
    DivertFailed,
    Opened,
    /// The uid lookup said every uid is stored.
    ResolvedStored,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    handle: Handle,
    batch: usize,
    early_failures: u32,
    last: Last,
    /// The plan of the write step in flight (to see what a failure ran).
    plan: Option<WritePlan>,
    /// Seen on this path, by the test itself: a sticky cause (the table
    /// says `replaced`, `deleted_wal` and `corrupt` quarantine a handle).
    sticky_seen: bool,
    /// Seen on this path: a capture receipt was fed to the machine.
    capture_receipt_seen: bool,
}

struct Explorer {
    /// Complete paths from each visited state (memoised).
    paths: HashMap<State, u128>,
    /// States on the current path, to find cycles.
    on_path: std::collections::HashSet<State>,
    max_depth: usize,
    depth: usize,
    reports: u64,
}

fn check_report(r: &FlushReport, s: &State) -> Result<(), String> {
    let n = r.uids.len();
    if r.committed + r.diverted + r.handed_back != n {
        return Err(format!("counts do not add up: {r:?}"));
    }
    let text = r
        .copy
        .as_ref()
        .map(|c| format!("{} {} {:?} {:?}", c.title, c.body, c.remediation, c.details))
        .unwrap_or_default();
    let kept = text.to_lowercase().contains("a copy was kept");
    if kept != r.receipt.is_some() && !(r.receipt.is_some() && r.copy.is_none()) {
        return Err(format!("copy and receipt disagree: {text} / {:?}", r.receipt));
    }
    // After a lost COMMIT nothing may say the messages are not stored.
    if r.cause == Some(Cause::OutcomeUnknown) && text.contains("were not saved") {
        return Err(format!("an unknown outcome told as not saved: {text}"));
    }
    let captured_claim = text.contains("was captured") || text.contains("captured at");
    let has_capture_receipt = s.capture_receipt_seen;
    if captured_claim && !has_capture_receipt {
        return Err(format!("capture claimed without a receipt: {text}"));
    }
    if r.persisted && (r.diverted > 0 || r.handed_back > 0 || r.error.is_some()) {
        return Err(format!("a persisted report that is not: {r:?}"));
    }
    if !r.persisted && r.error.is_none() {
        return Err(format!("a failed flush without its failure label: {r:?}"));
    }
    Ok(())
}

/// Which events answer a step, under the bounds.
fn events_for(step: &Step, s: &State) -> Vec<Event> {
    let failures = |s: &State| -> Vec<Event> {
        let mut elapsed = vec![RetryPlan::PATIENCE_MS, RetryPlan::PATIENCE_MS + 1];
        if s.early_failures < MAX_EARLY_FAILURES {
            elapsed.insert(0, 100);
        }
        Cause::ALL
            .into_iter()
            .flat_map(|c| elapsed.iter().map(move |e| Event::Failed(failure_for(c, *e))))
            .collect()
    };
    match step {
        Step::Open => {
            let mut v = vec![Event::Opened];
            v.extend(failures(s));
            v
        }
        Step::Write(_) => {
            let mut v = vec![Event::Committed];
            v.extend(failures(s));
            v
        }
        Step::Wait { .. } => vec![Event::Waited { elapsed_ms: 100 }],
        Step::Resolve => {
            let mut v = vec![
                Event::Resolved { all_stored: true },
                Event::Resolved { all_stored: false },
            ];
            v.extend(failures(s));
            v
        }
        Step::Capture => vec![
            Event::Captured(CaptureReceipt {
                path: CAPTURE_PATH.into(),
                files: Vec::new(),
                manifest_sha256: "00".repeat(32),
            }),
            Event::CaptureFailed {
                failure: CaptureFailure {
                    operation: "mkdir".into(),
                    errno: Some(2),
                },
                error: "capture of the retired generation failed at mkdir: ENOENT".into(),
            },
        ],
        Step::Divert { .. } => vec![
            Event::Diverted(DivertReceipt {
                path: RECEIPT_PATH.into(),
                offset: 0,
                length: 10,
                count: 3,
                sha256: "11".repeat(32),
            }),
            Event::DivertFailed {
                failure: DivertFailure {
                    operation: "open".into(),
                    errno: Some(24),
                },
                message: "too many open files".into(),
                residue: None,
            },
            Event::DivertFailed {
                failure: DivertFailure {
                    operation: "fsync".into(),
                    errno: Some(5),
                },
                message: "input/output error".into(),
                residue: Some(DivertResidue {
                    path: RECEIPT_PATH.into(),
                    offset: 0,
                }),
            },
        ],
        Step::Done(_) => Vec::new(),
    }
}

/// The checks on a step, given what came before it.
fn check_step(step: &Step, s: &State) -> Result<(), String> {
    let sticky = s.sticky_seen;
    match step {
        Step::Open | Step::Write(_) if sticky => return Err(format!("{} after a sticky cause", step.label())),
        _ => {}
    }
    match (&s.last, step) {
        (Last::DivertFailed, Step::Done(_)) => {}
        (Last::DivertFailed, other) => return Err(format!("{} after a failed divert", other.label())),
        (Last::Failed { cause, .. }, Step::Wait { .. })
            if !matches!(
                cause,
                Cause::Locked | Cause::Compression | Cause::Unavailable | Cause::ReadOnly
            ) =>
        {
            return Err(format!("a wait after {cause:?}, which is not retryable"));
        }
        // A lost COMMIT is looked up on a new connection, or kept.
        (
            Last::Failed {
                cause: Cause::OutcomeUnknown,
                ..
            },
            step,
        ) if !matches!(step, Step::Open | Step::Divert { .. }) => {
            return Err(format!("{} after a lost COMMIT", step.label()));
        }
        // A server that went away or turned standby is not written to on the
        // same connection.
        (
            Last::Failed {
                cause: Cause::Unavailable | Cause::ReadOnly,
                ..
            },
            Step::Write(_) | Step::Resolve,
        ) => return Err(format!("{} without reconnecting", step.label())),
        (last, Step::Resolve) if *last != Last::Opened => {
            return Err(format!("a lookup that does not follow a new connection ({last:?})"));
        }
        (Last::ResolvedStored, Step::Done(r)) if !r.persisted => {
            return Err(format!("every uid stored, yet not persisted: {r:?}"));
        }
        (Last::ResolvedStored, other) if !matches!(other, Step::Done(_)) => {
            return Err(format!("{} after every uid was found stored", other.label()));
        }
        (
            Last::Failed {
                operation: Operation::AppendBatch,
                plan: Some(ran),
                cause,
            },
            Step::Write(next),
        ) => {
            let grew = (next.degrade_fts && !ran.degrade_fts) || (next.recreate_session && !ran.recreate_session);
            let shrank = (ran.degrade_fts && !next.degrade_fts) || (ran.recreate_session && !next.recreate_session);
            if !grew || shrank {
                return Err(format!(
                    "a write right after {cause:?} without a new one-shot remedy: {ran:?} -> {next:?}"
                ));
            }
        }
        (
            Last::Failed {
                operation: Operation::Open,
                cause,
                ..
            },
            Step::Write(_),
        ) => return Err(format!("a write after a failed open ({cause:?})")),
        _ => {}
    }
    Ok(())
}

impl Explorer {
    fn explore(&mut self, s: State) -> Result<u128, String> {
        if let Some(n) = self.paths.get(&s) {
            return Ok(*n);
        }
        if !self.on_path.insert(s.clone()) {
            return Err(format!("a cycle: the protocol can loop forever at {s:?}"));
        }
        self.depth += 1;
        self.max_depth = self.max_depth.max(self.depth);
        if self.depth > 200 {
            return Err("a path longer than 200 steps".into());
        }
        let mut handle = s.handle.clone();
        let step = match handle.poll() {
            Some(step) => step,
            None => return Err("no step while a flush runs".into()),
        };
        check_step(&step, &s)?;
        let mut total: u128 = 0;
        if let Step::Done(report) = &step {
            self.reports += 1;
            check_report(report, &s)?;
            if handle.in_flush() {
                return Err("the flush still runs after done".into());
            }
            if s.batch + 1 < BATCHES {
                let mut next = handle.clone();
                next.start(start(s.batch + 1)).map_err(|e| e.to_string())?;
                total += self.explore(State {
                    handle: next,
                    batch: s.batch + 1,
                    early_failures: 0,
                    last: Last::Nothing,
                    plan: None,
                    ..s.clone()
                })?;
            } else {
                total = 1;
            }
        }
        let plan = match &step {
            Step::Write(p) => Some(*p),
            _ => None,
        };
        for event in events_for(&step, &s) {
            let mut h = handle.clone();
            let last = match &event {
                Event::Failed(f) => {
                    let operation = match step {
                        Step::Open => Operation::Open,
                        _ => Operation::AppendBatch,
                    };
                    Last::Failed {
                        operation,
                        cause: cause_of(operation, f),
                        plan,
                    }
                }
                Event::DivertFailed { .. } => Last::DivertFailed,
                Event::Opened => Last::Opened,
                Event::Resolved { all_stored: true } => Last::ResolvedStored,
                _ => Last::Other,
            };
            let early = match &event {
                Event::Failed(f) if f.elapsed_ms < RetryPlan::PATIENCE_MS => s.early_failures + 1,
                _ => s.early_failures,
            };
            let sticky_seen = s.sticky_seen
                || matches!(
                    last,
                    Last::Failed {
                        cause: Cause::Replaced | Cause::DeletedWal | Cause::Corrupt,
                        ..
                    }
                );
            let capture_receipt_seen = s.capture_receipt_seen || matches!(event, Event::Captured(_));
            h.handle(event)
                .map_err(|e| format!("refused at {}: {e}", step.label()))?;
            total += self.explore(State {
                handle: h,
                batch: s.batch,
                early_failures: early,
                last,
                plan,
                sticky_seen,
                capture_receipt_seen,
            })?;
        }
        self.on_path.remove(&s);
        self.depth -= 1;
        self.paths.insert(s, total);
        Ok(total)
    }
}

#[test]
fn representatives_classify_as_their_cause() {
    for cause in Cause::ALL {
        let op = if matches!(
            cause,
            Cause::UidConflict | Cause::SessionRowMissing | Cause::OutcomeUnknown
        ) {
            Operation::AppendBatch
        } else {
            Operation::Open
        };
        assert_eq!(cause_of(op, &failure_for(cause, 0)), cause, "{cause:?}");
    }
}

#[test]
fn every_event_sequence_keeps_the_invariants() {
    let started = std::time::Instant::now();
    let mut handle = Handle::new();
    handle.start(start(0)).expect("start");
    let mut ex = Explorer {
        paths: HashMap::new(),
        on_path: Default::default(),
        max_depth: 0,
        depth: 0,
        reports: 0,
    };
    let root = State {
        handle,
        batch: 0,
        early_failures: 0,
        last: Last::Nothing,
        plan: None,
        sticky_seen: false,
        capture_receipt_seen: false,
    };
    let paths = ex.explore(root).unwrap_or_else(|e| panic!("invariant broken: {e}"));
    eprintln!(
        "flush model: {} states, {} complete paths over {BATCHES} batches, {} outcomes checked, longest path {} steps, {:.1?}",
        ex.paths.len(),
        paths,
        ex.reports,
        ex.max_depth,
        started.elapsed()
    );
    assert!(
        ex.paths.len() > 1000,
        "the search explored too little: {}",
        ex.paths.len()
    );
    assert!(paths > 100_000);
}

#[test]
fn the_protocol_refuses_events_out_of_turn() {
    let mut h = Handle::new();
    assert!(h.handle(Event::Opened).is_err(), "no flush running");
    h.start(start(0)).unwrap();
    assert!(h.start(start(1)).is_err(), "a second flush while one runs");
    assert_eq!(h.poll(), Some(Step::Open));
    let before = h.clone();
    assert!(h.handle(Event::Committed).is_err(), "committed does not answer open");
    assert_eq!(h, before, "a refused event changes nothing");
    assert_eq!(h.poll(), Some(Step::Open), "poll without an event repeats the step");
}
