//! WAL frames per commit, counted with `sqlite3_wal_hook`.
//!
//! After each commit SQLite calls the WAL hook with the number of frames
//! now in the WAL; the difference from the previous call is the number of
//! pages that commit wrote. After a checkpoint the WAL restarts, and the
//! count starts again from 0.
//!
//! SQLite's automatic checkpoint is itself a WAL hook, and a connection has
//! only one: [`WalFrames::attach`] therefore checkpoints as SQLite's
//! default hook does (`PASSIVE`, once the WAL holds `wal_autocheckpoint`
//! frames), so counting does not change what is measured.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::Connection;
use rusqlite::ffi;

#[derive(Debug, Default)]
struct State {
    /// Frames in the WAL after the last commit seen.
    last: AtomicU64,
    frames: AtomicU64,
    commits: AtomicU64,
    /// `PRAGMA wal_autocheckpoint` at attach time (0: off).
    autocheckpoint: AtomicU64,
}

/// A frame counter on one connection.
#[derive(Debug, Clone)]
pub struct WalFrames {
    state: Arc<State>,
}

/// Counts so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frames {
    pub commits: u64,
    pub frames: u64,
}

impl Frames {
    /// Frames per commit since `earlier`.
    pub fn per_commit_since(&self, earlier: Frames) -> f64 {
        let commits = self.commits.saturating_sub(earlier.commits);
        if commits == 0 {
            return 0.0;
        }
        self.frames.saturating_sub(earlier.frames) as f64 / commits as f64
    }
}

unsafe extern "C" fn hook(arg: *mut c_void, db: *mut ffi::sqlite3, name: *const c_char, n: c_int) -> c_int {
    // SAFETY: `arg` is the `Arc<State>` leaked in `attach`, never freed.
    let st = unsafe { &*(arg as *const State) };
    let n = n.max(0) as u64;
    let last = st.last.swap(n, Ordering::Relaxed);
    let added = if n >= last { n - last } else { n };
    st.frames.fetch_add(added, Ordering::Relaxed);
    st.commits.fetch_add(1, Ordering::Relaxed);
    let limit = st.autocheckpoint.load(Ordering::Relaxed);
    if limit > 0 && n >= limit {
        // What SQLite's default hook (sqlite3WalDefaultHook) does.
        // SAFETY: the handle and name are the ones SQLite passed in.
        unsafe { ffi::sqlite3_wal_checkpoint(db, name) };
    }
    ffi::SQLITE_OK
}

impl WalFrames {
    /// Start counting the frames of `conn`'s commits. Attach while the WAL
    /// is empty (a new database, or right after a checkpoint): otherwise the
    /// first commit also counts the frames already there. The hook's state
    /// is kept alive for as long as the connection may call it (one small
    /// allocation per attach is never freed).
    pub fn attach(conn: &Connection) -> rusqlite::Result<WalFrames> {
        let autocheckpoint: i64 = conn.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))?;
        let state = Arc::new(State {
            autocheckpoint: AtomicU64::new(autocheckpoint.max(0) as u64),
            ..State::default()
        });
        let arg = Arc::into_raw(Arc::clone(&state)) as *mut c_void;
        // SAFETY: a valid handle; `arg` stays valid forever (leaked).
        unsafe { ffi::sqlite3_wal_hook(conn.handle(), Some(hook), arg) };
        Ok(WalFrames { state })
    }

    pub fn get(&self) -> Frames {
        Frames {
            commits: self.state.commits.load(Ordering::Relaxed),
            frames: self.state.frames.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_frames_per_commit_and_still_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let c = Connection::open(dir.path().join("t.db")).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=20; CREATE TABLE t(x); PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
        let w = WalFrames::attach(&c).unwrap();
        c.execute("INSERT INTO t VALUES (1)", []).unwrap();
        assert_eq!(w.get(), Frames { commits: 1, frames: 1 });
        // Three new pages of a fresh table's rows (root split included).
        let before = w.get();
        c.execute(
            "INSERT INTO t SELECT randomblob(3000) FROM (SELECT 1 UNION ALL SELECT 2)",
            [],
        )
        .unwrap();
        assert!(w.get().frames - before.frames >= 3, "{:?}", w.get());
        for _ in 0..40 {
            c.execute("INSERT INTO t VALUES (2)", []).unwrap();
        }
        // The autocheckpoint still ran: the WAL was restarted.
        let in_wal: i64 = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1)).unwrap();
        assert!(in_wal < 20, "{in_wal} frames in the WAL");
        assert_eq!(w.get().commits, 42);
    }
}
