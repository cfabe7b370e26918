//! A loopback TCP proxy between a PostgreSQL client and a real server
//! that can cut the connection around `COMMIT`: the two moments whose
//! outcomes differ and that no server setting can produce on demand.
//!
//! - [`Mode::DropBeforeCommit`]: the `COMMIT` is never forwarded. The
//!   server sees its client go inside an open transaction and aborts it.
//! - [`Mode::DropAfterCommit`]: the `COMMIT` is forwarded, the server's
//!   answer is read up to its `ReadyForQuery` (so the commit is done),
//!   and the connection is cut without relaying any of it. The client
//!   cannot tell this from the case above: that is the point.
//! - [`Mode::Refuse`]: every new connection is closed as soon as it is
//!   accepted; connections already open carry on.
//! - [`Mode::Pass`]: bytes both ways, untouched.
//!
//! The mode is read when a `COMMIT` is seen (or a connection accepted),
//! so it may be changed at any time; [`PgProxy::once`] arms a mode for
//! the next cut only. [`CutStyle`] says whether a cut is a FIN or a RST.
//!
//! What is recognised as `COMMIT` (the frontend protocol is parsed; the
//! link must be plaintext, `sslmode=disable`):
//! - a simple-query `Q` whose whole text is `COMMIT` or `END`, with an
//!   optional `WORK`/`TRANSACTION` and `;`, any case. This is what
//!   `postgres` 0.19 sends for `Transaction::commit()`: tokio-postgres's
//!   `Transaction::commit` calls `batch_execute("COMMIT")`, one `Q`.
//! - the extended protocol: a `Parse` of such text names a statement, a
//!   `Bind` of it names a portal, and the `Execute` of that portal is the
//!   commit (what `client.execute("COMMIT", &[])` sends). The server
//!   commits at `Execute`, so `DropBeforeCommit` holds back the `Execute`.
//!
//! Everything the server sends after a forwarded `COMMIT` is taken to be
//! its answer: true of a client that waits for each answer before the
//! next request, as the `postgres` crate and turnsafe do (a pipelining
//! client could have earlier answers swallowed too). The answer is
//! swallowed whatever it says: when it was an error (a deferred
//! constraint, a serialization failure), nothing was committed, and
//! [`PgProxy::swallowed_commit_errors`] counts it.
//!
//! Each connection is served by one thread that polls both sockets, so a
//! cut closes each socket exactly once. Dropping the proxy stops the
//! listener and every connection within about 100 ms.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the proxy does; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    DropBeforeCommit,
    DropAfterCommit,
    Refuse,
}

/// How a connection is cut, on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutStyle {
    /// An orderly close (FIN): the peer reads end of file.
    Close,
    /// A reset (RST, `SO_LINGER` 0): the peer's next read or write fails
    /// with `ECONNRESET`.
    Reset,
}

/// How long a [`Mode::DropAfterCommit`] waits for the server's answer
/// before cutting anyway (and saying so on stderr).
const ANSWER_WAIT: Duration = Duration::from_secs(15);
/// How often each thread looks at the stop flag.
const TICK: Duration = Duration::from_millis(100);

struct Settings {
    mode: Mode,
    /// Back to `Pass` after the next cut.
    once: bool,
    style: CutStyle,
}

struct Shared {
    upstream: SocketAddr,
    settings: Mutex<Settings>,
    stop: AtomicBool,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    live: AtomicUsize,
    commits: AtomicUsize,
    cuts_before: AtomicUsize,
    cuts_after: AtomicUsize,
    swallowed_errors: AtomicUsize,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    /// The mode to apply to a `COMMIT` seen now; a one-shot cut is
    /// consumed here, so only one connection gets it.
    fn take_commit_mode(&self) -> (Mode, CutStyle) {
        let mut s = self.settings.lock().unwrap();
        let mode = s.mode;
        if s.once && matches!(mode, Mode::DropBeforeCommit | Mode::DropAfterCommit) {
            s.mode = Mode::Pass;
            s.once = false;
        }
        (mode, s.style)
    }
}

/// The proxy; see the module documentation.
pub struct PgProxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl PgProxy {
    /// Listen on a free loopback port, relaying to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> io::Result<PgProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            settings: Mutex::new(Settings {
                mode: Mode::Pass,
                once: false,
                style: CutStyle::Close,
            }),
            stop: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            commits: AtomicUsize::new(0),
            cuts_before: AtomicUsize::new(0),
            cuts_after: AtomicUsize::new(0),
            swallowed_errors: AtomicUsize::new(0),
            workers: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("pg-proxy-{port}"))
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(PgProxy {
            port,
            shared,
            acceptor: Some(acceptor),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `db` through the proxy, as the harness's superuser,
    /// plaintext (the proxy reads the protocol).
    pub fn url(&self, db: &str) -> String {
        self.url_as(super::pg::USER, super::pg::PASSWORD, db)
    }

    pub fn url_as(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{db}?sslmode=disable&connect_timeout=5",
            self.port
        )
    }

    /// From now on, until changed.
    pub fn set_mode(&self, mode: Mode) {
        let mut s = self.shared.settings.lock().unwrap();
        s.mode = mode;
        s.once = false;
    }

    /// For the next cut only (a `Drop*Commit` mode), then back to `Pass`.
    /// `Refuse` and `Pass` are set as with [`PgProxy::set_mode`].
    pub fn once(&self, mode: Mode) {
        let mut s = self.shared.settings.lock().unwrap();
        s.mode = mode;
        s.once = matches!(mode, Mode::DropBeforeCommit | Mode::DropAfterCommit);
    }

    pub fn mode(&self) -> Mode {
        self.shared.settings.lock().unwrap().mode
    }

    pub fn set_cut_style(&self, style: CutStyle) {
        self.shared.settings.lock().unwrap().style = style;
    }

    /// Connections accepted so far, refused ones included.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed on accept ([`Mode::Refuse`]).
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections being relayed now.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }

    /// `COMMIT`s seen, whatever was done with them.
    pub fn commits_seen(&self) -> usize {
        self.shared.commits.load(Ordering::SeqCst)
    }

    /// Connections cut with the `COMMIT` held back.
    pub fn cuts_before_commit(&self) -> usize {
        self.shared.cuts_before.load(Ordering::SeqCst)
    }

    /// Connections cut after the server answered the `COMMIT`.
    pub fn cuts_after_commit(&self) -> usize {
        self.shared.cuts_after.load(Ordering::SeqCst)
    }

    /// Answers to a forwarded `COMMIT` that were errors (nothing was
    /// committed), swallowed by a cut all the same.
    pub fn swallowed_commit_errors(&self) -> usize {
        self.shared.swallowed_errors.load(Ordering::SeqCst)
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        let workers = std::mem::take(&mut *self.shared.workers.lock().unwrap());
        for w in workers {
            let _ = w.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        if !poll_readable(&[listener.as_raw_fd()], TICK)[0] {
            continue;
        }
        let client = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                eprintln!("pg proxy: accept: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let (mode, style) = {
            let s = shared.settings.lock().unwrap();
            (s.mode, s.style)
        };
        if mode == Mode::Refuse {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            cut(client, style);
            continue;
        }
        let worker = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new().name("pg-proxy-conn".into()).spawn(move || {
                shared.live.fetch_add(1, Ordering::SeqCst);
                serve(client, &shared);
                shared.live.fetch_sub(1, Ordering::SeqCst);
            })
        };
        let mut workers = shared.workers.lock().unwrap();
        workers.retain(|w| !w.is_finished());
        match worker {
            Ok(w) => workers.push(w),
            Err(e) => eprintln!("pg proxy: no thread for a connection: {e}"),
        }
    }
}

/// Relay one connection until either side closes, a cut, or the stop flag.
fn serve(client: TcpStream, shared: &Shared) {
    let server = match TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pg proxy: upstream {}: {e}", shared.upstream);
            return;
        }
    };
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        // A peer that stops reading must not hang the proxy for ever.
        let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
    }
    let mut client = Some(client);
    let mut server = Some(server);
    let mut front = Frontend::default();
    let mut back = Backend::default();
    // Set once a COMMIT went to the server in `DropAfterCommit`: cut when
    // its answer is complete, with this style, by this time.
    let mut armed: Option<(CutStyle, Instant)> = None;
    let mut buf = vec![0u8; 64 * 1024];
    let close_both = |c: &mut Option<TcpStream>, s: &mut Option<TcpStream>, style: CutStyle| {
        if let Some(c) = c.take() {
            cut(c, style);
        }
        if let Some(s) = s.take() {
            cut(s, style);
        }
    };
    'relay: loop {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let (Some(c), Some(s)) = (client.as_mut(), server.as_mut()) else {
            break;
        };
        if let Some((style, by)) = armed
            && Instant::now() >= by
        {
            eprintln!("pg proxy: no answer to COMMIT within {ANSWER_WAIT:?}; cutting anyway");
            shared.cuts_after.fetch_add(1, Ordering::SeqCst);
            close_both(&mut client, &mut server, style);
            break;
        }
        let ready = poll_readable(&[c.as_raw_fd(), s.as_raw_fd()], TICK);
        if ready[0] {
            let n = match c.read(&mut buf) {
                Ok(0) | Err(_) => {
                    close_both(&mut client, &mut server, CutStyle::Close);
                    break;
                }
                Ok(n) => n,
            };
            front.buf.extend_from_slice(&buf[..n]);
            while let Some(msg) = front.next() {
                back.pending_single += msg.single_byte_replies;
                if !msg.commit {
                    if s.write_all(&msg.bytes).is_err() {
                        close_both(&mut client, &mut server, CutStyle::Close);
                        break 'relay;
                    }
                    continue;
                }
                shared.commits.fetch_add(1, Ordering::SeqCst);
                match shared.take_commit_mode() {
                    (Mode::DropBeforeCommit, style) => {
                        shared.cuts_before.fetch_add(1, Ordering::SeqCst);
                        close_both(&mut client, &mut server, style);
                        break 'relay;
                    }
                    (Mode::DropAfterCommit, style) => {
                        armed = Some((style, Instant::now() + ANSWER_WAIT));
                        if s.write_all(&msg.bytes).is_err() {
                            close_both(&mut client, &mut server, style);
                            break 'relay;
                        }
                    }
                    _ => {
                        if s.write_all(&msg.bytes).is_err() {
                            close_both(&mut client, &mut server, CutStyle::Close);
                            break 'relay;
                        }
                    }
                }
            }
        }
        let (Some(c), Some(s)) = (client.as_mut(), server.as_mut()) else {
            break;
        };
        if ready[1] {
            let n = match s.read(&mut buf) {
                Ok(0) | Err(_) => {
                    if armed.is_some() {
                        shared.cuts_after.fetch_add(1, Ordering::SeqCst);
                    }
                    let style = armed.map_or(CutStyle::Close, |(style, _)| style);
                    close_both(&mut client, &mut server, style);
                    break;
                }
                Ok(n) => n,
            };
            back.buf.extend_from_slice(&buf[..n]);
            while let Some((kind, bytes)) = back.next() {
                if let Some((style, _)) = armed {
                    // The COMMIT's answer: swallowed; its ReadyForQuery
                    // means the server is done with it.
                    if kind == b'E' {
                        shared.swallowed_errors.fetch_add(1, Ordering::SeqCst);
                    }
                    if kind == b'Z' {
                        shared.cuts_after.fetch_add(1, Ordering::SeqCst);
                        close_both(&mut client, &mut server, style);
                        break 'relay;
                    }
                    continue;
                }
                if back.opaque {
                    front.opaque = true;
                }
                if c.write_all(&bytes).is_err() {
                    close_both(&mut client, &mut server, CutStyle::Close);
                    break 'relay;
                }
            }
        }
    }
}

/// Cut one socket: FIN after draining what is already readable (unread
/// data would turn a close into a RST), or RST through `SO_LINGER` 0.
fn cut(stream: TcpStream, style: CutStyle) {
    match style {
        CutStyle::Close => {
            let _ = stream.shutdown(Shutdown::Write);
            if stream.set_nonblocking(true).is_ok() {
                let mut sink = [0u8; 4096];
                while matches!((&stream).read(&mut sink), Ok(n) if n > 0) {}
            }
        }
        CutStyle::Reset => {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            unsafe {
                libc::setsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                );
            }
        }
    }
    drop(stream);
}

/// Which of `fds` are readable (or closed) within `timeout`.
fn poll_readable(fds: &[i32], timeout: Duration) -> Vec<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let n = unsafe {
        libc::poll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            timeout.as_millis() as i32,
        )
    };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    pfds.iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect()
}

/// Whether `sql` is, as a whole, a `COMMIT` (or its synonym `END`).
pub fn is_commit(sql: &str) -> bool {
    let sql = sql.trim();
    let sql = sql.strip_suffix(';').unwrap_or(sql);
    let words: Vec<String> = sql.split_whitespace().map(str::to_ascii_uppercase).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    matches!(
        words.as_slice(),
        ["COMMIT" | "END"] | ["COMMIT" | "END", "WORK" | "TRANSACTION"]
    )
}

/// One client message, whole.
struct FrontMsg {
    bytes: Vec<u8>,
    commit: bool,
    /// An `SSLRequest` or `GSSENCRequest`: the server answers with one
    /// untyped byte.
    single_byte_replies: usize,
}

/// The client's side of the protocol, as far as finding `COMMIT` needs.
#[derive(Default)]
struct Frontend {
    buf: Vec<u8>,
    /// Past the startup packet: every message is type, length, body.
    typed: bool,
    /// TLS or GSS encryption was accepted, or the bytes made no sense:
    /// relayed without reading.
    opaque: bool,
    /// Prepared statement name -> whether its text is a COMMIT.
    statements: HashMap<Vec<u8>, bool>,
    /// Portal name -> whether it runs a COMMIT.
    portals: HashMap<Vec<u8>, bool>,
}

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;

impl Frontend {
    fn next(&mut self) -> Option<FrontMsg> {
        if self.buf.is_empty() {
            return None;
        }
        if self.opaque {
            return Some(FrontMsg {
                bytes: std::mem::take(&mut self.buf),
                commit: false,
                single_byte_replies: 0,
            });
        }
        if !self.typed {
            // Startup phase: length, then a request code or the version.
            let len = be_u32(self.buf.get(..4)?) as usize;
            if !(8..=10_000).contains(&len) {
                self.opaque = true;
                return self.next();
            }
            if self.buf.len() < len {
                return None;
            }
            let bytes: Vec<u8> = self.buf.drain(..len).collect();
            let code = be_u32(&bytes[4..8]);
            let single = usize::from(code == SSL_REQUEST || code == GSSENC_REQUEST);
            // After a refused SSLRequest the real startup packet follows,
            // still untyped; anything else ends the startup phase.
            self.typed = single == 0;
            return Some(FrontMsg {
                bytes,
                commit: false,
                single_byte_replies: single,
            });
        }
        let len = be_u32(self.buf.get(1..5)?) as usize;
        if len < 4 {
            self.opaque = true;
            return self.next();
        }
        if self.buf.len() < 1 + len {
            return None;
        }
        let bytes: Vec<u8> = self.buf.drain(..1 + len).collect();
        let body = &bytes[5..];
        let commit = match bytes[0] {
            b'Q' => is_commit(&String::from_utf8_lossy(cstr(body).0)),
            b'P' => {
                let (name, rest) = cstr(body);
                let (query, _) = cstr(rest);
                self.statements
                    .insert(name.to_vec(), is_commit(&String::from_utf8_lossy(query)));
                false
            }
            b'B' => {
                let (portal, rest) = cstr(body);
                let (statement, _) = cstr(rest);
                let runs_commit = self.statements.get(statement).copied().unwrap_or(false);
                self.portals.insert(portal.to_vec(), runs_commit);
                false
            }
            b'E' => self.portals.get(cstr(body).0).copied().unwrap_or(false),
            b'C' => {
                if let Some((&kind, rest)) = body.split_first() {
                    let name = cstr(rest).0;
                    match kind {
                        b'S' => self.statements.remove(name),
                        _ => self.portals.remove(name),
                    };
                }
                false
            }
            _ => false,
        };
        Some(FrontMsg {
            bytes,
            commit,
            single_byte_replies: 0,
        })
    }
}

/// The server's side: framing only, to know where its answers end.
#[derive(Default)]
struct Backend {
    buf: Vec<u8>,
    /// Untyped one-byte answers owed (to SSLRequest/GSSENCRequest).
    pending_single: usize,
    /// Encryption was accepted: relayed without reading.
    opaque: bool,
}

impl Backend {
    /// The next whole message: its type byte (0 for an untyped or opaque
    /// chunk) and its bytes.
    fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        if self.buf.is_empty() {
            return None;
        }
        if self.opaque {
            return Some((0, std::mem::take(&mut self.buf)));
        }
        if self.pending_single > 0 {
            self.pending_single -= 1;
            let answer = self.buf.remove(0);
            // 'S' (TLS) or 'G' (GSS): encrypted from here on.
            self.opaque = answer == b'S' || answer == b'G';
            return Some((0, vec![answer]));
        }
        let len = be_u32(self.buf.get(1..5)?) as usize;
        if len < 4 {
            self.opaque = true;
            return self.next();
        }
        if self.buf.len() < 1 + len {
            return None;
        }
        let bytes: Vec<u8> = self.buf.drain(..1 + len).collect();
        Some((bytes[0], bytes))
    }
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A NUL-terminated string and what follows it.
fn cstr(b: &[u8]) -> (&[u8], &[u8]) {
    match b.iter().position(|&c| c == 0) {
        Some(i) => (&b[..i], &b[i + 1..]),
        None => (b, &[]),
    }
}
