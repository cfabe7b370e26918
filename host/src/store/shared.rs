//! A store many threads write through at once: [`SharedStore`] is cheap to
//! clone, `Send + Sync`, and answers every batch with its own outcome.
//!
//! Today one handle serves every caller in turn, so each batch keeps the
//! whole flush protocol (the machine, the guard, the divert) exactly as a
//! [`SessionStore`] runs it. Callers see the contract a group commit keeps
//! too: no batch gets its outcome before the commit that made it durable.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{SessionId, SessionStore, StoreError, StoreOptions};
use crate::message::Message;
use crate::outcome::FlushOutcome;

/// A handle on a turnsafe home that many threads share.
#[derive(Clone)]
pub struct SharedStore {
    home: PathBuf,
    inner: Arc<Mutex<SessionStore>>,
}

impl SharedStore {
    /// Create `home` (0700) if missing and open its store.
    pub fn open(home: &Path, opts: StoreOptions) -> Result<SharedStore, StoreError> {
        let store = SessionStore::create(home, opts)?;
        Ok(SharedStore {
            home: home.to_path_buf(),
            inner: Arc::new(Mutex::new(store)),
        })
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The store, even after a caller panicked while holding it: the flush
    /// machine abandons a flush left running, so the handle stays sound.
    fn lock(&self) -> MutexGuard<'_, SessionStore> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Flush one batch; see [`SessionStore::append_batch`].
    pub fn append_batch(&self, session: &SessionId, messages: &[Message]) -> FlushOutcome {
        self.lock().append_batch(session, messages)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + Clone>() {}

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
