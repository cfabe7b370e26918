//! The FUSE daemon runs in a child process, never in the test's own.
//!
//! Why: a daemon thread in the process that also `mmap`s files on the
//! mount can deadlock it. `munmap` of a shared mapping on FUSE writes the
//! dirty pages back and waits for them *while holding the address space's
//! lock*; a daemon thread that then needs that lock (malloc growing its
//! heap with `mprotect`, any `mmap`) never answers the writeback. SQLite's
//! `-shm` is exactly such a mapping. A child process has its own address
//! space, so nothing the test does can block the daemon.
//!
//! The child is forked (glibc makes malloc safe across fork) and, before
//! anything else, closes every descriptor it inherited except the ones it
//! needs, so it does not keep the parent's other files busy. It then owns
//! the model: the parent asks for counts, logs and faults over a
//! socketpair, one line per request and per answer, and the child runs the
//! cut's rebuild itself once the parent has unmounted. If the parent dies,
//! the child sees the socket close, detaches the mount and exits.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::cut::{self, CutMode, CutReport};
use crate::fault::{Armed, Fault, FaultOp, PathMatch, When};
use crate::fs::PowerFsImpl;
use crate::model::{Model, SyncKind, SyncPoint};
use crate::sys;

fn hex(s: &[u8]) -> String {
    if s.is_empty() {
        return "-".into();
    }
    s.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    if s == "-" {
        return Vec::new();
    }
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("powerfs daemon: {what}"))
}

fn point_to_wire(p: &SyncPoint) -> String {
    let k = match p.kind {
        SyncKind::Fsync => 'F',
        SyncKind::Fdatasync => 'D',
        SyncKind::DirSync => 'S',
    };
    format!("{}:{k}:{}", p.n, hex(p.path.as_os_str().as_encoded_bytes()))
}

fn point_from_wire(s: &str) -> io::Result<SyncPoint> {
    let mut it = s.splitn(3, ':');
    let (n, k, p) = (it.next(), it.next(), it.next());
    let n = n.and_then(|n| n.parse().ok()).ok_or_else(|| bad(s))?;
    let kind = match k {
        Some("F") => SyncKind::Fsync,
        Some("D") => SyncKind::Fdatasync,
        Some("S") => SyncKind::DirSync,
        _ => return Err(bad(s)),
    };
    let path = PathBuf::from(String::from_utf8_lossy(&unhex(p.ok_or_else(|| bad(s))?)).into_owned());
    Ok(SyncPoint { n, path, kind })
}

fn mode_to_wire(mode: CutMode) -> String {
    match mode {
        CutMode::DropPending => "drop 0".into(),
        CutMode::KeepPending => "keep 0".into(),
        CutMode::TornPrefix { seed } => format!("torn {seed}"),
        CutMode::Reorder { seed } => format!("reorder {seed}"),
    }
}

fn fault_to_wire(f: &Fault) -> String {
    let op = match f.op {
        FaultOp::Fsync => "fsync",
        FaultOp::Fdatasync => "fdatasync",
        FaultOp::FileSync => "filesync",
        FaultOp::DirSync => "dirsync",
        FaultOp::Write => "write",
        FaultOp::Truncate => "truncate",
    };
    let (m, s) = match &f.path {
        PathMatch::Any => ("any", String::new()),
        PathMatch::Exact(s) => ("exact", s.clone()),
        PathMatch::Suffix(s) => ("suffix", s.clone()),
        PathMatch::Contains(s) => ("contains", s.clone()),
    };
    let (w, n) = match f.when {
        When::Nth(n) => ("nth", n),
        When::From(n) => ("from", n),
        When::Every => ("every", 0),
    };
    format!("{op} {m} {} {w} {n} {}", hex(s.as_bytes()), f.errno)
}

fn fault_from_wire(args: &[&str]) -> Option<Fault> {
    let op = match *args.first()? {
        "fsync" => FaultOp::Fsync,
        "fdatasync" => FaultOp::Fdatasync,
        "filesync" => FaultOp::FileSync,
        "dirsync" => FaultOp::DirSync,
        "write" => FaultOp::Write,
        "truncate" => FaultOp::Truncate,
        _ => return None,
    };
    let s = String::from_utf8(unhex(args.get(2)?)).ok()?;
    let path = match *args.get(1)? {
        "any" => PathMatch::Any,
        "exact" => PathMatch::Exact(s),
        "suffix" => PathMatch::Suffix(s),
        "contains" => PathMatch::Contains(s),
        _ => return None,
    };
    let n = args.get(4)?.parse().ok()?;
    let when = match *args.get(3)? {
        "nth" => When::Nth(n),
        "from" => When::From(n),
        "every" => When::Every,
        _ => return None,
    };
    let errno = args.get(5)?.parse().ok()?;
    Some(Fault { op, path, when, errno })
}

fn report_to_wire(r: &CutReport) -> String {
    format!(
        "report {} {} {} {} {} {} {} {}",
        r.frozen_at.as_ref().map_or("-".into(), point_to_wire),
        r.syncs,
        r.file_ops_kept,
        r.file_ops_dropped,
        r.torn_writes,
        r.dir_changes_kept,
        r.dir_changes_dropped,
        r.names
    )
}

fn report_from_wire(line: &str) -> io::Result<CutReport> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() != 9 || f[0] != "report" {
        return Err(bad(line));
    }
    let num = |i: usize| f[i].parse::<usize>().map_err(|_| bad(line));
    Ok(CutReport {
        frozen_at: if f[1] == "-" {
            None
        } else {
            Some(point_from_wire(f[1])?)
        },
        syncs: num(2)? as u64,
        file_ops_kept: num(3)?,
        file_ops_dropped: num(4)?,
        torn_writes: num(5)?,
        dir_changes_kept: num(6)?,
        dir_changes_dropped: num(7)?,
        names: num(8)?,
    })
}

/// The parent's handle on a running daemon.
pub(crate) struct Daemon {
    pid: libc::pid_t,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Daemon {
    /// Forks a daemon that scans `backing` and mounts it at `mountpoint`;
    /// returns once it is mounted (or why it could not be).
    pub fn spawn(backing: &Path, mountpoint: &Path, timeout: Duration) -> io::Result<Daemon> {
        let root = sys::openat(
            libc::AT_FDCWD,
            backing.as_os_str(),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )?;
        let (parent, child) = UnixStream::pair()?;
        // Everything the child needs is allocated before the fork.
        let (backing, mountpoint) = (backing.to_path_buf(), mountpoint.to_path_buf());
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            drop(parent);
            let code = match child_main(root, child, &backing, &mountpoint) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            // No destructors, no atexit handlers of the parent's program.
            unsafe { libc::_exit(code) }
        }
        drop((child, root));
        parent.set_read_timeout(Some(timeout))?;
        let mut d = Daemon {
            pid,
            reader: BufReader::new(parent.try_clone()?),
            writer: parent,
        };
        let first = d.read_line();
        match first.as_deref() {
            Ok("mounted") => Ok(d),
            Ok(other) => {
                d.reap(timeout);
                let why = other
                    .strip_prefix("error ")
                    .map(|h| String::from_utf8_lossy(&unhex(h)).into_owned());
                Err(io::Error::other(why.unwrap_or_else(|| other.to_string())))
            }
            Err(e) => {
                d.reap(timeout);
                Err(io::Error::new(
                    e.kind(),
                    format!("the daemon did not report its mount: {e}"),
                ))
            }
        }
    }

    fn read_line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the daemon exited"));
        }
        Ok(line.trim_end_matches('\n').to_string())
    }

    fn call(&mut self, request: &str) -> io::Result<String> {
        writeln!(self.writer, "{request}")?;
        self.read_line()
    }

    pub fn sync_points(&mut self) -> io::Result<Vec<SyncPoint>> {
        let line = self.call("points")?;
        line.split(' ').filter(|s| !s.is_empty()).map(point_from_wire).collect()
    }

    pub fn sync_count(&mut self) -> io::Result<u64> {
        self.call("count")?.parse().map_err(|_| bad("count"))
    }

    pub fn frozen_at(&mut self) -> io::Result<Option<SyncPoint>> {
        let line = self.call("frozen")?;
        if line == "-" {
            Ok(None)
        } else {
            point_from_wire(&line).map(Some)
        }
    }

    pub fn cut_at_sync(&mut self, n: u64) -> io::Result<()> {
        self.call(&format!("cut_at {n}")).map(drop)
    }

    pub fn inject(&mut self, fault: &Fault) -> io::Result<usize> {
        let line = self.call(&format!("inject {}", fault_to_wire(fault)))?;
        line.parse().map_err(|_| bad(&line))
    }

    pub fn fault_fired(&mut self, id: usize) -> io::Result<u64> {
        self.call(&format!("fired {id}"))?.parse().map_err(|_| bad("fired"))
    }

    pub fn clear_faults(&mut self) -> io::Result<()> {
        self.call("clear").map(drop)
    }

    /// Tells the daemon to rebuild with `mode` once its mount is gone.
    pub fn plan_cut(&mut self, mode: CutMode) -> io::Result<()> {
        self.call(&format!("cut {}", mode_to_wire(mode))).map(drop)
    }

    /// After the unmount: the daemon's last word (a cut's report, or
    /// `None` after a plain unmount), then its exit.
    pub fn finish(mut self, timeout: Duration) -> io::Result<Option<CutReport>> {
        self.writer.set_read_timeout(Some(timeout))?;
        let line = self.read_line();
        self.reap(timeout);
        let line = line?;
        if line == "done" {
            Ok(None)
        } else if let Some(h) = line.strip_prefix("error ") {
            Err(io::Error::other(String::from_utf8_lossy(&unhex(h)).into_owned()))
        } else {
            report_from_wire(&line).map(Some)
        }
    }

    /// Waits for the child to exit, at most `timeout`; a child that does
    /// not is killed (it has already said all it had to say).
    fn reap(&mut self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let mut status = 0;
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if rc != 0 {
                return;
            }
            if std::time::Instant::now() > deadline {
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                unsafe { libc::waitpid(self.pid, &mut status, 0) };
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Closes every inherited descriptor above stderr except `keep`.
fn close_inherited(keep: &[i32]) {
    let fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
            .collect(),
        Err(_) => return,
    };
    for fd in fds {
        if fd > 2 && !keep.contains(&fd) {
            unsafe { libc::close(fd) };
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn child_main(root: File, sock: UnixStream, backing: &Path, mountpoint: &Path) -> io::Result<()> {
    close_inherited(&[root.as_raw_fd(), sock.as_raw_fd()]);
    let mut out = sock.try_clone()?;
    let fail = |out: &mut UnixStream, e: &dyn std::fmt::Display| {
        let _ = writeln!(out, "error {}", hex(e.to_string().as_bytes()));
    };
    let model = match Model::scan(root) {
        Ok(m) => Arc::new(Mutex::new(m)),
        Err(e) => {
            fail(&mut out, &format!("powerfs: scan {}: {e}", backing.display()));
            return Err(e);
        }
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("powerfs".into()),
        fuser::MountOption::Subtype("powerfs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    let fs = PowerFsImpl { model: model.clone() };
    let session = match fuser::spawn_mount(fs, mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            fail(&mut out, &format!("powerfs: mount {}: {e}", mountpoint.display()));
            return Err(e);
        }
    };
    writeln!(out, "mounted")?;

    let planned: Arc<Mutex<Option<CutMode>>> = Arc::default();
    {
        let (model, planned) = (model.clone(), planned.clone());
        let mountpoint = mountpoint.to_path_buf();
        let mut reply = sock.try_clone()?;
        std::thread::Builder::new()
            .name("powerfs-control".into())
            .spawn(move || {
                let reader = BufReader::new(sock);
                for line in reader.lines() {
                    let Ok(line) = line else { break };
                    let answer = control(&model, &planned, &line);
                    if writeln!(reply, "{answer}").is_err() {
                        break;
                    }
                }
                // The parent is gone (or done): never leave a mount behind.
                if lock(&planned).is_none() {
                    let _ = sys::umount2(&mountpoint, libc::MNT_DETACH);
                }
            })?;
    }

    // The session ends when the parent unmounts (or the control thread
    // detaches the mount because the parent died).
    let _ = session.join();
    let mode = lock(&planned).take();
    match mode {
        None => writeln!(out, "done")?,
        Some(mode) => {
            let m = lock(&model);
            match cut::rebuild(&m, backing, mode) {
                Ok(report) => writeln!(out, "{}", report_to_wire(&report))?,
                Err(e) => fail(&mut out, &format!("powerfs: rebuild {}: {e}", backing.display())),
            }
        }
    }
    Ok(())
}

fn control(model: &Mutex<Model>, planned: &Mutex<Option<CutMode>>, line: &str) -> String {
    let args: Vec<&str> = line.split(' ').collect();
    let mut m = lock(model);
    match args.as_slice() {
        ["count"] => m.syncs.len().to_string(),
        ["points"] => m.syncs.iter().map(point_to_wire).collect::<Vec<_>>().join(" "),
        ["frozen"] => m
            .frozen_at
            .and_then(|n| m.syncs.get(n as usize - 1))
            .map_or("-".into(), point_to_wire),
        ["cut_at", n] => {
            m.cut_at = n.parse().ok();
            "ok".into()
        }
        ["inject", rest @ ..] => match fault_from_wire(rest) {
            Some(fault) => {
                m.faults.push(Armed {
                    fault,
                    seen: 0,
                    fired: 0,
                });
                (m.faults.len() - 1).to_string()
            }
            None => "error".into(),
        },
        ["fired", id] => id
            .parse::<usize>()
            .ok()
            .and_then(|id| m.faults.get(id))
            .map_or(0, |a| a.fired)
            .to_string(),
        ["clear"] => {
            m.faults.clear();
            "ok".into()
        }
        ["cut", kind, seed] => {
            let seed = seed.parse().unwrap_or(0);
            let mode = match *kind {
                "keep" => CutMode::KeepPending,
                "torn" => CutMode::TornPrefix { seed },
                "reorder" => CutMode::Reorder { seed },
                _ => CutMode::DropPending,
            };
            *lock(planned) = Some(mode);
            "ok".into()
        }
        _ => "error".into(),
    }
}
