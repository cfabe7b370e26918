//! A fault-injecting SQLite VFS over the default unix VFS, after SQLite's
//! own `test_vfs.c`. It is inert until a [`Fault`] is armed; then it fails
//! the n-th matching open, read, write, sync, truncate, lock or shm call,
//! once (transient) or from then on (persistent).
//!
//! Faults are filtered by a path substring, so tests using different
//! directories run in parallel without seeing each other's faults. Open a
//! connection through it with [`VFS_NAME`] (`StoreOptions::vfs`).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rusqlite::ffi;

/// The name the VFS is registered under.
pub const VFS_NAME: &str = "turnsafe-fault";

/// The file method a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Open,
    Read,
    Write,
    Sync,
    Truncate,
    Lock,
    /// `xShmMap` and `xShmLock` (the WAL index).
    Shm,
}

/// Which file a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Main,
    Wal,
    Journal,
    Any,
}

/// One armed fault.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Only files whose path contains this string.
    pub path_contains: String,
    pub op: Op,
    pub file: FileKind,
    /// The 1-based matching call that fails first.
    pub nth: u32,
    /// Keep failing every later matching call too.
    pub persistent: bool,
    /// Instead, fail every k-th matching call (k >= 1), from `nth` on.
    pub every: Option<u32>,
    /// The SQLite code to return; `None` picks the natural IOERR for `op`
    /// (CANTOPEN for `Open`).
    pub code: Option<c_int>,
    /// The errno SQLite will see (`sqlite3_system_errno`); without one it
    /// sees none (0).
    pub errno: Option<c_int>,
}

impl Fault {
    pub fn new(path_contains: &str, op: Op, file: FileKind, nth: u32) -> Fault {
        Fault {
            path_contains: path_contains.into(),
            op,
            file,
            nth,
            persistent: false,
            every: None,
            code: None,
            errno: None,
        }
    }
    pub fn every(mut self, k: u32) -> Fault {
        self.every = Some(k.max(1));
        self
    }
    pub fn persistent(mut self) -> Fault {
        self.persistent = true;
        self
    }
    pub fn code(mut self, code: c_int) -> Fault {
        self.code = Some(code);
        self
    }
    pub fn errno(mut self, errno: c_int) -> Fault {
        self.errno = Some(errno);
        self
    }
}

struct Armed {
    /// Unique per `arm`, so a saved errno can name the fault it came from.
    id: u64,
    fault: Fault,
    seen: AtomicU32,
    fired: AtomicU32,
}

/// Disarms its fault when dropped; counts how often it fired.
pub struct FaultGuard {
    armed: Arc<Armed>,
}

impl FaultGuard {
    /// How many calls this fault failed.
    pub fn fired(&self) -> u32 {
        self.armed.fired.load(Ordering::SeqCst)
    }
    /// How many matching calls it has seen.
    pub fn seen(&self) -> u32 {
        self.armed.seen.load(Ordering::SeqCst)
    }
}

impl Drop for FaultGuard {
    fn drop(&mut self) {
        if let Ok(mut all) = plan().lock() {
            all.retain(|a| !Arc::ptr_eq(a, &self.armed));
        }
        // Other threads drop theirs lazily: see `x_get_last_error`.
        forget_errno_of(self.armed.id);
    }
}

fn plan() -> &'static Mutex<Vec<Arc<Armed>>> {
    static PLAN: OnceLock<Mutex<Vec<Arc<Armed>>>> = OnceLock::new();
    PLAN.get_or_init(|| Mutex::new(Vec::new()))
}

/// Arm a fault (and register the VFS if needed).
pub fn arm(fault: Fault) -> Result<FaultGuard, String> {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    register()?;
    let armed = Arc::new(Armed {
        id: NEXT_ID.fetch_add(1, Ordering::SeqCst),
        fault,
        seen: AtomicU32::new(0),
        fired: AtomicU32::new(0),
    });
    plan()
        .lock()
        .map_err(|_| "fault plan poisoned".to_string())?
        .push(armed.clone());
    Ok(FaultGuard { armed })
}

/// Opens and closes of one kind of file, as the VFS saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileCounts {
    /// `xOpen` calls, successful or not.
    pub opens: u32,
    /// `xClose` calls.
    pub closes: u32,
    /// Write transactions begun: `xShmLock` taking the WAL write lock
    /// (slot 0, exclusive), which `BEGIN IMMEDIATE` does once per attempt.
    pub write_locks: u32,
}

/// What a [`Counter`] has seen so far, per file kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub main: FileCounts,
    pub wal: FileCounts,
    pub journal: FileCounts,
}

struct Counting {
    path_contains: String,
    counts: Mutex<Counts>,
}

/// Counts the opens and closes of the files whose path contains a string,
/// for as long as it lives. It sits below SQLite, so it sees every open a
/// connection through this VFS makes, whoever asked for it: a spy that is
/// not the code under test.
pub struct Counter {
    counting: Arc<Counting>,
}

impl Counter {
    pub fn counts(&self) -> Counts {
        self.counting.counts.lock().map(|c| *c).unwrap_or_default()
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        if let Ok(mut all) = counters().lock() {
            all.retain(|c| !Arc::ptr_eq(c, &self.counting));
        }
    }
}

fn counters() -> &'static Mutex<Vec<Arc<Counting>>> {
    static COUNTERS: OnceLock<Mutex<Vec<Arc<Counting>>>> = OnceLock::new();
    COUNTERS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Start counting opens and closes of files whose path contains
/// `path_contains` (and register the VFS if needed). No fault is armed.
pub fn count(path_contains: &str) -> Result<Counter, String> {
    register()?;
    let counting = Arc::new(Counting {
        path_contains: path_contains.into(),
        counts: Mutex::new(Counts::default()),
    });
    counters()
        .lock()
        .map_err(|_| "counters poisoned".to_string())?
        .push(counting.clone());
    Ok(Counter { counting })
}

#[derive(Clone, Copy)]
enum Event {
    Open,
    Close,
    WriteLock,
}

fn tally(kind: FileKind, path: &str, event: Event) {
    let Ok(all) = counters().lock() else { return };
    for c in all.iter().filter(|c| path.contains(&c.path_contains)) {
        let Ok(mut counts) = c.counts.lock() else { continue };
        let slot = match kind {
            FileKind::Main => &mut counts.main,
            FileKind::Wal => &mut counts.wal,
            FileKind::Journal => &mut counts.journal,
            FileKind::Any => continue,
        };
        match event {
            Event::Open => slot.opens += 1,
            Event::Close => slot.closes += 1,
            Event::WriteLock => slot.write_locks += 1,
        }
    }
}

thread_local! {
    /// The errno of the last fault that fired on this thread, with the id of
    /// that fault. It is SQLite's answer only while that fault is armed.
    static LAST_ERRNO: std::cell::Cell<Option<(u64, Option<c_int>)>> = const { std::cell::Cell::new(None) };
}

fn forget_errno_of(id: u64) {
    LAST_ERRNO.with(|e| {
        if e.get().is_some_and(|(fired, _)| fired == id) {
            e.set(None);
        }
    });
}

/// The errno SQLite should see for an injected failure, if the fault that
/// fired last on this thread is still armed: its configured errno, or 0
/// (none) rather than whatever a real call left in `errno` before.
fn injected_errno() -> Option<c_int> {
    let (id, errno) = LAST_ERRNO.with(|e| e.get())?;
    let armed = plan().lock().is_ok_and(|all| all.iter().any(|a| a.id == id));
    if !armed {
        LAST_ERRNO.with(|e| e.set(None));
        return None;
    }
    Some(errno.unwrap_or(0))
}

fn natural_code(op: Op) -> c_int {
    match op {
        Op::Open => ffi::SQLITE_CANTOPEN,
        Op::Read => ffi::SQLITE_IOERR_READ,
        Op::Write => ffi::SQLITE_IOERR_WRITE,
        Op::Sync => ffi::SQLITE_IOERR_FSYNC,
        Op::Truncate => ffi::SQLITE_IOERR_TRUNCATE,
        Op::Lock => ffi::SQLITE_IOERR_LOCK,
        Op::Shm => ffi::SQLITE_IOERR_SHMMAP,
    }
}

/// The code to fail with, if an armed fault matches this call. A call that
/// is not failed here ends what an earlier injected errno said: SQLite asks
/// for the errno right after the call that failed, and a later failure is
/// the real file system's, with its own errno.
fn check(op: Op, kind: FileKind, path: &str) -> Option<c_int> {
    let fired = fire(op, kind, path);
    if fired.is_none() {
        LAST_ERRNO.with(|e| e.set(None));
    }
    fired
}

fn fire(op: Op, kind: FileKind, path: &str) -> Option<c_int> {
    let all = plan().lock().ok()?;
    for a in all.iter() {
        let f = &a.fault;
        if f.op != op || !(f.file == FileKind::Any || f.file == kind) || !path.contains(&f.path_contains) {
            continue;
        }
        let n = a.seen.fetch_add(1, Ordering::SeqCst) + 1;
        let fires = match f.every {
            Some(k) => n >= f.nth && (n - f.nth) % k == 0,
            None => n == f.nth || (f.persistent && n > f.nth),
        };
        if fires {
            a.fired.fetch_add(1, Ordering::SeqCst);
            LAST_ERRNO.with(|e| e.set(Some((a.id, f.errno))));
            if let Some(errno) = f.errno {
                // SAFETY: writes this thread's errno, as a failed syscall would.
                unsafe { *libc::__errno_location() = errno };
            }
            return Some(f.code.unwrap_or_else(|| natural_code(op)));
        }
    }
    None
}

/// Our file: SQLite's header first, then the real file's storage.
#[repr(C)]
struct FaultFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    info: *mut FileInfo,
}

struct FileInfo {
    path: String,
    kind: FileKind,
}

struct Vfs {
    /// SQLite links registered VFSes through `pNext`, so it writes here.
    vfs: std::cell::UnsafeCell<ffi::sqlite3_vfs>,
    base: *mut ffi::sqlite3_vfs,
    _name: CString,
}

// SAFETY: the VFS struct is immutable after registration; SQLite itself
// serialises what needs serialising.
unsafe impl Send for Vfs {}
unsafe impl Sync for Vfs {}

static VFS: OnceLock<Result<Box<Vfs>, String>> = OnceLock::new();

fn base_vfs() -> *mut ffi::sqlite3_vfs {
    VFS.get()
        .and_then(|v| v.as_ref().ok())
        .map_or(std::ptr::null_mut(), |v| v.base)
}

/// Register the VFS (idempotent). It is not made the default (tests may,
/// with `make_default`).
pub fn register() -> Result<(), String> {
    VFS.get_or_init(|| {
        // SAFETY: plain calls into SQLite's VFS registry.
        unsafe {
            if ffi::sqlite3_initialize() != ffi::SQLITE_OK {
                return Err("sqlite3_initialize failed".into());
            }
            let base = ffi::sqlite3_vfs_find(std::ptr::null());
            if base.is_null() {
                return Err("no default VFS".into());
            }
            let name = CString::new(VFS_NAME).map_err(|e| e.to_string())?;
            let mut vfs = *base;
            vfs.pNext = std::ptr::null_mut();
            vfs.zName = name.as_ptr();
            vfs.szOsFile = (std::mem::size_of::<FaultFile>() as c_int) + (*base).szOsFile;
            vfs.xOpen = Some(x_open);
            vfs.xDelete = Some(x_delete);
            vfs.xAccess = Some(x_access);
            vfs.xFullPathname = Some(x_full_pathname);
            vfs.xGetLastError = Some(x_get_last_error);
            let boxed = Box::new(Vfs {
                vfs: std::cell::UnsafeCell::new(vfs),
                base,
                _name: name,
            });
            let rc = ffi::sqlite3_vfs_register(boxed.vfs.get(), 0);
            if rc != ffi::SQLITE_OK {
                return Err(format!("sqlite3_vfs_register failed: {rc}"));
            }
            Ok(boxed)
        }
    })
    .as_ref()
    .map(|_| ())
    .map_err(Clone::clone)
}

/// Make this VFS SQLite's default (registering it if needed), so every
/// connection of the process goes through it, whatever VFS name its opener
/// asked for or did not: a [`Counter`] then sees every open of a file by
/// any path. For tests that watch opens from below; nothing is armed.
#[cfg(feature = "test-hooks")]
pub fn make_default() -> Result<(), String> {
    register()?;
    let vfs = VFS
        .get()
        .and_then(|v| v.as_ref().ok())
        .ok_or("the fault VFS is not registered")?;
    // SAFETY: registering an already registered VFS again only moves it to
    // the head of SQLite's list (under SQLite's own mutex); the struct
    // lives for the whole process.
    let rc = unsafe { ffi::sqlite3_vfs_register(vfs.vfs.get(), 1) };
    if rc != ffi::SQLITE_OK {
        return Err(format!("sqlite3_vfs_register (default) failed: {rc}"));
    }
    Ok(())
}

unsafe fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    unsafe { (*(file as *mut FaultFile)).real }
}

unsafe fn info<'a>(file: *mut ffi::sqlite3_file) -> &'a FileInfo {
    unsafe { &*(*(file as *mut FaultFile)).info }
}

unsafe fn methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    unsafe { &*(*real(file)).pMethods }
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    unsafe {
        let base = base_vfs();
        let ff = file as *mut FaultFile;
        (*ff).base.pMethods = std::ptr::null();
        let path = if name.is_null() {
            String::new()
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        };
        let kind = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
            FileKind::Main
        } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
            FileKind::Wal
        } else if flags & ffi::SQLITE_OPEN_MAIN_JOURNAL != 0 {
            FileKind::Journal
        } else {
            FileKind::Any
        };
        tally(kind, &path, Event::Open);
        if let Some(code) = check(Op::Open, kind, &path) {
            return code;
        }
        let real = (file as *mut u8).add(std::mem::size_of::<FaultFile>()) as *mut ffi::sqlite3_file;
        let Some(open) = (*base).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = open(base, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*real).pMethods.is_null() {
            // SQLite calls xClose only when pMethods is set; leave it null.
            return if rc == ffi::SQLITE_OK { ffi::SQLITE_CANTOPEN } else { rc };
        }
        (*ff).real = real;
        (*ff).info = Box::into_raw(Box::new(FileInfo { path, kind }));
        (*ff).base.pMethods = &IO_METHODS;
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_delete(_vfs: *mut ffi::sqlite3_vfs, name: *const c_char, sync_dir: c_int) -> c_int {
    unsafe {
        let base = base_vfs();
        match (*base).xDelete {
            Some(f) => f(base, name, sync_dir),
            None => ffi::SQLITE_IOERR_DELETE,
        }
    }
}

unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    unsafe {
        let base = base_vfs();
        match (*base).xAccess {
            Some(f) => f(base, name, flags, out),
            None => ffi::SQLITE_IOERR_ACCESS,
        }
    }
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    unsafe {
        let base = base_vfs();
        match (*base).xFullPathname {
            Some(f) => f(base, name, n, out),
            None => ffi::SQLITE_CANTOPEN,
        }
    }
}

unsafe extern "C" fn x_get_last_error(_vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    if let Some(e) = injected_errno() {
        return e;
    }
    unsafe {
        let base = base_vfs();
        match (*base).xGetLastError {
            Some(f) => f(base, n, out),
            None => 0,
        }
    }
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(f_close),
    xRead: Some(f_read),
    xWrite: Some(f_write),
    xTruncate: Some(f_truncate),
    xSync: Some(f_sync),
    xFileSize: Some(f_file_size),
    xLock: Some(f_lock),
    xUnlock: Some(f_unlock),
    xCheckReservedLock: Some(f_check_reserved_lock),
    xFileControl: Some(f_file_control),
    xSectorSize: Some(f_sector_size),
    xDeviceCharacteristics: Some(f_device_characteristics),
    xShmMap: Some(f_shm_map),
    xShmLock: Some(f_shm_lock),
    xShmBarrier: Some(f_shm_barrier),
    xShmUnmap: Some(f_shm_unmap),
    xFetch: Some(f_fetch),
    xUnfetch: Some(f_unfetch),
};

macro_rules! delegate {
    ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {
        unsafe {
            match methods($file).$method {
                Some(m) => m(real($file) $(, $arg)*),
                None => $missing,
            }
        }
    };
}

macro_rules! faultable {
    ($file:expr, $op:expr) => {
        unsafe {
            let i = info($file);
            if let Some(code) = check($op, i.kind, &i.path) {
                return code;
            }
        }
    };
}

unsafe extern "C" fn f_close(file: *mut ffi::sqlite3_file) -> c_int {
    let rc = delegate!(file, xClose, ffi::SQLITE_OK);
    unsafe {
        let ff = file as *mut FaultFile;
        if !(*ff).info.is_null() {
            let i = &*(*ff).info;
            tally(i.kind, &i.path, Event::Close);
            drop(Box::from_raw((*ff).info));
            (*ff).info = std::ptr::null_mut();
        }
    }
    rc
}

unsafe extern "C" fn f_read(file: *mut ffi::sqlite3_file, buf: *mut c_void, amt: c_int, off: i64) -> c_int {
    faultable!(file, Op::Read);
    delegate!(file, xRead, ffi::SQLITE_IOERR_READ, buf, amt, off)
}

unsafe extern "C" fn f_write(file: *mut ffi::sqlite3_file, buf: *const c_void, amt: c_int, off: i64) -> c_int {
    faultable!(file, Op::Write);
    delegate!(file, xWrite, ffi::SQLITE_IOERR_WRITE, buf, amt, off)
}

unsafe extern "C" fn f_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    faultable!(file, Op::Truncate);
    delegate!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn f_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    faultable!(file, Op::Sync);
    delegate!(file, xSync, ffi::SQLITE_IOERR_FSYNC, flags)
}

unsafe extern "C" fn f_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    delegate!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn f_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    faultable!(file, Op::Lock);
    delegate!(file, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn f_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    delegate!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn f_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    delegate!(file, xCheckReservedLock, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, out)
}

unsafe extern "C" fn f_file_control(file: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    delegate!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn f_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    delegate!(file, xSectorSize, 4096)
}

unsafe extern "C" fn f_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    delegate!(file, xDeviceCharacteristics, 0)
}

unsafe extern "C" fn f_shm_map(
    file: *mut ffi::sqlite3_file,
    pg: c_int,
    pgsz: c_int,
    extend: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    faultable!(file, Op::Shm);
    delegate!(file, xShmMap, ffi::SQLITE_IOERR_SHMMAP, pg, pgsz, extend, pp)
}

unsafe extern "C" fn f_shm_lock(file: *mut ffi::sqlite3_file, offset: c_int, n: c_int, flags: c_int) -> c_int {
    if offset == 0 && flags == ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE {
        // SAFETY: `info` is set for every file this VFS opened.
        let i = unsafe { info(file) };
        tally(i.kind, &i.path, Event::WriteLock);
    }
    faultable!(file, Op::Shm);
    delegate!(file, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset, n, flags)
}

unsafe extern "C" fn f_shm_barrier(file: *mut ffi::sqlite3_file) {
    delegate!(file, xShmBarrier, ())
}

unsafe extern "C" fn f_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    delegate!(file, xShmUnmap, ffi::SQLITE_OK, delete)
}

unsafe extern "C" fn f_fetch(file: *mut ffi::sqlite3_file, off: i64, amt: c_int, pp: *mut *mut c_void) -> c_int {
    unsafe {
        if methods(file).iVersion < 3 {
            *pp = std::ptr::null_mut();
            return ffi::SQLITE_OK;
        }
    }
    delegate!(file, xFetch, ffi::SQLITE_OK, off, amt, pp)
}

unsafe extern "C" fn f_unfetch(file: *mut ffi::sqlite3_file, off: i64, p: *mut c_void) -> c_int {
    unsafe {
        if methods(file).iVersion < 3 {
            return ffi::SQLITE_OK;
        }
    }
    delegate!(file, xUnfetch, ffi::SQLITE_OK, off, p)
}
