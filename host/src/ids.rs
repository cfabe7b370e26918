//! Ids: session ids (what is a valid one, and the safe id of any other
//! string), and the ids and seeds minted in user space.
//!
//! A flush used to ask the kernel for randomness once per id (`getrandom`,
//! eleven calls for a batch of ten). Here each thread keeps a ChaCha12
//! generator, seeded once from the OS, and draws ids from it without a
//! system call.
//!
//! **Forks.** A forked child inherits its parent's generator state, and
//! would repeat the parent's next ids. Every draw first compares the
//! process id the generator was seeded in with the current one, and reseeds
//! from the OS when they differ. The current pid is cached and refreshed in
//! the child by a `pthread_atfork` handler, so the comparison costs no
//! system call either. (A Python worker forked by `os.fork` or
//! `multiprocessing` goes through `fork(3)`, which runs the handler.)
//!
//! **Order.** A uid is 32 lowercase hex digits: 12 of milliseconds since the
//! Unix epoch, then 20 (80 bits) drawn at random for the first id of each
//! millisecond and counted up from there for the next ones in the same
//! millisecond, as ULIDs do. A thread's uids therefore sort in the order
//! they were minted, so a batch's new entries land together at the end of
//! the `(session_id, uid)` index and dirty one page, not one per message.
//! Two processes collide only if they draw suffixes within a few ids of
//! each other in the same millisecond (about 2^-80 per pair of ids).

use std::cell::RefCell;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

use chacha20::ChaCha12Rng;
use rand_core::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

/// The current process id, refreshed in a forked child (0: not read yet).
static PID: AtomicU32 = AtomicU32::new(0);
static AT_FORK: Once = Once::new();

extern "C" fn refresh_pid_in_child() {
    // getpid(2) is async-signal-safe, as a fork handler needs.
    PID.store(std::process::id(), Ordering::Relaxed);
}

/// This process's id, without a system call once it is known.
fn current_pid() -> u32 {
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic.
        // Should registration fail, `Generator::draw` still reads the
        // real pid on every call (see `CHECK_EVERY_DRAW`).
        let rc = unsafe { libc::pthread_atfork(None, None, Some(refresh_pid_in_child)) };
        if rc != 0 {
            CHECK_EVERY_DRAW.store(1, Ordering::Relaxed);
        }
        PID.store(std::process::id(), Ordering::Relaxed);
    });
    if CHECK_EVERY_DRAW.load(Ordering::Relaxed) != 0 {
        return std::process::id();
    }
    PID.load(Ordering::Relaxed)
}

/// Set when the fork handler could not be registered.
static CHECK_EVERY_DRAW: AtomicU32 = AtomicU32::new(0);

struct Generator {
    pid: u32,
    rng: ChaCha12Rng,
    /// The millisecond and 80-bit suffix of the last uid, counted up from
    /// within the same millisecond. Reset with the seed, so a forked child
    /// never continues its parent's count.
    last: Option<(u64, u128)>,
}

impl Generator {
    fn seeded(pid: u32) -> Generator {
        Generator {
            pid,
            rng: ChaCha12Rng::from_seed(os_seed()),
            last: None,
        }
    }
}

const SUFFIX_BITS: u32 = 80;
const SUFFIX_MASK: u128 = (1 << SUFFIX_BITS) - 1;

/// 32 bytes from the OS. Should the OS refuse (it does not on Linux once
/// booted), hash what differs between processes and calls instead: the
/// pid, the time, a counter and an address.
fn os_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    if getrandom::fill(&mut seed).is_ok() {
        return seed;
    }
    use sha2::{Digest, Sha256};
    static FALLBACK: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(std::process::id().to_le_bytes());
    h.update(now.to_le_bytes());
    h.update(FALLBACK.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update((&seed as *const _ as usize).to_le_bytes());
    h.finalize().into()
}

thread_local! {
    static GENERATOR: RefCell<Option<Generator>> = const { RefCell::new(None) };
}

/// Run `f` on this thread's generator, (re)seeding it first if it is new
/// or was seeded in another process.
fn with_generator<T>(f: impl FnOnce(&mut Generator) -> T) -> T {
    let pid = current_pid();
    GENERATOR.with(|g| {
        let mut g = g.borrow_mut();
        let gen_ = match g.as_mut() {
            Some(gen_) if gen_.pid == pid => gen_,
            _ => g.insert(Generator::seeded(pid)),
        };
        f(gen_)
    })
}

/// A random 64-bit value (the policy's jitter seed, the file generation).
pub fn seed() -> u64 {
    with_generator(|g| g.rng.next_u64())
}

/// A fresh id: time-ordered, 32 lowercase hex digits (uids, lease tokens,
/// batch ids). See the module docs.
pub fn mint() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        & 0xffff_ffff_ffff;
    let (ms, suffix) = with_generator(|g| {
        let next = match g.last {
            // Same (or an earlier: the clock stepped back) millisecond:
            // count up, carrying into the millisecond when the suffix is full.
            Some((last_ms, last)) if ms <= last_ms => {
                if last == SUFFIX_MASK {
                    (last_ms + 1, 0)
                } else {
                    (last_ms, last + 1)
                }
            }
            _ => {
                let hi = u128::from(g.rng.next_u64());
                let lo = u128::from(g.rng.next_u32() & 0xffff);
                (ms, (hi << 16) | lo)
            }
        };
        g.last = Some(next);
        next
    });
    // 12 hex digits of the millisecond, 20 of the suffix, without the
    // formatting machinery (this runs once per minted message).
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in out[..12].iter_mut().enumerate() {
        *b = HEX[((ms >> (44 - 4 * i)) & 0xf) as usize];
    }
    for (i, b) in out[12..].iter_mut().enumerate() {
        *b = HEX[((suffix >> (76 - 4 * i)) & 0xf) as usize];
    }
    out.iter().map(|&b| b as char).collect()
}

/// The longest session id, in bytes.
pub const MAX_SESSION_ID: usize = 128;

/// A session id is safe as a file name: 1 to 128 bytes of ASCII letters,
/// digits, `-`, `_`, `.` and `:`, not starting with `.`.
pub fn validate_session_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_SESSION_ID {
        return Err(format!("session id must be 1 to {MAX_SESSION_ID} bytes"));
    }
    if id.starts_with('.') || id.contains("..") {
        return Err("session id must not start with `.` or contain `..`".into());
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return Err("session id may hold only ASCII letters, digits, `-`, `_`, `.` and `:`".into());
    }
    Ok(())
}

/// A session id that is safe as a file name (see [`validate_session_id`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionId(String);

impl SessionId {
    pub fn new(id: &str) -> Result<SessionId, String> {
        validate_session_id(id).map(|()| SessionId(id.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// A LangGraph thread's session: its safe id, always valid.
    pub fn graph(thread_id: &str) -> SessionId {
        SessionId(thread_session(thread_id))
    }
}

/// The turnsafe session id for a free-form id, exactly as Python's
/// `turnsafe_store.agents.safe_session_id`: a valid id as it is; any other
/// string a readable prefix of its safe characters (at most 48, each other
/// character as `_`) and `-h` with 32 hex digits of its SHA-256.
pub fn safe_session_id(id: &str) -> String {
    if validate_session_id(id).is_ok() {
        return id.to_string();
    }
    let digest = hex::encode(Sha256::digest(id.as_bytes()));
    let prefix: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    if prefix.is_empty() {
        format!("h{}", &digest[..32])
    } else {
        format!("{prefix}-h{}", &digest[..32])
    }
}

/// The flush machine's session for a LangGraph thread: its safe id, as
/// `TurnsafeSession` maps free-form session ids (a valid id as it is,
/// any other a readable prefix and a hash). The divert file of the
/// thread's lines is `sessions/<safe id>.jsonl`, every namespace of the
/// thread included.
pub fn thread_session(thread_id: &str) -> String {
    safe_session_id(thread_id)
}

/// Wall-clock milliseconds (leases and row times cross processes).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_32_hex_digits_time_ordered_and_distinct() {
        let ids: Vec<String> = (0..10_000).map(|_| mint()).collect();
        assert!(
            ids.iter()
                .all(|u| u.len() == 32 && u.bytes().all(|b| b.is_ascii_hexdigit()))
        );
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        // A thread's ids sort in the order they were minted.
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_hex_is_the_millisecond_then_the_suffix() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let id = mint();
        let ms = u64::from_str_radix(&id[..12], 16).unwrap();
        assert!(ms >= before && ms < before + 60_000, "{id}");
        assert!(u128::from_str_radix(&id[12..], 16).is_ok());
        let next = mint();
        if next[..12] == id[..12] {
            let (a, b) = (
                u128::from_str_radix(&id[12..], 16).unwrap(),
                u128::from_str_radix(&next[12..], 16).unwrap(),
            );
            assert_eq!(b, a + 1, "{id} then {next}");
        }
    }

    #[test]
    fn threads_draw_different_streams() {
        let a: Vec<u64> = (0..4).map(|_| seed()).collect();
        let b = std::thread::spawn(|| (0..4).map(|_| seed()).collect::<Vec<u64>>())
            .join()
            .unwrap();
        assert_ne!(a, b);
    }
}
