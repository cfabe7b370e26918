"""Real PostgreSQL servers for the package's tests, as tests/common/pg.rs
and tests/common/pg_cluster.rs run them for the Rust scenarios.

- ``initdb`` into a temporary folder of its own (mode 0755, owned by the
  server's account), as the unprivileged ``postgres`` account when the
  tests run as root (initdb refuses root), through ``setpriv``;
- host logins by ``scram-sha-256`` with :data:`PASSWORD`, so a password is
  really checked; local (socket) logins trusted;
- listening on a free ``127.0.0.1`` port only; the URL says
  ``sslmode=disable``, which turnsafe accepts for loopback;
- :meth:`PgServer.stop_immediate` (``pg_ctl stop -m immediate``, no
  checkpoint), :meth:`PgServer.kill9` (SIGKILL to the postmaster, waiting
  until every child is gone), :meth:`PgServer.start_again` on the same port;
- :class:`SyncPair`: a primary and a streaming standby (``pg_basebackup
  -R``) named in ``synchronous_standby_names`` with ``synchronous_commit =
  remote_apply``, for failover (:meth:`PgServer.promote`).

The binaries come from ``pg_config --bindir``. A missing capability (no
binaries, no ``postgres`` account) raises :class:`Unavailable`, which the
fixtures turn into ``need(False, why)``: a failure under ``CI=true``, a
counted skip elsewhere. Any later step that fails raises
:class:`HarnessBroken`: a failure, never a skip.

Queries of the tests' own go through ``psql`` over TCP with the password,
not through the package under test.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

USER = "postgres"
PASSWORD = "turnsafe-test-pw"
STANDBY_NAME = "turnsafe_standby"


class Unavailable(Exception):
    """A capability the harness needs is missing (binaries, account)."""


class HarnessBroken(RuntimeError):
    """A harness step failed although every capability is there."""


def bindir() -> Path:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise Unavailable(
            f"pg_config not found ({e}); install postgresql-15 (apt-get install -y postgresql-15)"
        ) from e
    if out.returncode != 0:
        raise Unavailable(f"pg_config --bindir failed: {out.stderr.strip()}")
    d = Path(out.stdout.strip())
    for b in ("initdb", "pg_ctl", "pg_basebackup", "psql"):
        if not (d / b).is_file():
            raise Unavailable(f"{d} has no {b}; install the server package (apt-get install -y postgresql-15)")
    return d


def postgres_account() -> Tuple[int, int]:
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        raise Unavailable("no `postgres` account to run the server as (initdb refuses root)") from None
    if shutil.which("setpriv") is None:
        raise Unavailable("setpriv is not installed (util-linux): needed to run the server as `postgres`")
    return pw.pw_uid, pw.pw_gid


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children_of(pid: int) -> List[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None and st[1] == pid:
                out.append(int(name))
    return out


def _proc_stat(pid: int) -> Optional[Tuple[str, int]]:
    """``(state, ppid)`` from /proc/<pid>/stat (fields after the last ``)``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 1:].split()
    return rest[0], int(rest[1])


def _alive(pid: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


class PgServer:
    """One PostgreSQL server in a temporary folder. Use :meth:`start`, or
    :meth:`standby_of`; :meth:`close` stops it (immediate) and removes
    the folder."""

    def __init__(self) -> None:
        """A folder for a server that does not exist yet (``<dir>/sock``
        made, nothing running)."""
        self.bindir = bindir()
        self.run_as = postgres_account() if os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix="turnsafe-pg-py-"))
        self.port = 0
        self.running = False
        try:
            os.chmod(self.dir, 0o755)
            (self.dir / "sock").mkdir()
            if self.run_as:
                for p in (self.dir, self.dir / "sock"):
                    os.chown(p, *self.run_as)
        except OSError as e:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise HarnessBroken(f"prepare {self.dir}: {e}") from e

    # ------------------------------------------------------------ making one

    @classmethod
    def start(cls, extra: Sequence[str] = ()) -> "PgServer":
        """initdb and start a server; ``extra`` lines go to postgresql.conf."""
        server = cls()
        try:
            pwfile = server.dir / "pw"
            pwfile.write_text(PASSWORD)
            if server.run_as:
                os.chown(pwfile, *server.run_as)
            server._run(
                "initdb", "-D", str(server.data), "-U", USER, "--pwfile", str(pwfile),
                "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync",
            )
            conf = ["listen_addresses = '127.0.0.1'", "max_connections = 60", *extra]
            server.append_conf("\n".join(conf) + "\n")
            server._start_on_a_free_port()
        except BaseException:
            server.close()
            raise
        return server

    @classmethod
    def standby_of(cls, primary: "PgServer", application_name: str = STANDBY_NAME) -> "PgServer":
        """A streaming standby of ``primary``: ``pg_basebackup -R`` (so
        ``primary_conninfo`` and ``standby.signal`` are written) with
        ``application_name`` in the conninfo, on a loopback port of its own."""
        standby = cls()
        try:
            conninfo = (
                f"host=127.0.0.1 port={primary.port} user={USER} password={PASSWORD} "
                f"application_name={application_name}"
            )
            standby._run(
                "pg_basebackup", "-d", conninfo, "-w", "-D", str(standby.data),
                "-X", "stream", "-c", "fast", "-R", "--no-sync", timeout=120,
            )
            standby._start_on_a_free_port()
        except BaseException:
            standby.close()
            raise
        return standby

    # ------------------------------------------------------------ running it

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def _command(self, binary: str, *args: str) -> List[str]:
        cmd = [str(self.bindir / binary), *args]
        if self.run_as:
            uid, gid = self.run_as
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *cmd]
        return cmd

    def _run(self, binary: str, *args: str, timeout: float = 90, check: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "PGDATA"}
        env["LC_ALL"] = "C"
        try:
            out = subprocess.run(
                self._command(binary, *args), cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
                capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise HarnessBroken(f"{binary} {' '.join(args)}: still running after {timeout} s: {e.stderr}") from e
        if check and out.returncode != 0:
            raise HarnessBroken(f"{binary} {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def append_conf(self, lines: str) -> None:
        """Append to postgresql.conf (later lines win)."""
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(lines)

    def _start_on_a_free_port(self) -> None:
        # A port taken between the probe and the bind gets another try.
        last: Optional[Exception] = None
        for _ in range(5):
            self.port = free_port()
            try:
                self.start_again()
                return
            except HarnessBroken as e:
                last = e
        raise HarnessBroken(f"no free port taken after 5 tries: {last}")

    def start_again(self) -> None:
        """``pg_ctl start`` on the same port, waiting until it accepts
        connections (crash recovery first after a kill)."""
        log = self.dir / "server.log"
        out = self._run(
            "pg_ctl", "-D", str(self.data), "-o", f"-p {self.port} -k {self.dir / 'sock'}",
            "-l", str(log), "-w", "-t", "60", "start", check=False, timeout=90,
        )
        if out.returncode != 0:
            tail = " | ".join(self.log().splitlines()[-5:])
            raise HarnessBroken(f"pg_ctl start failed: {out.stderr.strip()} {tail}")
        self.running = True

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: no checkpoint, every connection
        closed, as a crash would."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.running = False

    def postmaster_pid(self) -> Optional[int]:
        try:
            return int((self.data / "postmaster.pid").read_text().splitlines()[0].strip())
        except (OSError, ValueError, IndexError):
            return None

    def kill9(self) -> None:
        """SIGKILL to the postmaster, then wait until it and every child
        (backends, walsenders, checkpointer) are gone, so the port is free
        and no old backend still answers."""
        pid = self.postmaster_pid()
        if pid is None:
            raise HarnessBroken(f"no postmaster.pid in {self.data}")
        children = _children_of(pid)  # by parent pid, so before the parent dies
        os.kill(pid, signal.SIGKILL)
        self.running = False
        everyone = [pid, *children]
        deadline = time.monotonic() + 20
        while True:
            alive = [p for p in everyone if _alive(p)]
            # The postmaster must be reaped too, not only dead: a new one
            # refuses to start while the pid in postmaster.pid exists, and
            # a zombie exists until whoever adopted it reaps it.
            if not alive and _proc_stat(pid) is None:
                return
            if time.monotonic() >= deadline:
                for p in alive:
                    os.kill(p, signal.SIGKILL)
                raise HarnessBroken(
                    f"the killed postmaster {pid} or its children were still there after 20 s: "
                    f"running {alive}, postmaster {_proc_stat(pid)}"
                )
            time.sleep(0.05)

    def promote(self) -> None:
        """``pg_ctl promote`` a standby, then wait until it accepts writes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote", timeout=70)
        self.wait_writable(30)

    def wait_writable(self, limit: float) -> None:
        wait_for(
            f"the server on port {self.port} accepting writes", limit,
            lambda: self.query("SHOW transaction_read_only", retry=0) == [["off"]] or None,
        )

    def close(self) -> None:
        """Stop (immediate) if running, and remove the folder."""
        if self.running and self.postmaster_pid() is not None:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------ talking to it

    def url(self, db: str = "postgres", **params: str) -> str:
        """A URL for ``db`` with the password in it, plaintext (loopback)."""
        q = {"sslmode": "disable", "connect_timeout": "5", **params}
        query = "&".join(f"{k}={v}" for k, v in q.items())
        return f"postgres://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{db}?{query}"

    def shown(self, db: str = "postgres") -> str:
        """The form turnsafe shows for ``db``: no password, no parameters."""
        return f"postgres://{USER}@127.0.0.1:{self.port}/{db}"

    def query(self, sql: str, db: str = "postgres", retry: float = 30) -> List[List[str]]:
        """Run ``sql`` with psql (over TCP, scram); rows as lists of text
        (NULL as ``""``). Retries a refused connection for ``retry`` s."""
        env = dict(os.environ, PGPASSWORD=PASSWORD, PGCONNECT_TIMEOUT="5", LC_ALL="C")
        env.pop("PGSERVICE", None)
        cmd = [
            str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-F", "\x1f", "-R", "\x1e", "-v", "ON_ERROR_STOP=1",
            "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", db, "-c", sql,
        ]
        deadline = time.monotonic() + retry
        while True:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
            if out.returncode == 0:
                text = out.stdout.rstrip("\n")
                return [r.split("\x1f") for r in text.split("\x1e") if r.strip("\n") != ""] if text else []
            # psql exits 2 when the connection failed, 1/3 for an error in the SQL.
            if out.returncode != 2 or time.monotonic() >= deadline:
                raise HarnessBroken(f"psql on port {self.port} ({db}): {sql!r}: {out.stderr.strip()}")
            time.sleep(0.1)

    def create_db(self, name: str) -> str:
        self.query(f'CREATE DATABASE "{name}"')
        return name

    def messages(self, db: str, session: str) -> List[Tuple[str, int, str]]:
        """``(uid, seq, item)`` of a session's stored messages in order, read
        with psql (not through turnsafe)."""
        rows = self.query(
            f"SELECT uid, seq, item FROM messages WHERE session_id = '{_literal(session)}' ORDER BY seq, id", db
        )
        return [(r[0], int(r[1]), r[2]) for r in rows]


def _literal(s: str) -> str:
    assert "\\" not in s
    return s.replace("'", "''")


def wait_for(what: str, limit: float, probe) -> object:
    """Poll ``probe`` until it returns something other than None (a
    :class:`HarnessBroken` it raises counts as not yet)."""
    deadline = time.monotonic() + limit
    last = "nothing yet"
    while True:
        try:
            v = probe()
            if v is not None:
                return v
        except HarnessBroken as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise HarnessBroken(f"{what}: not within {limit} s (last: {last})")
        time.sleep(0.1)


class SyncPair:
    """A primary and a synchronous streaming standby.

    1. the primary runs with ``synchronous_commit = remote_apply``: a commit
       is acknowledged only once the standby has applied it;
    2. the standby is ``pg_basebackup -R`` of it (``application_name``
       :data:`STANDBY_NAME`);
    3. once it streams, the primary's ``synchronous_standby_names`` names it
       (ALTER SYSTEM, reload), and the pair is ready when
       ``pg_stat_replication`` says ``sync``.

    The standby is made before step 3 on purpose: a primary naming a
    synchronous standby before one is connected makes every commit wait.
    """

    def __init__(self, primary: PgServer, standby: PgServer) -> None:
        self.primary = primary
        self.standby = standby

    @classmethod
    def start(cls, extra: Sequence[str] = ()) -> "SyncPair":
        primary = PgServer.start(["synchronous_commit = remote_apply", *extra])
        try:
            standby = PgServer.standby_of(primary, STANDBY_NAME)
        except BaseException:
            primary.close()
            raise
        pair = cls(primary, standby)
        try:
            wait_for("the standby streaming", 30, lambda: pair._standby_state("streaming"))
            primary.query(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            primary.query("SELECT pg_reload_conf()")
            wait_for("the standby synchronous", 30, lambda: pair._standby_state("streaming", "sync"))
        except BaseException:
            pair.close()
            raise
        return pair

    def _standby_state(self, state: str, sync_state: Optional[str] = None) -> Optional[bool]:
        for name, st, sync in self.replication():
            if name == STANDBY_NAME and st == state and (sync_state is None or sync == sync_state):
                return True
        return None

    def replication(self) -> List[Tuple[str, str, str]]:
        """``(application_name, state, sync_state)`` from the primary's
        ``pg_stat_replication``."""
        rows = self.primary.query("SELECT application_name, state, sync_state FROM pg_stat_replication", retry=0)
        return [(r[0], r[1], r[2]) for r in rows]

    def multi_host_url(self, db: str) -> str:
        """Both servers, primary first, ``target_session_attrs=read-write``:
        the client keeps the first that accepts writes."""
        return (
            f"postgres://{USER}:{PASSWORD}@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{db}"
            "?sslmode=disable&connect_timeout=5&target_session_attrs=read-write"
        )

    def multi_host_shown(self, db: str) -> str:
        return f"postgres://{USER}@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{db}"

    def close(self) -> None:
        # The standby first: a primary left waiting for it never matters
        # once both are stopped immediately.
        self.standby.close()
        self.primary.close()

