//! The WASM component's exports: thin conversions between the WIT types
//! and the crate's own, so every runtime runs exactly the native code.

use crate::machine;
use crate::model as m;
#[allow(unused_imports)]
use crate::prelude::*;

wit_bindgen::generate!({
    world: "policy",
    path: "../wit",
});

use alloc::rc::Rc;
use core::cell::{RefCell, RefMut};

use exports::turnsafe::policy::engine;
use exports::turnsafe::policy::engine::{
    Action, Basis, Cause, Classification, CopyContext, DbEngine, Decision, Durability, Event, Evidence, Flush,
    FlushStart, Guest, GuestFlush, GuestHandle, Observation, Operation, Outcome, Step, UserCopy, WritePlan,
};

struct Component;

// One instance runs one call at a time: the component model gives a
// component instance no threads.
#[global_allocator]
static ALLOCATOR: lol_alloc::AssumeSingleThreaded<lol_alloc::FreeListAllocator> =
    // SAFETY: a component instance is single-threaded.
    unsafe { lol_alloc::AssumeSingleThreaded::new(lol_alloc::FreeListAllocator::new()) };

/// Every function of the policy is total; a panic is a bug, and the host
/// sees it as a trap.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

fn operation(o: Operation) -> m::Operation {
    match o {
        Operation::Open => m::Operation::Open,
        Operation::AppendBatch => m::Operation::AppendBatch,
        Operation::Checkpoint => m::Operation::Checkpoint,
        Operation::Divert => m::Operation::Divert,
        Operation::Replay => m::Operation::Replay,
    }
}

fn evidence(e: Evidence) -> m::Evidence {
    match e {
        Evidence::DeletedWalGeneration => m::Evidence::DeletedWalGeneration,
        Evidence::DbReplaced => m::Evidence::DbReplaced,
        Evidence::TurnLeaseLost => m::Evidence::TurnLeaseLost,
        Evidence::CompressionInProgress => m::Evidence::CompressionInProgress,
        Evidence::CompressionClosed => m::Evidence::CompressionClosed,
        Evidence::FtsScope => m::Evidence::FtsScope,
        Evidence::CommitSent => m::Evidence::CommitSent,
    }
}

fn db_engine(e: DbEngine) -> m::Engine {
    match e {
        DbEngine::Sqlite => m::Engine::Sqlite,
        DbEngine::Postgres => m::Engine::Postgres,
    }
}

fn observation(o: Observation) -> m::Observation {
    m::Observation {
        operation: operation(o.operation),
        engine: db_engine(o.engine),
        sqlstate: o.sqlstate,
        code: o.code,
        extended_code: o.extended_code,
        message: o.message,
        errno: o.errno,
        evidence: m::Evidence::set(o.evidence.into_iter().map(evidence)),
        attempt: o.attempt.max(1),
        elapsed_ms: o.elapsed_ms,
        seed: o.seed,
        lease: o.lease.map(|h| Box::new(lease_holder(h))),
    }
}

fn lease_holder(h: engine::LeaseHolder) -> crate::LeaseHolder {
    crate::LeaseHolder {
        name: h.name,
        place: match h.place {
            engine::HolderPlace::ThisMachine => crate::HolderPlace::ThisMachine,
            engine::HolderPlace::OtherMachine => crate::HolderPlace::OtherMachine,
            engine::HolderPlace::Unknown => crate::HolderPlace::Unknown,
        },
        pid: h.pid.filter(|p| *p > 0),
        backend_pid: h.backend_pid.filter(|p| *p > 0),
        expires_ms: h.expires_ms,
    }
}

fn cause_out(c: m::Cause) -> Cause {
    match c {
        m::Cause::Locked => Cause::Locked,
        m::Cause::Disk => Cause::Disk,
        m::Cause::DiskFull => Cause::DiskFull,
        m::Cause::Replaced => Cause::Replaced,
        m::Cause::DeletedWal => Cause::DeletedWal,
        m::Cause::Corrupt => Cause::Corrupt,
        m::Cause::FtsIndex => Cause::FtsIndex,
        m::Cause::TurnLease => Cause::TurnLease,
        m::Cause::Compression => Cause::Compression,
        m::Cause::CompressionClosed => Cause::CompressionClosed,
        m::Cause::SessionRowMissing => Cause::SessionRowMissing,
        m::Cause::UidConflict => Cause::UidConflict,
        m::Cause::Unavailable => Cause::Unavailable,
        m::Cause::ReadOnly => Cause::ReadOnly,
        m::Cause::OutcomeUnknown => Cause::OutcomeUnknown,
        m::Cause::Unknown => Cause::Unknown,
    }
}

fn cause_in(c: Cause) -> m::Cause {
    match c {
        Cause::Locked => m::Cause::Locked,
        Cause::Disk => m::Cause::Disk,
        Cause::DiskFull => m::Cause::DiskFull,
        Cause::Replaced => m::Cause::Replaced,
        Cause::DeletedWal => m::Cause::DeletedWal,
        Cause::Corrupt => m::Cause::Corrupt,
        Cause::FtsIndex => m::Cause::FtsIndex,
        Cause::TurnLease => m::Cause::TurnLease,
        Cause::Compression => m::Cause::Compression,
        Cause::CompressionClosed => m::Cause::CompressionClosed,
        Cause::SessionRowMissing => m::Cause::SessionRowMissing,
        Cause::UidConflict => m::Cause::UidConflict,
        Cause::Unavailable => m::Cause::Unavailable,
        Cause::ReadOnly => m::Cause::ReadOnly,
        Cause::OutcomeUnknown => m::Cause::OutcomeUnknown,
        Cause::Unknown => m::Cause::Unknown,
    }
}

fn durability_in(d: Durability) -> m::Durability {
    match d {
        Durability::Synced => m::Durability::Synced,
        Durability::Unsynced => m::Durability::Unsynced,
    }
}

fn outcome_in(o: Outcome) -> m::Outcome {
    match o {
        Outcome::Persisted => m::Outcome::Persisted,
        Outcome::Diverted => m::Outcome::Diverted,
        Outcome::DivertFailed => m::Outcome::DivertFailed,
        Outcome::HandedBack => m::Outcome::HandedBack,
    }
}

fn outcome_out(o: m::Outcome) -> Outcome {
    match o {
        m::Outcome::Persisted => Outcome::Persisted,
        m::Outcome::Diverted => Outcome::Diverted,
        m::Outcome::DivertFailed => Outcome::DivertFailed,
        m::Outcome::HandedBack => Outcome::HandedBack,
    }
}

fn classification(c: m::Classification) -> Classification {
    Classification {
        cause: cause_out(c.cause),
        basis: match c.basis {
            m::Basis::Evidence => Basis::Evidence,
            m::Basis::Code => Basis::Code,
            m::Basis::Message => Basis::Message,
            m::Basis::None => Basis::None,
        },
    }
}

fn action(a: m::ActionKind) -> Action {
    match a {
        m::ActionKind::Retry => Action::Retry,
        m::ActionKind::Divert => Action::Divert,
        m::ActionKind::FailClosed => Action::FailClosed,
        m::ActionKind::DegradeFts => Action::DegradeFts,
        m::ActionKind::AdoptContinuation => Action::AdoptContinuation,
        m::ActionKind::RecreateSession => Action::RecreateSession,
        m::ActionKind::Resolve => Action::Resolve,
    }
}

fn cause_opt(c: Option<m::Cause>) -> Option<Cause> {
    c.map(cause_out)
}

// One conversion per WIT record, shared by events and copy contexts, so
// the component carries each once.

fn capture_failure(f: engine::CaptureFailure) -> m::CaptureFailure {
    m::CaptureFailure {
        operation: f.operation,
        errno: f.errno,
    }
}

fn divert_receipt(r: engine::DivertReceipt) -> machine::DivertReceipt {
    machine::DivertReceipt {
        path: r.path,
        offset: r.offset,
        length: r.length,
        count: r.count,
        sha256: r.sha256,
    }
}

fn capture_receipt(r: engine::CaptureReceipt) -> m::CaptureReceipt {
    // A loop, not `map(..).collect()`: see `crate::collect`.
    let mut files = Vec::with_capacity(r.files.len());
    for f in r.files {
        files.push(m::CapturedFile {
            name: f.name,
            size: f.size,
        });
    }
    m::CaptureReceipt {
        path: r.path,
        files,
        manifest_sha256: r.manifest_sha256,
    }
}

fn divert_failure(f: engine::DivertFailure) -> m::DivertFailure {
    m::DivertFailure {
        operation: f.operation,
        errno: f.errno,
    }
}

fn divert_residue(r: engine::DivertResidue) -> m::DivertResidue {
    m::DivertResidue {
        path: r.path,
        offset: r.offset,
    }
}

fn event_in(e: Event) -> machine::Event {
    match e {
        Event::Opened => machine::Event::Opened,
        Event::Committed => machine::Event::Committed,
        Event::Failed(f) => machine::Event::Failed(machine::Failure {
            engine: db_engine(f.engine),
            sqlstate: f.sqlstate,
            code: f.code,
            extended_code: f.extended_code,
            message: f.message,
            errno: f.errno,
            evidence: m::Evidence::set(f.evidence.into_iter().map(evidence)),
            elapsed_ms: f.elapsed_ms,
            lease: f.lease.map(|h| Box::new(lease_holder(h))),
        }),
        Event::Waited(elapsed_ms) => machine::Event::Waited { elapsed_ms },
        Event::Resolved(all_stored) => machine::Event::Resolved { all_stored },
        Event::Captured(r) => machine::Event::Captured(capture_receipt(r)),
        Event::CaptureFailed(e) => machine::Event::CaptureFailed {
            failure: capture_failure(e.failure),
            error: e.error,
        },
        Event::Diverted(r) => machine::Event::Diverted(divert_receipt(r)),
        Event::DivertFailed(e) => machine::Event::DivertFailed {
            failure: divert_failure(e.failure),
            message: e.message,
            residue: e.residue.map(divert_residue),
        },
    }
}

fn step_out(s: machine::Step) -> Step {
    match s {
        machine::Step::Open => Step::Open,
        machine::Step::Write(p) => Step::Write(WritePlan {
            degrade_fts: p.degrade_fts,
            recreate_session: p.recreate_session,
        }),
        machine::Step::Wait { ms } => Step::Wait(ms),
        machine::Step::Capture => Step::Capture,
        machine::Step::Resolve => Step::Resolve,
        machine::Step::Divert { cause } => Step::Divert(cause_out(cause)),
        machine::Step::Done(report) => Step::Done(report.to_json()),
    }
}

/// The handle's machine, for one call. A component instance runs one call
/// at a time and no call re-enters another, so the borrow always succeeds;
/// `try_borrow_mut` rather than `borrow_mut` keeps `RefCell`'s panic, and
/// the formatting it carries, out of the component.
fn borrowed(cell: &RefCell<machine::Handle>) -> RefMut<'_, machine::Handle> {
    match cell.try_borrow_mut() {
        Ok(m) => m,
        Err(_) => core::arch::wasm32::unreachable(),
    }
}

/// The handle resource; its flushes share its state.
struct HandleResource {
    machine: Rc<RefCell<machine::Handle>>,
}

/// One flush on a handle.
struct FlushResource {
    machine: Rc<RefCell<machine::Handle>>,
}

impl GuestHandle for HandleResource {
    fn new() -> Self {
        HandleResource {
            machine: Rc::new(RefCell::new(machine::Handle::new())),
        }
    }

    fn is_open(&self) -> bool {
        borrowed(&self.machine).is_open()
    }

    fn sticky(&self) -> Option<Cause> {
        cause_opt(borrowed(&self.machine).sticky())
    }

    fn start(&self, start: FlushStart) -> Result<Flush, String> {
        borrowed(&self.machine)
            .start(machine::FlushStart {
                session: start.session,
                uids: start.uids,
                minted_uids: start.minted_uids,
                seed: start.seed,
                pending_capture: start.pending_capture.map(|p| machine::PendingCapture {
                    path: p.path,
                    cause: cause_in(p.cause),
                }),
                durability: durability_in(start.durability),
            })
            .map_err(|e| e.message())?;
        Ok(Flush::new(FlushResource {
            machine: self.machine.clone(),
        }))
    }
}

impl GuestFlush for FlushResource {
    fn poll(&self) -> Option<Step> {
        borrowed(&self.machine).poll().map(step_out)
    }

    fn handle(&self, event: Event) -> Result<(), String> {
        borrowed(&self.machine).handle(event_in(event)).map_err(|e| e.message())
    }
}

impl Guest for Component {
    type Handle = HandleResource;
    type Flush = FlushResource;

    fn edit_step_json(request: String) -> String {
        crate::machine::edit_step_json(&request)
    }

    fn flush_step_json(request: String) -> String {
        crate::machine::flush_step_json(&request)
    }

    fn classify(o: Observation) -> Classification {
        classification(crate::classify(&observation(o)))
    }

    fn decide(o: Observation) -> Decision {
        let d = crate::decide(&observation(o));
        Decision {
            classification: classification(d.classification),
            action: action(d.action),
            delay_ms: d.delay_ms,
            sticky: d.sticky,
            capture: d.capture,
        }
    }

    fn explain(cause: Cause, outcome: Outcome, context: CopyContext) -> Result<UserCopy, String> {
        let ctx = m::CopyContext {
            session: context.session,
            receipt: context.receipt.map(divert_receipt),
            divert_failure: context.divert_failure.map(divert_failure),
            errno: context.errno,
            capture_receipt: context.capture_receipt.map(capture_receipt),
            capture_failure: context.capture_failure.map(capture_failure),
            divert_residue: context.divert_residue.map(divert_residue),
            pending_capture: context.pending_capture,
            durability: durability_in(context.durability),
            // The WIT context names no engine: `explain-json` takes one.
            engine: m::Engine::Sqlite,
            lease: context.lease.map(lease_holder),
        };
        crate::explain(cause_in(cause), outcome_in(outcome), &ctx)
            .map(|c| UserCopy {
                code: c.code,
                cause: cause_out(c.cause),
                outcome: outcome_out(c.outcome),
                title: c.title,
                body: c.body,
                remediation: c.remediation,
                details: c.details,
            })
            .map_err(|e| e.message())
    }

    fn classify_json(observation: String) -> String {
        crate::json::classify_json(&observation)
    }

    fn explain_json(request: String) -> String {
        crate::json::explain_json(&request)
    }

    fn evaluate_json(request: String) -> String {
        crate::json::evaluate_json(&request)
    }

    fn decide_lease(probe: engine::LeaseProbe) -> engine::LeaseVerdict {
        use crate::{LeaseVerdict as V, LocalProbe as L, ServerProbe as S};
        let probe = crate::LeaseProbe {
            now_ms: probe.now_ms,
            expires_ms: probe.expires_ms,
            local: match probe.local {
                engine::LocalProbe::Unrecorded => L::Unrecorded,
                engine::LocalProbe::OtherMachine => L::OtherMachine,
                engine::LocalProbe::Running => L::Running,
                engine::LocalProbe::Exited => L::Exited,
                engine::LocalProbe::PidReused => L::PidReused,
                engine::LocalProbe::Unreadable => L::Unreadable,
            },
            server: match probe.server {
                engine::ServerProbe::Unrecorded => S::Unrecorded,
                engine::ServerProbe::Alive => S::Alive,
                engine::ServerProbe::Gone => S::Gone,
                engine::ServerProbe::Unknown => S::Unknown,
            },
        };
        match crate::lease_verdict(&probe) {
            V::Free => engine::LeaseVerdict::Free,
            V::HolderExited => engine::LeaseVerdict::HolderExited,
            V::PidReused => engine::LeaseVerdict::PidReused,
            V::BackendGone => engine::LeaseVerdict::BackendGone,
            V::Stands => engine::LeaseVerdict::Stands,
        }
    }

    fn decide_lease_json(request: String) -> String {
        crate::json::decide_lease_json(&request)
    }

    fn decide_scope(observation: Observation, transaction_open: bool) -> engine::FailureScope {
        match machine::failure_scope(&self::observation(observation), transaction_open) {
            machine::Scope::Batch => engine::FailureScope::Batch,
            machine::Scope::Transaction => engine::FailureScope::Transaction,
        }
    }

    fn decide_scope_json(request: String) -> String {
        crate::json::decide_scope_json(&request)
    }

    fn version() -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }
}

export!(Component);
