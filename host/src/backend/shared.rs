//! A store many threads write through at once: [`SharedStore`] is cheap to
//! clone, `Send + Sync`, and answers every batch with its own outcome. It
//! runs over any [`Backend`], held as one boxed engine: SQLite
//! (`SharedStore::open`, in `crate::store`) or PostgreSQL
//! ([`SharedStore::over`] a `crate::pg::PgStore`).
//!
//! Group commit: a caller queues its batch, and if a lane is free it leads
//! a group, taking the batches waiting (at most [`GROUP_MAX_BATCHES`]
//! batches or [`GROUP_MAX_BYTES`] of messages) into one transaction with
//! one sync ([`crate::backend::group`]). Batches that arrive while it
//! runs wait for the next one. Each caller gets its outcome only after the
//! commit that made its batch durable, or after its batch settled
//! otherwise (diverted with its own receipt, or handed back).
//!
//! Pipelined groups: an engine that offers a [`Pipeline`] (PostgreSQL)
//! gives the store up to `depth` lanes, each a handle with its own
//! connection, so while one group's COMMIT waits for the server's WAL
//! flush the next group is written on another lane. Two rules keep every
//! guarantee of one lane:
//! - A session is in at most one running group. A batch whose session has
//!   a batch in a running group waits, and so does every later batch of
//!   that session, so a session's batch never commits before the one it
//!   sent first, and each session's cursor (its lease token and next seq)
//!   is moved into the lane that runs its group and back out after it.
//! - A call (a read or an edit) runs alone, on the first lane, once no
//!   group runs, with every session's cursor.
//!
//! Each lane's flush machines keep their own handle state; the identity
//! guard is the engine's to share between its lanes (PostgreSQL's does:
//! a server one lane refuses, every lane refuses).
//!
//! A caller that must not block (an event loop) hands its batch over with
//! [`SharedStore::append_batch_then`] and is called back with the outcome.
//! Nobody waits for such a batch, so the store keeps committer threads of
//! its own (one per lane at most), started when such a batch finds none
//! idle, that lead the groups no waiting caller leads. They never hold a
//! handle: when the last [`SharedStore`] is dropped they commit what is
//! queued, call every callback, and end before the drop returns, so the
//! database is closed (and the leases given back) by then, as without
//! them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::{Cursor, Engine, GROUP_MAX_BATCHES, GROUP_MAX_BYTES, Pipeline};
use crate::ids::SessionId;
use crate::message::Message;
use crate::outcome::FlushOutcome;

/// How long an idle committer thread looks for the next batch before it
/// sleeps.
const COMMITTER_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// The engine it writes through, whichever it is.
type Held = Box<dyn Engine + Send>;

/// A handle on a turnsafe home that many threads share.
pub struct SharedStore {
    home: PathBuf,
    inner: Arc<Inner>,
}

struct Inner {
    /// The lanes' handles: the first is the engine the store was given;
    /// the others are made by `make` when a group first needs them.
    lanes: Vec<Mutex<Option<Held>>>,
    make: Option<Box<dyn Fn() -> Held + Send + Sync>>,
    queue: Mutex<Queue>,
    /// Signalled whenever a group or a call ends.
    settled: Condvar,
    /// Signalled for the committer threads: a batch nobody waits for was
    /// queued, a group ended with batches still waiting, or the last handle
    /// is gone.
    work: Condvar,
    /// [`SharedStore`] values alive (the committer threads hold none).
    handles: AtomicUsize,
    /// Batches queued, readable without the queue's lock (the committer's
    /// spin reads it).
    queued: AtomicUsize,
    committers: Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Queued>,
    /// Work on the store handed over with [`SharedStore::call_then`], by
    /// ticket: each runs alone, after every batch queued before it.
    calls: VecDeque<(u64, Call)>,
    /// Outcomes not yet collected by their callers, by ticket.
    done: HashMap<u64, FlushOutcome>,
    /// Which lanes run a group or a call now.
    busy: Vec<bool>,
    /// The sessions of the running groups.
    running: HashSet<String>,
    /// Each session's cursor while no group of it runs.
    cursors: HashMap<String, Cursor>,
    /// A call, or a caller of [`SharedStore::with_store`], has the store.
    exclusive: bool,
    /// Callers of [`SharedStore::with_store`] waiting for the store: no
    /// group starts meanwhile.
    exclusive_waiting: usize,
    next_ticket: u64,
    /// Committer threads alive.
    committers: usize,
    /// Committer threads with nothing to do (spinning or asleep).
    committers_idle: usize,
    /// Callers waiting on `settled` (a group's end wakes them only then).
    waiters: usize,
    /// The last handle is gone: the committers end once nothing waits.
    closing: bool,
}

/// A piece of work on the store, run on a committer thread.
type Call = Box<dyn FnOnce(&mut dyn Engine) + Send>;

/// Who takes a batch's outcome.
enum Reply {
    /// A caller blocked in [`SharedStore::append_batch`], from `done`.
    Waiting,
    /// A caller that went on: called on the thread that committed the group.
    Then(Box<dyn FnOnce(FlushOutcome) + Send>),
}

struct Queued {
    ticket: u64,
    session: SessionId,
    messages: Vec<Message>,
    /// A LangGraph checkpoint or writes instead of messages.
    graph: Option<crate::graph::GraphBatch>,
    reply: Reply,
}

/// What a leader takes off the queue.
enum Work {
    Call(Call),
    Group {
        lane: usize,
        group: Vec<Queued>,
        cursors: Vec<(String, Cursor)>,
    },
}

impl Clone for SharedStore {
    fn clone(&self) -> SharedStore {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        SharedStore {
            home: self.home.clone(),
            inner: Arc::clone(&self.inner),
        }
    }
}

impl Drop for SharedStore {
    /// The last handle ends the committer threads after they have committed
    /// every batch handed over and called back, so nothing queued is lost
    /// and the store closes here, not later on another thread.
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.inner.queue().closing = true;
        self.inner.work.notify_all();
        // A committer may start another while it works: join until none is left.
        loop {
            let threads = {
                let queue = self.inner.queue();
                let threads = std::mem::take(&mut *self.inner.committers.lock().unwrap_or_else(|p| p.into_inner()));
                if threads.is_empty() && queue.committers == 0 {
                    break;
                }
                threads
            };
            if threads.is_empty() {
                std::thread::yield_now();
            }
            for thread in threads {
                if thread.thread().id() == std::thread::current().id() {
                    // Dropped from a callback on a committer thread: that
                    // thread ends on its own once nothing is queued.
                    return;
                }
                // A panic on that thread was already caught per group and per callback.
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Inner {
    /// Every session's cursor goes back to the first lane before the lanes
    /// close, so the handle that gives the leases back knows them all.
    fn drop(&mut self) {
        let cursors = std::mem::take(&mut self.queue.get_mut().unwrap_or_else(|p| p.into_inner()).cursors);
        if let Some(first) = self.lanes.first_mut()
            && let Some(engine) = first.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut()
        {
            engine.ledger().sessions.extend(cursors);
        }
    }
}

impl SharedStore {
    /// Share `store`, whose divert folder is under `home`.
    pub fn over(store: impl Engine + Send + 'static, home: &Path) -> SharedStore {
        SharedStore::over_engine(Box::new(store), home)
    }

    /// Share an engine already boxed (chosen at run time), with the lanes
    /// its [`Pipeline`] offers.
    pub fn over_engine(store: Box<dyn Engine + Send>, home: &Path) -> SharedStore {
        let pipeline: Option<Pipeline> = store.pipeline();
        let depth = pipeline.as_ref().map_or(1, |p| p.depth.max(1));
        let mut lanes = vec![Mutex::new(Some(store))];
        lanes.extend((1..depth).map(|_| Mutex::new(None)));
        SharedStore {
            home: home.to_path_buf(),
            inner: Arc::new(Inner {
                lanes,
                make: pipeline.map(|p| p.make),
                queue: Mutex::new(Queue {
                    busy: vec![false; depth],
                    ..Queue::default()
                }),
                settled: Condvar::new(),
                work: Condvar::new(),
                handles: AtomicUsize::new(1),
                queued: AtomicUsize::new(0),
                committers: Mutex::new(Vec::new()),
            }),
        }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// How many groups may be in flight at once.
    pub fn lanes(&self) -> usize {
        self.inner.lanes.len()
    }

    /// Flush one batch, committed together with the batches other threads
    /// send meanwhile; see [`crate::backend::group`] for what a group
    /// guarantees each batch.
    pub fn append_batch(&self, session: &SessionId, messages: &[Message]) -> FlushOutcome {
        let inner = &*self.inner;
        let mut queue = inner.queue();
        let ticket = inner.queue_batch(&mut queue, session, messages.to_vec(), Reply::Waiting);
        loop {
            if let Some(outcome) = queue.done.remove(&ticket) {
                return outcome;
            }
            queue = inner.step(queue);
        }
    }

    /// Flush one LangGraph checkpoint or one task's writes, committed
    /// together with whatever other threads send meanwhile.
    pub fn put_graph(&self, graph: crate::graph::GraphBatch) -> FlushOutcome {
        let inner = &*self.inner;
        let mut queue = inner.queue();
        let ticket = inner.queue_graph(&mut queue, graph, Reply::Waiting);
        loop {
            if let Some(outcome) = queue.done.remove(&ticket) {
                return outcome;
            }
            queue = inner.step(queue);
        }
    }

    /// [`SharedStore::put_graph`] without waiting, as
    /// [`SharedStore::append_batch_then`].
    pub fn put_graph_then(&self, graph: crate::graph::GraphBatch, then: impl FnOnce(FlushOutcome) + Send + 'static) {
        let mut queue = self.inner.queue();
        self.inner.queue_graph(&mut queue, graph, Reply::Then(Box::new(then)));
        self.inner.hand_over(queue);
    }

    /// Hand one batch over without waiting: it joins the next group commit
    /// like any other, and `then` is called with its outcome, exactly once,
    /// on the thread that committed the group (never before this returns;
    /// on the caller's only when no thread can be started). The batch is
    /// committed, diverted or handed back even if every handle is dropped
    /// meanwhile.
    ///
    /// `then` runs while other callers may be waiting for the next group:
    /// it should only pass the outcome on.
    pub fn append_batch_then(
        &self,
        session: &SessionId,
        messages: Vec<Message>,
        then: impl FnOnce(FlushOutcome) + Send + 'static,
    ) {
        let mut queue = self.inner.queue();
        self.inner
            .queue_batch(&mut queue, session, messages, Reply::Then(Box::new(then)));
        self.inner.hand_over(queue);
    }

    /// Run `f` with the store on a committer thread, after every batch
    /// handed over or queued before it (a read then sees them settled), and
    /// call `then` with its result there: `None` if `f` panicked. `then`
    /// is called exactly once, even if every handle is dropped meanwhile.
    /// For reads and edits from a caller that must not block.
    pub fn call_then<T: 'static>(
        &self,
        f: impl FnOnce(&mut dyn Engine) -> T + Send + 'static,
        then: impl FnOnce(Option<T>) + Send + 'static,
    ) {
        let call: Call = Box::new(move |store: &mut dyn Engine| {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(store)));
            if result.is_err() {
                tracing::error!("a call on the store panicked");
            }
            then(result.ok());
        });
        let mut queue = self.inner.queue();
        let ticket = self.inner.ticket(&mut queue);
        queue.calls.push_back((ticket, call));
        self.inner.hand_over(queue);
    }

    /// Wait until every batch queued so far has settled (committed,
    /// diverted or handed back): for a process about to exit with batches
    /// handed over that nobody waits for.
    pub fn settle(&self) {
        drop(self.inner.settle(self.inner.queue()));
    }

    /// Batches queued for the next group commit.
    pub fn waiting(&self) -> usize {
        self.inner.queue().waiting.len()
    }

    /// Give back this store's turn lease on `session`.
    pub fn release_lease(&self, session: &SessionId) {
        self.with_store(|store| store.release_lease(session));
    }

    /// Run `f` with the store held alone (no group running, every
    /// session's cursor in it), for reads that must see its state.
    pub fn with_store<T>(&self, f: impl FnOnce(&mut dyn Engine) -> T) -> T {
        let inner = &*self.inner;
        let mut queue = inner.queue();
        queue.exclusive_waiting += 1;
        while queue.exclusive || queue.busy.iter().any(|&b| b) {
            queue = inner.wait_settled(queue);
        }
        queue.exclusive_waiting -= 1;
        queue.exclusive = true;
        queue.busy[0] = true;
        drop(queue);
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| inner.alone(f)));
        let mut queue = inner.queue();
        queue.exclusive = false;
        queue.busy[0] = false;
        inner.end_lead(&mut queue);
        drop(queue);
        match result {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Queue {
    fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.calls.is_empty()
    }

    fn any_busy(&self) -> bool {
        self.busy.iter().any(|&b| b)
    }
}

impl Inner {
    /// A lane's handle, even after a caller panicked while holding it:
    /// every flush runs its own machines, so the handle stays sound.
    fn lane(&self, i: usize) -> MutexGuard<'_, Option<Held>> {
        self.lanes[i].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The ticket of a batch or call being queued, counted in `queued`.
    fn ticket(&self, queue: &mut Queue) -> u64 {
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        self.queued.fetch_add(1, Ordering::Release);
        ticket
    }

    fn queue_batch(&self, queue: &mut Queue, session: &SessionId, messages: Vec<Message>, reply: Reply) -> u64 {
        let ticket = self.ticket(queue);
        queue.waiting.push_back(Queued {
            ticket,
            session: session.clone(),
            messages,
            graph: None,
            reply,
        });
        ticket
    }

    fn queue_graph(&self, queue: &mut Queue, graph: crate::graph::GraphBatch, reply: Reply) -> u64 {
        let ticket = self.ticket(queue);
        queue.waiting.push_back(Queued {
            ticket,
            session: SessionId::graph(graph.thread_id()),
            messages: Vec::new(),
            graph: Some(graph),
            reply,
        });
        ticket
    }

    /// Run `f` on the first lane with every session's cursor in it (the
    /// caller holds the store alone).
    fn alone<T>(&self, f: impl FnOnce(&mut dyn Engine) -> T) -> T {
        let mut lane = self.lane(0);
        let Some(engine) = lane.as_mut() else {
            unreachable!("the first lane always holds the engine the store was given")
        };
        let cursors = std::mem::take(&mut self.queue().cursors);
        engine.ledger().sessions.extend(cursors);
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut **engine)));
        let back = std::mem::take(&mut engine.ledger().sessions);
        self.queue().cursors.extend(back);
        match result {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Make sure a committer thread takes what was just handed over: wake
    /// an idle one, or start one while a lane has none.
    fn hand_over(self: &Arc<Self>, mut queue: MutexGuard<'_, Queue>) {
        if queue.committers_idle > 0 {
            self.work.notify_one();
            return;
        }
        if queue.committers >= self.lanes.len() || (queue.committers > 0 && !queue.busy.iter().any(|&b| !b)) {
            return;
        }
        let worker = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("turnsafe-commit".into())
            .spawn(move || worker.run_committer());
        match spawned {
            Ok(thread) => {
                queue.committers += 1;
                drop(queue);
                self.committers.lock().unwrap_or_else(|p| p.into_inner()).push(thread);
            }
            Err(e) if queue.committers == 0 => {
                // No thread to be had (a process at its thread limit): do
                // the work here rather than leave it waiting for nobody.
                tracing::warn!(error = %e, "no committer thread; committing on the caller's thread");
                drop(self.settle(queue));
            }
            Err(e) => tracing::warn!(error = %e, "no further committer thread; the running ones take the work"),
        }
    }

    /// One step of the queue's work from a caller's thread: lead the next
    /// group (or call) if one can start, else wait for a running one.
    fn step<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        match self.next_work(&mut queue) {
            Some(work) => self.run(queue, work),
            None => self.wait_settled(queue),
        }
    }

    /// Work from this thread until nothing is queued or running.
    fn settle<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        while queue.any_busy() || queue.exclusive || queue.has_work() {
            queue = self.step(queue);
        }
        queue
    }

    /// Wait for a running group or call to end.
    fn wait_settled<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        queue.waiters += 1;
        let mut queue = self.settled.wait(queue).unwrap_or_else(|p| p.into_inner());
        queue.waiters -= 1;
        queue
    }

    /// The oldest work that can start now, taken off the queue: a call
    /// (alone, once nothing runs), or a group on a free lane of the batches
    /// queued before any call whose sessions no running group holds.
    fn next_work(&self, queue: &mut Queue) -> Option<Work> {
        if queue.exclusive || queue.exclusive_waiting > 0 {
            return None;
        }
        let first_call = queue.calls.front().map(|&(ticket, _)| ticket);
        let call_first = match (first_call, queue.waiting.front()) {
            (Some(call), Some(batch)) => call < batch.ticket,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if call_first {
            if queue.any_busy() {
                return None;
            }
            let (_, call) = queue.calls.pop_front()?;
            self.queued.fetch_sub(1, Ordering::Release);
            queue.exclusive = true;
            queue.busy[0] = true;
            return Some(Work::Call(call));
        }
        let lane = queue.busy.iter().position(|&b| !b)?;
        let group = take_group(&mut queue.waiting, first_call, &queue.running);
        if group.is_empty() {
            return None;
        }
        self.queued.fetch_sub(group.len(), Ordering::Release);
        queue.busy[lane] = true;
        let mut cursors = Vec::new();
        for q in &group {
            let id = q.session.as_str();
            if queue.running.insert(id.to_string())
                && let Some(c) = queue.cursors.remove(id)
            {
                cursors.push((id.to_string(), c));
            }
        }
        Some(Work::Group { lane, group, cursors })
    }

    /// Run `work` taken by [`Inner::next_work`], settle each batch of it,
    /// and return the queue locked again.
    fn run<'a>(&'a self, queue: MutexGuard<'a, Queue>, work: Work) -> MutexGuard<'a, Queue> {
        drop(queue);
        let (lane, group, cursors) = match work {
            Work::Call(call) => {
                self.alone(call);
                let mut queue = self.queue();
                queue.exclusive = false;
                queue.busy[0] = false;
                self.end_lead(&mut queue);
                return queue;
            }
            Work::Group { lane, group, cursors } => (lane, group, cursors),
        };
        let (outcomes, back) = self.commit(lane, &group, cursors);
        let mut calls = Vec::new();
        let mut queue = self.queue();
        queue.cursors.extend(back);
        for q in &group {
            queue.running.remove(q.session.as_str());
        }
        queue.busy[lane] = false;
        for (queued, outcome) in group.into_iter().zip(outcomes) {
            match queued.reply {
                Reply::Waiting => {
                    queue.done.insert(queued.ticket, outcome);
                }
                Reply::Then(then) => calls.push((then, outcome)),
            }
        }
        self.end_lead(&mut queue);
        drop(queue);
        for (then, outcome) in calls {
            if std::panic::catch_unwind(AssertUnwindSafe(move || then(outcome))).is_err() {
                tracing::error!("a batch's outcome callback panicked");
            }
        }
        self.queue()
    }

    /// A group or call ended: wake whoever waits for that.
    fn end_lead(&self, queue: &mut Queue) {
        if queue.waiters > 0 {
            self.settled.notify_all();
        }
        if queue.committers_idle > 0 && (queue.has_work() || queue.closing) {
            self.work.notify_all();
        }
    }

    /// A committer thread: lead every group no waiting caller leads, until
    /// the last handle is gone and nothing is queued.
    fn run_committer(self: Arc<Inner>) {
        let mut queue = self.queue();
        loop {
            if let Some(work) = self.next_work(&mut queue) {
                // More waiting than this thread takes, and a lane free: a
                // second committer writes it while this one commits.
                if queue.has_work() && queue.committers_idle == 0 {
                    self.hand_over_more(&mut queue);
                }
                queue = self.run(queue, work);
            } else if queue.closing && !queue.has_work() {
                queue.committers -= 1;
                self.work.notify_all();
                return;
            } else if queue.has_work() || queue.closing {
                // Waiting on a running group, a session in one, or a call.
                queue = self.sleep(queue);
            } else {
                // Idle. The next batch of a caller taking turns with the
                // store (one session: its outcome, then its next batch) comes
                // within tens of microseconds; a short spin meets it without
                // a sleep and a wake-up on either side.
                queue.committers_idle += 1;
                drop(queue);
                let until = std::time::Instant::now() + COMMITTER_SPIN;
                while self.queued.load(Ordering::Acquire) == 0 && std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
                queue = self.queue();
                queue.committers_idle -= 1;
                if !queue.has_work() && !queue.closing {
                    queue = self.sleep(queue);
                }
            }
        }
    }

    /// Start one more committer thread while lanes outnumber them.
    fn hand_over_more(self: &Arc<Self>, queue: &mut Queue) {
        if queue.committers >= self.lanes.len() || !queue.busy.iter().any(|&b| !b) {
            return;
        }
        let worker = Arc::clone(self);
        match std::thread::Builder::new()
            .name("turnsafe-commit".into())
            .spawn(move || worker.run_committer())
        {
            Ok(thread) => {
                queue.committers += 1;
                self.committers.lock().unwrap_or_else(|p| p.into_inner()).push(thread);
            }
            Err(e) => tracing::warn!(error = %e, "no further committer thread; the running ones take the work"),
        }
    }

    fn sleep<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        queue.committers_idle += 1;
        let mut queue = self.work.wait(queue).unwrap_or_else(|p| p.into_inner());
        queue.committers_idle -= 1;
        queue
    }

    /// Commit one group on `lane`, its sessions' `cursors` moved in for it;
    /// returns each batch's outcome and the cursors to move back out. A
    /// panic inside hands every batch of it back rather than leaving its
    /// callers waiting forever.
    fn commit(
        &self,
        lane: usize,
        group: &[Queued],
        cursors: Vec<(String, Cursor)>,
    ) -> (Vec<FlushOutcome>, Vec<(String, Cursor)>) {
        let batches: Vec<crate::backend::group::Item<'_>> = group
            .iter()
            .map(|q| (&q.session, q.messages.as_slice(), q.graph.as_ref()))
            .collect();
        let mut held = self.lane(lane);
        if held.is_none() {
            *held = self.make.as_ref().map(|make| make());
        }
        let Some(store) = held.as_mut() else {
            unreachable!("a lane past the first exists only with a pipeline that makes its handle")
        };
        let store: &mut dyn Engine = &mut **store;
        store.ledger().sessions.extend(cursors);
        let outcomes =
            match std::panic::catch_unwind(AssertUnwindSafe(|| crate::backend::group::flush_group(store, &batches))) {
                Ok(outcomes) => outcomes,
                Err(_) => {
                    tracing::error!(
                        batches = group.len(),
                        "a group commit panicked; its batches are handed back"
                    );
                    batches
                        .iter()
                        .map(|&(session, messages, graph)| match graph {
                            Some(g) => crate::backend::group::graph_handed_back(store, g),
                            None => crate::backend::group::handed_back(store, session, messages),
                        })
                        .collect()
                }
            };
        let sessions = &mut store.ledger().sessions;
        let back = group
            .iter()
            .filter_map(|q| {
                let id = q.session.as_str();
                Some((id.to_string(), sessions.remove(id)?))
            })
            .collect();
        (outcomes, back)
    }
}

/// The oldest waiting batches, up to the group's bounds (the first taken
/// always goes, however large), none queued after the call `before` (it
/// runs between the two), and none of a session in `running` or of one a
/// batch was left behind for (a session's batches go in the order sent).
/// Sizes are measured only when a second batch joins, so a lone batch pays
/// nothing for the bound.
fn take_group(waiting: &mut VecDeque<Queued>, before: Option<u64>, running: &HashSet<String>) -> Vec<Queued> {
    let mut group: Vec<Queued> = Vec::new();
    let mut left: VecDeque<Queued> = VecDeque::new();
    let mut held_back: HashSet<String> = HashSet::new();
    let mut bytes: Option<usize> = None;
    while let Some(next) = waiting.pop_front() {
        if before.is_some_and(|call| next.ticket > call) {
            waiting.push_front(next);
            break;
        }
        let id = next.session.as_str();
        if running.contains(id) || held_back.contains(id) {
            held_back.insert(id.to_string());
            left.push_back(next);
            continue;
        }
        if let Some(first) = group.first() {
            let so_far = *bytes.get_or_insert_with(|| first.bytes());
            let size = next.bytes();
            if group.len() >= GROUP_MAX_BATCHES || so_far + size > GROUP_MAX_BYTES {
                waiting.push_front(next);
                break;
            }
            bytes = Some(so_far + size);
        }
        group.push(next);
    }
    // What was left behind goes back in front, in its order.
    while let Some(q) = left.pop_back() {
        waiting.push_front(q);
    }
    group
}

impl Queued {
    fn bytes(&self) -> usize {
        let graph = self.graph.as_ref().map_or(0, crate::graph::GraphBatch::encoded_len);
        graph + self.messages.iter().map(Message::encoded_len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + Clone>() {}

    fn queued(n: usize, bytes_each: usize) -> VecDeque<Queued> {
        (0..n)
            .map(|i| Queued {
                ticket: i as u64,
                session: SessionId::new("s").unwrap(),
                messages: vec![Message::new("user", &"x".repeat(bytes_each))],
                graph: None,
                reply: Reply::Waiting,
            })
            .collect()
    }

    #[test]
    fn a_group_is_bounded_by_batches_and_bytes() {
        let none = HashSet::new();
        let mut q = queued(70, 10);
        assert_eq!(take_group(&mut q, None, &none).len(), GROUP_MAX_BATCHES);
        assert_eq!(take_group(&mut q, None, &none).len(), 6);
        assert!(take_group(&mut q, None, &none).is_empty());
        // About 400 KB each: two fit in 1 MiB, three do not.
        let mut q = queued(5, 400_000);
        let sizes: Vec<usize> =
            std::iter::from_fn(|| Some(take_group(&mut q, None, &none).len()).filter(|&n| n > 0)).collect();
        assert_eq!(sizes, [2, 2, 1]);
        // A batch larger than the bound still goes, alone.
        let mut q = queued(2, 2 << 20);
        assert_eq!(take_group(&mut q, None, &none).len(), 1);
        assert_eq!(take_group(&mut q, None, &none).len(), 1);
    }

    #[test]
    fn is_send_sync_and_clone() {
        assert_send_sync::<SharedStore>();
    }
}
