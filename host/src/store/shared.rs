//! A store many threads write through at once: [`SharedStore`] is cheap to
//! clone, `Send + Sync`, and answers every batch with its own outcome.
//!
//! Group commit: a caller queues its batch, and if no commit is running it
//! leads one, taking every batch waiting (at most [`GROUP_MAX_BATCHES`]
//! batches or [`GROUP_MAX_BYTES`] of messages) into one transaction with
//! one sync ([`SessionStore::append_group`]). Batches that arrive while it
//! runs wait for the next one. Each caller gets its outcome only after the
//! commit that made its batch durable, or after its batch settled
//! otherwise (diverted with its own receipt, or handed back).

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::{GROUP_MAX_BATCHES, GROUP_MAX_BYTES, SessionId, SessionStore, StoreError, StoreOptions};
use crate::message::Message;
use crate::outcome::FlushOutcome;

/// A handle on a turnsafe home that many threads share.
#[derive(Clone)]
pub struct SharedStore {
    home: PathBuf,
    inner: Arc<Inner>,
}

struct Inner {
    store: Mutex<SessionStore>,
    queue: Mutex<Queue>,
    /// Signalled whenever a group settles.
    settled: Condvar,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Queued>,
    /// Outcomes not yet collected by their callers, by ticket.
    done: HashMap<u64, FlushOutcome>,
    /// A caller is committing a group.
    leading: bool,
    next_ticket: u64,
}

struct Queued {
    ticket: u64,
    session: SessionId,
    messages: Vec<Message>,
}

impl SharedStore {
    /// Create `home` (0700) if missing and open its store.
    pub fn open(home: &Path, opts: StoreOptions) -> Result<SharedStore, StoreError> {
        let store = SessionStore::create(home, opts)?;
        Ok(SharedStore {
            home: home.to_path_buf(),
            inner: Arc::new(Inner {
                store: Mutex::new(store),
                queue: Mutex::new(Queue::default()),
                settled: Condvar::new(),
            }),
        })
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The store, even after a caller panicked while holding it: every
    /// flush runs its own machines, so the handle stays sound.
    fn lock(&self) -> MutexGuard<'_, SessionStore> {
        self.inner.store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.inner.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Flush one batch, committed together with the batches other threads
    /// send meanwhile; see [`SessionStore::append_group`] for what a group
    /// guarantees each batch.
    pub fn append_batch(&self, session: &SessionId, messages: &[Message]) -> FlushOutcome {
        let mut queue = self.queue();
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push_back(Queued {
            ticket,
            session: session.clone(),
            messages: messages.to_vec(),
        });
        loop {
            if let Some(outcome) = queue.done.remove(&ticket) {
                return outcome;
            }
            if queue.leading {
                queue = self.inner.settled.wait(queue).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            queue.leading = true;
            let group = take_group(&mut queue.waiting);
            drop(queue);
            let outcomes = self.commit(&group);
            queue = self.queue();
            queue.done.extend(group.iter().map(|q| q.ticket).zip(outcomes));
            queue.leading = false;
            self.inner.settled.notify_all();
        }
    }

    /// Commit one group. A panic inside hands every batch of it back
    /// rather than leaving its callers waiting forever.
    fn commit(&self, group: &[Queued]) -> Vec<FlushOutcome> {
        let batches: Vec<(&SessionId, &[Message])> =
            group.iter().map(|q| (&q.session, q.messages.as_slice())).collect();
        let mut store = self.lock();
        match std::panic::catch_unwind(AssertUnwindSafe(|| store.append_group(&batches))) {
            Ok(outcomes) => outcomes,
            Err(_) => {
                tracing::error!(
                    batches = group.len(),
                    "a group commit panicked; its batches are handed back"
                );
                batches
                    .iter()
                    .map(|&(session, messages)| store.handed_back(session, messages))
                    .collect()
            }
        }
    }

    /// Batches queued for the next group commit.
    pub fn waiting(&self) -> usize {
        self.queue().waiting.len()
    }

    /// Give back this store's turn lease on `session`.
    pub fn release_lease(&self, session: &SessionId) {
        self.lock().release_lease(session);
    }

    /// Run `f` with the store held, for reads that must see its state.
    pub fn with_store<T>(&self, f: impl FnOnce(&mut SessionStore) -> T) -> T {
        f(&mut self.lock())
    }
}

/// The oldest waiting batches, up to the group's bounds (the first is
/// always taken, however large). Sizes are measured only when a second
/// batch is waiting, so a lone batch pays nothing for the bound.
fn take_group(waiting: &mut VecDeque<Queued>) -> Vec<Queued> {
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let mut group = vec![first];
    if waiting.is_empty() {
        return group;
    }
    let mut bytes = group[0].bytes();
    while let Some(next) = waiting.front() {
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
        self.messages.iter().map(Message::encoded_len).sum()
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
            })
            .collect()
    }

    #[test]
    fn a_group_is_bounded_by_batches_and_bytes() {
        let mut q = queued(70, 10);
        assert_eq!(take_group(&mut q).len(), GROUP_MAX_BATCHES);
        assert_eq!(take_group(&mut q).len(), 6);
        assert!(take_group(&mut q).is_empty());
        // About 400 KB each: two fit in 1 MiB, three do not.
        let mut q = queued(5, 400_000);
        let sizes: Vec<usize> = std::iter::from_fn(|| Some(take_group(&mut q).len()).filter(|&n| n > 0)).collect();
        assert_eq!(sizes, [2, 2, 1]);
        // A batch larger than the bound still goes, alone.
        let mut q = queued(2, 2 << 20);
        assert_eq!(take_group(&mut q).len(), 1);
        assert_eq!(take_group(&mut q).len(), 1);
    }

    #[test]
    fn is_send_sync_and_clone() {
        assert_send_sync::<SharedStore>();
    }

    #[test]
    fn many_threads_each_get_their_own_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let store = SharedStore::open(&dir.path().join("home"), StoreOptions::default()).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let session = SessionId::new(&format!("s{t}")).unwrap();
                    (0..5)
                        .map(|b| {
                            let batch: Vec<Message> = (0..3)
                                .map(|i| {
                                    Message::new("user", &format!("t{t} b{b} m{i}")).with_uid(&format!("t{t}-{b}-{i}"))
                                })
                                .collect();
                            store.append_batch(&session, &batch)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (t, handle) in threads.into_iter().enumerate() {
            let outcomes = handle.join().unwrap();
            for (b, out) in outcomes.iter().enumerate() {
                assert!(out.persisted, "t{t} b{b}: {}", out.to_value());
                assert_eq!(out.uids, (0..3).map(|i| format!("t{t}-{b}-{i}")).collect::<Vec<_>>());
            }
        }
        let rows: i64 = store.with_store(|s| {
            s.connection()
                .unwrap()
                .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
                .unwrap()
        });
        assert_eq!(rows, 8 * 5 * 3);
    }
}
