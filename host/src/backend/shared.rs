//! A store many threads write through at once: [`SharedStore`] is cheap to
//! clone, `Send + Sync`, and answers every batch with its own outcome. It
//! runs over any [`Backend`], held as one boxed engine: SQLite
//! (`SharedStore::open`, in `crate::store`) or PostgreSQL
//! ([`SharedStore::over`] a `crate::pg::PgStore`).
//!
//! Group commit: a caller queues its batch, and if no commit is running it
//! leads one, taking every batch waiting (at most [`GROUP_MAX_BATCHES`]
//! batches or [`GROUP_MAX_BYTES`] of messages) into one transaction with
//! one sync ([`crate::backend::group`]). Batches that arrive while it
//! runs wait for the next one. Each caller gets its outcome only after the
//! commit that made its batch durable, or after its batch settled
//! otherwise (diverted with its own receipt, or handed back).
//!
//! A caller that must not block (an event loop) hands its batch over with
//! [`SharedStore::append_batch_then`] and is called back with the outcome.
//! Nobody waits for such a batch, so the store keeps one committer thread
//! of its own, started at the first such batch, that leads the groups no
//! waiting caller leads. It never holds a handle: when the last
//! [`SharedStore`] is dropped it commits what is queued, calls every
//! callback, and ends before the drop returns, so the database is closed
//! (and the leases given back) by then, as without it.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::{Engine, GROUP_MAX_BATCHES, GROUP_MAX_BYTES};
use crate::ids::SessionId;
use crate::message::Message;
use crate::outcome::FlushOutcome;

/// How long the idle committer thread looks for the next batch before it
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
    store: Mutex<Held>,
    queue: Mutex<Queue>,
    /// Signalled whenever a group settles.
    settled: Condvar,
    /// Signalled for the committer thread: a batch nobody waits for was
    /// queued, a group ended with batches still waiting, or the last handle
    /// is gone.
    work: Condvar,
    /// [`SharedStore`] values alive (the committer thread holds none).
    handles: AtomicUsize,
    /// Batches queued, readable without the queue's lock (the committer's
    /// spin reads it).
    queued: AtomicUsize,
    committer: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Queued>,
    /// Work on the store handed over with [`SharedStore::call_then`], by
    /// ticket: each runs alone, after every batch queued before it.
    calls: VecDeque<(u64, Call)>,
    /// Outcomes not yet collected by their callers, by ticket.
    done: HashMap<u64, FlushOutcome>,
    /// A caller is committing a group.
    leading: bool,
    next_ticket: u64,
    /// The committer thread was started (and has not ended).
    committer: bool,
    /// The committer thread sleeps on `work` (it must be woken).
    committer_asleep: bool,
    /// Callers waiting on `settled` (a group's end wakes them only then).
    waiters: usize,
    /// The last handle is gone: the committer ends once nothing waits.
    closing: bool,
}

/// A piece of work on the store, run on the committer thread.
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
    /// The last handle ends the committer thread after it has committed
    /// every batch handed over and called back, so nothing queued is lost
    /// and the store closes here, not later on another thread.
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.inner.queue().closing = true;
        self.inner.work.notify_all();
        let committer = self.inner.committer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = committer
            && thread.thread().id() != std::thread::current().id()
        {
            // A panic on that thread was already caught per group and per callback.
            let _ = thread.join();
        }
    }
}

impl SharedStore {
    /// Share `store`, whose divert folder is under `home`.
    pub fn over(store: impl Engine + Send + 'static, home: &Path) -> SharedStore {
        SharedStore::over_engine(Box::new(store), home)
    }

    /// Share an engine already boxed (chosen at run time).
    pub fn over_engine(store: Box<dyn Engine + Send>, home: &Path) -> SharedStore {
        SharedStore {
            home: home.to_path_buf(),
            inner: Arc::new(Inner {
                store: Mutex::new(store),
                queue: Mutex::new(Queue::default()),
                settled: Condvar::new(),
                work: Condvar::new(),
                handles: AtomicUsize::new(1),
                queued: AtomicUsize::new(0),
                committer: Mutex::new(None),
            }),
        }
    }

    pub fn home(&self) -> &Path {
        &self.home
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
        self.hand_over(queue);
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
        self.hand_over(queue);
    }

    /// Run `f` with the store on the committer thread, after every batch
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
        self.hand_over(queue);
    }

    /// Make sure the committer thread takes what was just queued: wake it,
    /// or start it at the first hand-over.
    fn hand_over<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) {
        let inner = &self.inner;
        if queue.committer {
            if queue.committer_asleep && !queue.leading {
                inner.work.notify_one();
            }
            return;
        }
        let worker = Arc::clone(inner);
        let spawned = std::thread::Builder::new()
            .name("turnsafe-commit".into())
            .spawn(move || worker.run_committer());
        match spawned {
            Ok(thread) => {
                queue.committer = true;
                drop(queue);
                *inner.committer.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
            }
            Err(e) => {
                // No thread to be had (a process at its thread limit): do
                // the work here rather than leave it waiting for nobody.
                tracing::warn!(error = %e, "no committer thread; committing on the caller's thread");
                drop(inner.settle(queue));
            }
        }
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
        self.inner.lock().release_lease(session);
    }

    /// Run `f` with the store held, for reads that must see its state.
    pub fn with_store<T>(&self, f: impl FnOnce(&mut dyn Engine) -> T) -> T {
        f(&mut **self.inner.lock())
    }
}

impl Queue {
    fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.calls.is_empty()
    }
}

impl Inner {
    /// The store, even after a caller panicked while holding it: every
    /// flush runs its own machines, so the handle stays sound.
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// One step of the queue's work from a caller's thread: wait for the
    /// running group if there is one, else lead the next.
    fn step<'a>(&'a self, queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        if queue.leading {
            self.wait_settled(queue)
        } else {
            self.lead(queue)
        }
    }

    /// Work from this thread until nothing is queued or running.
    fn settle<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        while queue.leading || queue.has_work() {
            queue = self.step(queue);
        }
        queue
    }

    /// Wait for the group being committed to settle.
    fn wait_settled<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        queue.waiters += 1;
        let mut queue = self.settled.wait(queue).unwrap_or_else(|p| p.into_inner());
        queue.waiters -= 1;
        queue
    }

    /// Run the oldest queued work (the queue must have some and no leader):
    /// a call alone, or a group of the batches queued before any call;
    /// settle each batch, and return the queue locked again.
    fn lead<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        queue.leading = true;
        let first_call = queue.calls.front().map(|&(ticket, _)| ticket);
        let call_first = match (first_call, queue.waiting.front()) {
            (Some(call), Some(batch)) => call < batch.ticket,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if call_first && let Some((_, call)) = queue.calls.pop_front() {
            self.queued.fetch_sub(1, Ordering::Release);
            drop(queue);
            call(&mut **self.lock());
            let mut queue = self.queue();
            self.end_lead(&mut queue);
            return queue;
        }
        let group = take_group(&mut queue.waiting, first_call);
        self.queued.fetch_sub(group.len(), Ordering::Release);
        drop(queue);
        let outcomes = self.commit(&group);
        let mut calls = Vec::new();
        let mut queue = self.queue();
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

    /// No longer leading: wake whoever waits for that.
    fn end_lead(&self, queue: &mut Queue) {
        queue.leading = false;
        if queue.waiters > 0 {
            self.settled.notify_all();
        }
        if queue.committer_asleep && (queue.has_work() || queue.closing) {
            self.work.notify_one();
        }
    }

    /// The committer thread: lead every group no waiting caller leads, until
    /// the last handle is gone and nothing is queued.
    fn run_committer(self: Arc<Inner>) {
        let mut queue = self.queue();
        loop {
            if !queue.leading && queue.has_work() {
                queue = self.lead(queue);
            } else if queue.closing && !queue.has_work() && !queue.leading {
                queue.committer = false;
                return;
            } else if queue.leading || queue.closing {
                queue = self.sleep(queue);
            } else {
                // Idle. The next batch of a caller taking turns with the
                // store (one session: its outcome, then its next batch) comes
                // within tens of microseconds; a short spin meets it without
                // a sleep and a wake-up on either side.
                drop(queue);
                let until = std::time::Instant::now() + COMMITTER_SPIN;
                while self.queued.load(Ordering::Acquire) == 0 && std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
                queue = self.queue();
                if !queue.has_work() && !queue.closing {
                    queue = self.sleep(queue);
                }
            }
        }
    }

    fn sleep<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        queue.committer_asleep = true;
        let mut queue = self.work.wait(queue).unwrap_or_else(|p| p.into_inner());
        queue.committer_asleep = false;
        queue
    }

    /// Commit one group. A panic inside hands every batch of it back
    /// rather than leaving its callers waiting forever.
    fn commit(&self, group: &[Queued]) -> Vec<FlushOutcome> {
        let batches: Vec<crate::backend::group::Item<'_>> = group
            .iter()
            .map(|q| (&q.session, q.messages.as_slice(), q.graph.as_ref()))
            .collect();
        let mut store = self.lock();
        let store: &mut dyn Engine = &mut **store;
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
        }
    }
}

/// The oldest waiting batches, up to the group's bounds (the first is
/// always taken, however large), and none queued after the call `before`
/// (it runs between the two). Sizes are measured only when a second batch
/// is waiting, so a lone batch pays nothing for the bound.
fn take_group(waiting: &mut VecDeque<Queued>, before: Option<u64>) -> Vec<Queued> {
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let mut group = vec![first];
    if waiting.is_empty() {
        return group;
    }
    let mut bytes = group[0].bytes();
    while let Some(next) = waiting.front() {
        if before.is_some_and(|call| next.ticket > call) {
            break;
        }
        let size = next.bytes();
        if group.len() >= GROUP_MAX_BATCHES || bytes + size > GROUP_MAX_BYTES {
            break;
        }
        bytes += size;
        match waiting.pop_front() {
            Some(q) => group.push(q),
            None => break,
        }
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
        let mut q = queued(70, 10);
        assert_eq!(take_group(&mut q, None).len(), GROUP_MAX_BATCHES);
        assert_eq!(take_group(&mut q, None).len(), 6);
        assert!(take_group(&mut q, None).is_empty());
        // About 400 KB each: two fit in 1 MiB, three do not.
        let mut q = queued(5, 400_000);
        let sizes: Vec<usize> =
            std::iter::from_fn(|| Some(take_group(&mut q, None).len()).filter(|&n| n > 0)).collect();
        assert_eq!(sizes, [2, 2, 1]);
        // A batch larger than the bound still goes, alone.
        let mut q = queued(2, 2 << 20);
        assert_eq!(take_group(&mut q, None).len(), 1);
        assert_eq!(take_group(&mut q, None).len(), 1);
    }

    #[test]
    fn is_send_sync_and_clone() {
        assert_send_sync::<SharedStore>();
    }
}
