//! The flush machine driven by arbitrary event sequences.
//!
//! The fuzzer's bytes choose, turn after turn, whether to start a flush
//! (with any session, uids, seed, pending capture and durability) or to
//! answer the step the machine asks for, with an event that fits the step
//! or with any event at all, its fields drawn from the values that matter
//! to the classifier (every known phrase, code, SQLSTATE, errno and
//! evidence) or from the bytes themselves.
//!
//! After every step the contract of the model check
//! (`policy/tests/flush_model.rs`) is checked, on paths the model's bounds
//! never reach: counts add up, no copy claims a kept copy or a capture
//! without its receipt, nothing opens or writes after a sticky cause,
//! nothing is written after a failed divert, a write right after a failure
//! runs a new one-shot remedy, a wait follows only a retryable cause, a
//! lost COMMIT is looked up only on a new connection, every uid found
//! stored ends persisted, an unknown outcome is never told as not saved.
//! Beside it, the protocol's own rules: an event out of turn, or a start
//! while a flush runs, is refused and changes nothing; a running flush
//! always has a step; a report is for the batch that was started.
//!
//! The two must state one contract: a rule added to the model belongs
//! here too.

use arbitrary::{Result as AResult, Unstructured};
use turnsafe_policy::machine::{
    DivertReceipt, Event, Failure, FlushReport, FlushStart, Handle, PendingCapture, Step, WritePlan,
};
use turnsafe_policy::{
    CaptureFailure, CaptureReceipt, CapturedFile, Cause, DivertFailure, DivertResidue, Durability, Engine, Evidence,
    Operation, RetryPlan,
};

/// Turns of one input: enough for several flushes of many steps.
const MAX_TURNS: usize = 300;

/// What the path so far tells the checks about the next step (as the model's `Last`).
#[derive(Debug, Clone, PartialEq)]
enum Last {
    Nothing,
    Failed {
        operation: Operation,
        cause: Cause,
        plan: Option<WritePlan>,
    },
    DivertFailed,
    Opened,
    ResolvedStored,
    Other,
}

#[derive(Debug, Clone)]
struct Track {
    last: Last,
    /// The plan of the write step in flight.
    plan: Option<WritePlan>,
    sticky_seen: bool,
    capture_receipt_seen: bool,
    /// The running flush's start.
    start: Option<FlushStart>,
    /// Every text the host handed the machine (session, paths, failure
    /// operations and messages): the copy may quote them.
    host_texts: Vec<String>,
}

/// What the checks search the copy for.
const CLAIMS: [&str; 4] = ["a copy was kept", "was captured", "captured at", "were not saved"];

/// The classifier's answer for a failure at `operation`, as the machine
/// asks it. Through `classify_json`, so that this check names only the
/// fields a fuzzed failure sets (a failure's other fields keep their
/// defaults, which the JSON leaves out alike).
fn cause_of(operation: Operation, f: &Failure) -> Option<Cause> {
    let observation = serde_json::json!({
        "operation": operation.label(),
        "engine": f.engine.label(),
        "sqlstate": f.sqlstate,
        "code": f.code,
        "extended_code": f.extended_code,
        "message": f.message,
        "errno": f.errno,
        "evidence": f.evidence.iter().map(|e| e.label()).collect::<Vec<_>>(),
        "attempt": 1,
        "elapsed_ms": f.elapsed_ms,
        "seed": 0,
    });
    let answer: serde_json::Value =
        serde_json::from_str(&turnsafe_policy::json::classify_json(&observation.to_string())).unwrap_or_default();
    // A failure the JSON cannot carry (refused there) is left unchecked.
    answer["cause"].as_str().and_then(Cause::from_label)
}

/// The model check's `check_report`, and the report is the started batch's.
fn check_report(r: &FlushReport, s: &Track) -> Result<(), String> {
    let n = r.uids.len();
    if r.committed + r.diverted + r.handed_back != n {
        return Err(format!("counts do not add up: {r:?}"));
    }
    if let Some(start) = &s.start
        && start.uids != r.uids
    {
        return Err(format!("a report for other uids: {:?} / {:?}", start.uids, r.uids));
    }
    let mut text = r
        .copy
        .as_ref()
        .map(|c| format!("{} {} {:?} {:?}", c.title, c.body, c.remediation, c.details))
        .unwrap_or_default();
    // What the copy quotes of the host's own texts (a session id, a
    // path, a failed operation) is the host's words, not the copy's claim:
    // such a text may read "a copy was kept" (the model's texts never do).
    for quoted in s
        .host_texts
        .iter()
        .filter(|t| CLAIMS.iter().any(|c| t.to_lowercase().contains(c)))
    {
        text = text.replace(&format!("{quoted:?}"), "");
        text = text.replace(quoted.as_str(), "");
    }
    let kept = text.to_lowercase().contains("a copy was kept");
    if kept != r.receipt.is_some() && !(r.receipt.is_some() && r.copy.is_none()) {
        return Err(format!("copy and receipt disagree: {text} / {:?}", r.receipt));
    }
    if r.cause == Some(Cause::OutcomeUnknown) && text.contains("were not saved") {
        return Err(format!("an unknown outcome told as not saved: {text}"));
    }
    let captured_claim = text.contains("was captured") || text.contains("captured at");
    if captured_claim && !s.capture_receipt_seen {
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

/// The model check's `check_step`.
fn check_step(step: &Step, s: &Track) -> Result<(), String> {
    if matches!(step, Step::Open | Step::Write(_)) && s.sticky_seen {
        return Err(format!("{} after a sticky cause", step.label()));
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
        (
            Last::Failed {
                cause: Cause::OutcomeUnknown,
                ..
            },
            step,
        ) if !matches!(step, Step::Open | Step::Divert { .. }) => {
            return Err(format!("{} after a lost COMMIT", step.label()));
        }
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

// ---- inputs from the fuzzer's bytes ------------------------------------------

fn pick<'a, T>(u: &mut Unstructured<'_>, from: &'a [T]) -> AResult<&'a T> {
    u.choose(from)
}

/// A string: most often one that matters, else the bytes' own.
fn text(u: &mut Unstructured<'_>, pool: &[&str]) -> AResult<String> {
    if u.ratio(3, 4)? {
        Ok((*pick(u, pool)?).to_string())
    } else {
        raw_text(u)
    }
}

/// Up to 40 of the input's bytes, as far as they are UTF-8.
fn raw_text(u: &mut Unstructured<'_>) -> AResult<String> {
    let len = u.int_in_range(0..=40usize)?.min(u.len());
    let bytes = u.bytes(len)?;
    let valid = match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    };
    // A host text that itself reads like one of the copy's claims ("a
    // copy was kept") would be quoted back (escaped, shell-quoted) and
    // pass for the copy's own words: such texts are left empty.
    let lower = valid.to_lowercase();
    if ["kept", "captur", "saved"].iter().any(|w| lower.contains(w)) {
        return Ok(String::new());
    }
    Ok(valid.to_string())
}

fn number(u: &mut Unstructured<'_>, pool: &[i64]) -> AResult<Option<i64>> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => None,
        1 => Some(u.arbitrary()?),
        _ => Some(*pick(u, pool)?),
    })
}

const CODES: &[i64] = &[
    0, 1, 5, 6, 8, 10, 11, 13, 14, 19, 23, 26, 261, 262, 266, 267, 517, 522, 778, 787, 1034, 1802, 2067, 2570, 3338,
    3850, 4874, 5386, 6410, 6922, 7178, 8202, 8458, -1,
];
const ERRNOS: &[i64] = &[0, 1, 2, 5, 9, 12, 13, 17, 24, 27, 28, 30, 116, 122, -1];
const SQLSTATES: &[&str] = &[
    "08006", "08001", "08003", "25006", "40001", "40P01", "53100", "53200", "57P01", "57P03", "XX000", "23505",
    "23503", "",
];
const ELAPSED: &[u64] = &[
    0,
    1,
    100,
    RetryPlan::PATIENCE_MS - 1,
    RetryPlan::PATIENCE_MS,
    RetryPlan::PATIENCE_MS + 1,
    u64::MAX / 2,
    u64::MAX,
];

// The defaults cover the fields a fuzzed failure leaves unset (the turn
// lease's evidence, say), whichever fields the machine's failure has.
#[allow(clippy::needless_update)]
fn failure(u: &mut Unstructured<'_>) -> AResult<Failure> {
    // Built once: a fuzzer calls this millions of times.
    static PHRASES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let phrases = PHRASES.get_or_init(|| {
        turnsafe_policy::known_phrases()
            .into_iter()
            .chain(["", "database is locked", "disk I/O error", "turnsafe guard: replaced"])
            .collect()
    });
    let mut evidence = Vec::new();
    for e in Evidence::ALL {
        if u.ratio(1, 6)? {
            evidence.push(e);
        }
    }
    Ok(Failure {
        engine: *pick(u, &Engine::ALL)?,
        sqlstate: if u.arbitrary()? {
            Some(text(u, SQLSTATES)?)
        } else {
            None
        },
        code: number(u, CODES)?,
        extended_code: number(u, CODES)?,
        message: text(u, phrases)?,
        errno: number(u, ERRNOS)?,
        evidence,
        elapsed_ms: if u.ratio(7, 8)? {
            *pick(u, ELAPSED)?
        } else {
            u.arbitrary()?
        },
        ..Failure::default()
    })
}

const PATHS: &[&str] = &["/h/sessions/s1.jsonl", "/h/state.db.retired-x", "", "relative", "/"];
const OPS: &[&str] = &[
    "open",
    "write",
    "fsync",
    "fsync_dir",
    "mkdir",
    "lock",
    "validate",
    "encode",
    "copy",
    "",
];

fn divert_receipt(u: &mut Unstructured<'_>) -> AResult<DivertReceipt> {
    Ok(DivertReceipt {
        path: text(u, PATHS)?,
        offset: u.arbitrary()?,
        length: u.arbitrary()?,
        count: u.arbitrary()?,
        sha256: if u.ratio(3, 4)? {
            "11".repeat(32)
        } else {
            text(u, &["", "zz"])?
        },
    })
}

fn capture_receipt(u: &mut Unstructured<'_>) -> AResult<CaptureReceipt> {
    let n = u.int_in_range(0..=3usize)?;
    let mut files = Vec::new();
    for _ in 0..n {
        files.push(CapturedFile {
            name: text(u, &["state.db", "state.db-wal", "state.db-shm", ""])?,
            size: u.arbitrary()?,
        });
    }
    Ok(CaptureReceipt {
        path: text(u, PATHS)?,
        files,
        manifest_sha256: "00".repeat(32),
    })
}

/// An event that answers `step`, most of the time with what a host would send.
fn fitting_event(u: &mut Unstructured<'_>, step: &Step) -> AResult<Event> {
    Ok(match step {
        Step::Open => {
            if u.arbitrary()? {
                Event::Opened
            } else {
                Event::Failed(failure(u)?)
            }
        }
        Step::Write(_) => {
            if u.arbitrary()? {
                Event::Committed
            } else {
                Event::Failed(failure(u)?)
            }
        }
        Step::Wait { ms } => Event::Waited {
            elapsed_ms: if u.arbitrary()? { *ms } else { u.arbitrary()? },
        },
        Step::Resolve => match u.int_in_range(0..=2u8)? {
            0 => Event::Resolved { all_stored: true },
            1 => Event::Resolved { all_stored: false },
            _ => Event::Failed(failure(u)?),
        },
        Step::Capture => {
            if u.arbitrary()? {
                Event::Captured(capture_receipt(u)?)
            } else {
                capture_failed(u)?
            }
        }
        Step::Divert { .. } => {
            if u.arbitrary()? {
                Event::Diverted(divert_receipt(u)?)
            } else {
                divert_failed(u)?
            }
        }
        Step::Done(_) => any_event(u)?,
    })
}

fn capture_failed(u: &mut Unstructured<'_>) -> AResult<Event> {
    Ok(Event::CaptureFailed {
        failure: CaptureFailure {
            operation: text(u, OPS)?,
            errno: number(u, ERRNOS)?,
        },
        error: text(u, &["capture failed", ""])?,
    })
}

fn divert_failed(u: &mut Unstructured<'_>) -> AResult<Event> {
    Ok(Event::DivertFailed {
        failure: DivertFailure {
            operation: text(u, OPS)?,
            errno: number(u, ERRNOS)?,
        },
        message: text(u, &["too many open files", "input/output error", ""])?,
        residue: if u.arbitrary()? {
            Some(DivertResidue {
                path: text(u, PATHS)?,
                offset: u.arbitrary()?,
            })
        } else {
            None
        },
    })
}

fn any_event(u: &mut Unstructured<'_>) -> AResult<Event> {
    Ok(match u.int_in_range(0..=8u8)? {
        0 => Event::Opened,
        1 => Event::Committed,
        2 => Event::Failed(failure(u)?),
        3 => Event::Waited {
            elapsed_ms: u.arbitrary()?,
        },
        4 => Event::Captured(capture_receipt(u)?),
        5 => capture_failed(u)?,
        6 => Event::Diverted(divert_receipt(u)?),
        7 => Event::Resolved {
            all_stored: u.arbitrary()?,
        },
        _ => divert_failed(u)?,
    })
}

fn flush_start(u: &mut Unstructured<'_>) -> AResult<FlushStart> {
    let n = u.int_in_range(0..=5usize)?;
    let uids: Vec<String> = (0..n)
        .map(|i| text(u, &["u1", "u2", "u1", ""]).map(|t| if t.is_empty() { format!("m{i}") } else { t }))
        .collect::<AResult<_>>()?;
    let minted_uids = uids
        .iter()
        .filter(|_| u.ratio(1, 3).unwrap_or(false))
        .cloned()
        .collect();
    Ok(FlushStart {
        session: text(u, &["s1", "s2", ""])?,
        uids,
        minted_uids,
        seed: u.arbitrary()?,
        pending_capture: if u.ratio(1, 6)? {
            // As the host reads it from a manifest: a sticky cause, or
            // `unknown` for any other label (`captures::Manifest::cause`).
            Some(PendingCapture {
                path: text(u, PATHS)?,
                cause: *pick(u, &[Cause::Replaced, Cause::DeletedWal, Cause::Corrupt, Cause::Unknown])?,
            })
        } else {
            None
        },
        durability: if u.ratio(1, 4)? {
            Durability::Unsynced
        } else {
            Durability::Synced
        },
    })
}

/// Drive one handle with the flushes and events `data` describes, and
/// check the contract after every step.
pub fn check(data: &[u8]) -> Result<(), String> {
    let mut u = Unstructured::new(data);
    let mut handle = Handle::new();
    let mut s = Track {
        last: Last::Nothing,
        plan: None,
        sticky_seen: false,
        capture_receipt_seen: false,
        start: None,
        host_texts: Vec::new(),
    };
    for _ in 0..MAX_TURNS {
        if u.is_empty() {
            break;
        }
        let Ok(start_now) = u.ratio(1, 12) else { break };
        if start_now || !handle.in_flush() {
            let Ok(start) = flush_start(&mut u) else { break };
            s.host_texts.push(start.session.clone());
            s.host_texts.extend(start.uids.iter().cloned());
            if let Some(p) = &start.pending_capture {
                s.host_texts.push(p.path.clone());
            }
            let before = handle.clone();
            let running = handle.in_flush();
            match handle.start(start.clone()) {
                Ok(()) if running => return Err("a second flush started while one runs".into()),
                Ok(()) => {
                    s = Track {
                        last: Last::Nothing,
                        plan: None,
                        start: Some(start),
                        // A capture stays the handle's across its flushes,
                        // as in the model.
                        ..s
                    };
                }
                Err(e) => {
                    if handle != before {
                        return Err(format!("a refused start changed the handle ({e})"));
                    }
                }
            }
            continue;
        }
        let Some(step) = handle.poll() else {
            return Err("no step while a flush runs".into());
        };
        check_step(&step, &s)?;
        if let Step::Done(report) = &step {
            check_report(report, &s)?;
            if handle.in_flush() {
                return Err("the flush still runs after done".into());
            }
            s.start = None;
            continue;
        }
        s.plan = match &step {
            Step::Write(p) => Some(*p),
            _ => None,
        };
        let fits = u.ratio(7, 8).unwrap_or(true);
        let event = match if fits {
            fitting_event(&mut u, &step)
        } else {
            any_event(&mut u)
        } {
            Ok(e) => e,
            Err(_) => break,
        };
        let before = handle.clone();
        let last = match &event {
            Event::Failed(f) => {
                let operation = match step {
                    Step::Open => Operation::Open,
                    _ => Operation::AppendBatch,
                };
                match cause_of(operation, f) {
                    Some(cause) => Last::Failed {
                        operation,
                        cause,
                        plan: s.plan,
                    },
                    None => Last::Other,
                }
            }
            Event::DivertFailed { .. } => Last::DivertFailed,
            Event::Opened => Last::Opened,
            Event::Resolved { all_stored: true } => Last::ResolvedStored,
            _ => Last::Other,
        };
        let captured = matches!(event, Event::Captured(_));
        match &event {
            Event::Diverted(r) => s.host_texts.push(r.path.clone()),
            Event::Captured(r) => s.host_texts.push(r.path.clone()),
            Event::DivertFailed {
                failure,
                message,
                residue,
            } => {
                s.host_texts.extend([failure.operation.clone(), message.clone()]);
                s.host_texts.extend(residue.iter().map(|r| r.path.clone()));
            }
            Event::CaptureFailed { failure, error } => {
                s.host_texts.extend([failure.operation.clone(), error.clone()]);
            }
            Event::Failed(f) => s.host_texts.push(f.message.clone()),
            _ => {}
        }
        match handle.handle(event) {
            Ok(()) => {
                s.sticky_seen |= matches!(
                    last,
                    Last::Failed {
                        cause: Cause::Replaced | Cause::DeletedWal | Cause::Corrupt,
                        ..
                    }
                );
                s.capture_receipt_seen |= captured;
                s.last = last;
            }
            Err(e) => {
                if handle != before {
                    return Err(format!("a refused event changed the handle ({e})"));
                }
            }
        }
    }
    Ok(())
}
