//! Crash points and injected I/O errors, for the tests only.
//!
//! Built with the `test-hooks` feature (never a default: only the test
//! builds turn it on), and only then: with `TURNSAFE_CRASH_AT=<point>:<n>`
//! the process kills itself (SIGKILL) the n-th time it reaches `<point>`;
//! with `TURNSAFE_JITTER_US=<max>` each point also sleeps a pseudo-random
//! 0..max microseconds, to shake out orderings; `TURNSAFE_IO_FAULT` fails
//! turnsafe's own divert writes and syncs ([`io_fault`]). Tests that drive
//! the host in-process can also run their own code at a point with `on`
//! (another connection committing inside a flush's window, say), or fail
//! a point with `fail_on`. Without either variable or a hook this is two
//! relaxed atomic loads.
//!
//! Without `test-hooks` (the binary `cargo build --release` makes) every
//! point is an empty inline function: no variable is read, so a stray
//! variable in production can neither kill the writer nor fail its divert.

/// Every crash point, for the torture test.
pub const POINTS: &[&str] = &[
    "flush.after_read",
    "flush.before_commit",
    "flush.after_commit",
    "divert.before_mkdir",
    "divert.before_write",
    "divert.before_fsync",
    "append.before_print",
    "capture.before_mkdir",
    "capture.before_write",
    "replay.before_take",
    "replay.before_commit",
    "replay.before_ledger",
    "replay.before_settle",
];

/// The crash points inside a group commit (several batches in one
/// transaction), for its own torture.
pub const GROUP_POINTS: &[&str] = &[
    "group.between_batches",
    "flush.before_commit",
    "flush.after_commit",
    "append.before_print",
];

/// The crash points of a PostgreSQL group, for its torture: after the
/// rows and before COMMIT, after COMMIT and before the outcome is known to
/// anyone, and after the outcomes are decided but before they are printed.
pub const PG_POINTS: &[&str] = &["pg.before_commit", "pg.after_commit", "append.before_print"];

/// The crash points inside a history edit (pop, clear, restore, fork,
/// prune), for the edit torture: after the rows were copied into the
/// archive and before they leave the transcript (pop, clear, prune),
/// between two rows a restore or a fork writes, before COMMIT, after it.
pub const EDIT_POINTS: &[&str] = &[
    "edit.after_archive",
    "edit.between_rows",
    "edit.before_commit",
    "edit.after_commit",
];

/// Points where [`io_fault`] can fail an operation of turnsafe's own (not
/// SQLite's file I/O: the fault VFS covers that).
pub const IO_POINTS: &[&str] = &[
    "divert.write",
    "divert.fsync",
    "divert.fsync_dir",
    "divert.truncate",
    "divert.truncate_fsync",
    "store.no_ckpt_on_close",
    "clear.read",
];

/// Mark an effect boundary: a crash point (with `test-hooks` only).
#[inline(always)]
pub fn hit(point: &str) {
    #[cfg(feature = "test-hooks")]
    hooks::hit(point);
    #[cfg(not(feature = "test-hooks"))]
    let _ = point;
}

/// An injected error for `point`, when a test armed one; always `None`
/// in a build without the `test-hooks` feature.
#[inline(always)]
pub fn io_fault(point: &str) -> Option<std::io::Error> {
    #[cfg(feature = "test-hooks")]
    {
        io_faults::check(point)
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = point;
        None
    }
}

#[cfg(feature = "test-hooks")]
pub use hooks::{HookGuard, on};
#[cfg(feature = "test-hooks")]
pub use io_faults::{IoFaults, fail_on};

#[cfg(feature = "test-hooks")]
mod hooks {
    use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;

    static STATE: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 off, 2 on
    static HITS: AtomicU32 = AtomicU32::new(0);
    static POINT_HITS: AtomicU32 = AtomicU32::new(0);
    static TARGET: Mutex<Option<(String, u32)>> = Mutex::new(None);
    static JITTER_US: AtomicU32 = AtomicU32::new(0);

    fn armed() -> bool {
        match STATE.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => {
                let parsed = std::env::var("TURNSAFE_CRASH_AT").ok().and_then(|v| {
                    let (p, n) = v.rsplit_once(':')?;
                    Some((p.to_string(), n.parse::<u32>().ok()?))
                });
                let jitter = std::env::var("TURNSAFE_JITTER_US")
                    .ok()
                    .and_then(|j| j.parse::<u32>().ok())
                    .unwrap_or(0);
                JITTER_US.store(jitter, Ordering::Relaxed);
                let on = parsed.is_some() || jitter > 0;
                if let Ok(mut t) = TARGET.lock() {
                    *t = parsed;
                }
                STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
                on
            }
        }
    }

    type Hook = Arc<dyn Fn() + Send + Sync>;

    struct Registered {
        id: u64,
        point: String,
        thread: ThreadId,
        hook: Hook,
    }

    static HOOKS: Mutex<Vec<Registered>> = Mutex::new(Vec::new());
    static HOOK_COUNT: AtomicUsize = AtomicUsize::new(0);
    static NEXT_HOOK: AtomicU32 = AtomicU32::new(0);

    /// Removes its hook when dropped.
    pub struct HookGuard {
        id: u64,
    }

    impl Drop for HookGuard {
        fn drop(&mut self) {
            if let Ok(mut all) = HOOKS.lock() {
                all.retain(|r| r.id != self.id);
                HOOK_COUNT.store(all.len(), Ordering::SeqCst);
            }
        }
    }

    /// Run `hook` each time the calling thread reaches `point`, until the
    /// guard is dropped. Other threads (tests running in parallel) never run it.
    pub fn on(point: &str, hook: impl Fn() + Send + Sync + 'static) -> HookGuard {
        let id = u64::from(NEXT_HOOK.fetch_add(1, Ordering::SeqCst));
        let mut all = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
        all.push(Registered {
            id,
            point: point.to_string(),
            thread: std::thread::current().id(),
            hook: Arc::new(hook),
        });
        HOOK_COUNT.store(all.len(), Ordering::SeqCst);
        HookGuard { id }
    }

    fn run_hooks(point: &str) {
        let me = std::thread::current().id();
        // Clone the matching hooks out, so a hook may itself reach a point.
        let hooks: Vec<Hook> = match HOOKS.lock() {
            Ok(all) => all
                .iter()
                .filter(|r| r.point == point && r.thread == me)
                .map(|r| r.hook.clone())
                .collect(),
            Err(_) => return,
        };
        for h in hooks {
            h();
        }
    }

    pub(super) fn hit(point: &str) {
        if HOOK_COUNT.load(Ordering::Relaxed) > 0 {
            run_hooks(point);
        }
        if !armed() {
            return;
        }
        HITS.fetch_add(1, Ordering::Relaxed);
        let jitter = JITTER_US.load(Ordering::Relaxed);
        if jitter > 0 {
            let n = HITS.load(Ordering::Relaxed) as u64 ^ u64::from(std::process::id()) ^ point.len() as u64;
            let z = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            std::thread::sleep(std::time::Duration::from_micros((z >> 33) % u64::from(jitter)));
        }
        let Ok(t) = TARGET.lock() else { return };
        if let Some((p, n)) = t.as_ref()
            && p == point
            && POINT_HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n
        {
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        }
    }
}

#[cfg(feature = "test-hooks")]
mod io_faults {
    use std::cell::RefCell;
    use std::sync::OnceLock;

    thread_local! {
        static ARMED: RefCell<Vec<(String, i32)>> = const { RefCell::new(Vec::new()) };
    }

    /// `TURNSAFE_IO_FAULT=point[=errno],...`, read once: for a process
    /// driven from outside, such as `turnsafe append` in a CLI test.
    fn from_env() -> &'static [(String, i32)] {
        static ENV: OnceLock<Vec<(String, i32)>> = OnceLock::new();
        ENV.get_or_init(|| {
            std::env::var("TURNSAFE_IO_FAULT")
                .unwrap_or_default()
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((name, errno)) => (name.to_string(), errno.parse().unwrap_or(libc::EIO)),
                    None => (p.to_string(), libc::EIO),
                })
                .collect()
        })
    }

    pub fn check(point: &str) -> Option<std::io::Error> {
        let errno = ARMED
            .with(|a| a.borrow().iter().find(|(p, _)| p == point).map(|(_, e)| *e))
            .or_else(|| from_env().iter().find(|(p, _)| p == point).map(|(_, e)| *e))?;
        Some(std::io::Error::from_raw_os_error(errno))
    }

    /// Fails the named points on this thread until dropped.
    pub struct IoFaults {
        points: Vec<String>,
    }

    impl Drop for IoFaults {
        fn drop(&mut self) {
            ARMED.with(|a| a.borrow_mut().retain(|(p, _)| !self.points.contains(p)));
        }
    }

    /// Fail every call at `points` on this thread with `errno`.
    pub fn fail_on(points: &[&str], errno: i32) -> IoFaults {
        ARMED.with(|a| a.borrow_mut().extend(points.iter().map(|p| (p.to_string(), errno))));
        IoFaults {
            points: points.iter().map(|p| p.to_string()).collect(),
        }
    }
}
