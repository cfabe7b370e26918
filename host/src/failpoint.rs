//! Crash points for the torture test: with `TURNSAFE_CRASH_AT=<point>:<n>`
//! the process kills itself (SIGKILL) the n-th time it reaches `<point>`.
//! Without the variable this is one relaxed atomic load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

static STATE: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 off, 2 on
static HITS: AtomicU32 = AtomicU32::new(0);
static TARGET: Mutex<Option<(String, u32)>> = Mutex::new(None);

fn armed() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let parsed = std::env::var("TURNSAFE_CRASH_AT").ok().and_then(|v| {
                let (p, n) = v.rsplit_once(':')?;
                Some((p.to_string(), n.parse::<u32>().ok()?))
            });
            let on = parsed.is_some();
            if let Ok(mut t) = TARGET.lock() {
                *t = parsed;
            }
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Mark an effect boundary.
pub fn hit(point: &str) {
    if !armed() {
        return;
    }
    let Ok(t) = TARGET.lock() else { return };
    if let Some((p, n)) = t.as_ref()
        && p == point
        && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n
    {
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}
