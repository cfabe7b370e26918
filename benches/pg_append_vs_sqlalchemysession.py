"""`turnsafe append --db` against the OpenAI Agents SDK's SQLAlchemySession
(asyncpg) on the same PostgreSQL server, with 1 and 16 sessions, in one run.

Each session sends BATCHES batches of 10 messages (about 230 B each) and
waits for each batch's answer before sending the next, as an agent turn
does: turnsafe through one `turnsafe append` process per session (its
outcome line is the answer), the SDK through `await session.add_items()`
(16 sessions through asyncio.gather on one engine). Both commit every
batch durably (the server's defaults: fsync on, synchronous_commit on).
Prints msg/s, p50/p99 batch latency and the ratios.

The server is started here (initdb into a temporary folder, as the
`postgres` account when run as root, on a free loopback port) unless
BENCH_DB names one (`postgres://user:pw@host:port/db`; sslmode=disable is
added for turnsafe when absent).

    benches/pg-append-vs-sqlalchemysession        # builds, makes the venv, runs this
"""

import asyncio
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

BATCHES = int(os.environ.get("BATCHES", "300"))
SESSIONS = [1, 16]


def batch(tag: str, b: int) -> list:
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"{tag} batch {b} message {i} " + "x" * 200} for i in range(10)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway PostgreSQL 15 server on a loopback port."""

    def __init__(self) -> None:
        bindir = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True,
                                text=True).stdout.strip()
        self.bindir = bindir
        self.dir = tempfile.mkdtemp(prefix="turnsafe-pgbench-")
        os.chmod(self.dir, 0o755)
        self.prefix = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.prefix = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("listen_addresses = '127.0.0.1'\nmax_connections = 100\n")
        self.run("pg_ctl", "-D", self.data, "-o", f"-p {self.port} -k {self.dir}",
                 "-l", os.path.join(self.dir, "log"), "-w", "start")

    def run(self, binary: str, *args: str) -> None:
        subprocess.run(self.prefix + [os.path.join(self.bindir, binary), *args], check=True,
                       capture_output=True, cwd=self.dir)

    def create_db(self, name: str) -> str:
        subprocess.run(self.prefix + [os.path.join(self.bindir, "psql"), "-h", "127.0.0.1", "-p",
                                      str(self.port), "-U", "postgres", "-c", f'CREATE DATABASE "{name}"'],
                       check=True, capture_output=True, cwd=self.dir)
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(self.prefix + [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "fast",
                                      "stop"], capture_output=True, cwd=self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


def pct(xs: list, p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000


def run_turnsafe(url: str, n: int, home: str) -> tuple:
    """n sessions, one `turnsafe append` process each, lockstep."""
    url = url if "sslmode=" in url else url + ("&" if "?" in url else "?") + "sslmode=disable"
    env = dict(os.environ, TURNSAFE_DB=url, TURNSAFE_LOG=os.environ.get("TURNSAFE_LOG", "error"))
    latencies, errors = [], []

    def one(s: int) -> None:
        proc = subprocess.Popen([os.environ["TURNSAFE_BIN"], "append", "--home", home, "--session", f"ts-{n}-{s}"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        mine = []
        for b in range(BATCHES):
            t = time.perf_counter()
            proc.stdin.write(json.dumps(batch(f"s{s}", b)) + "\n")
            proc.stdin.flush()
            out = json.loads(proc.stdout.readline())
            mine.append(time.perf_counter() - t)
            if not out.get("persisted"):
                errors.append(out)
        proc.stdin.close()
        proc.wait()
        latencies.extend(mine)

    threads = [threading.Thread(target=one, args=(s,)) for s in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    assert not errors, errors[:2]
    return n * BATCHES * 10 / elapsed, pct(latencies, 0.5), pct(latencies, 0.99)


async def run_sdk(url: str, n: int) -> tuple:
    from sqlalchemy.ext.asyncio import create_async_engine
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

    engine = create_async_engine(url.replace("postgres://", "postgresql+asyncpg://"), pool_size=n + 4)
    sessions = [SQLAlchemySession(f"sdk-{n}-{s}", engine=engine, create_tables=True) for s in range(n)]
    await sessions[0].get_items()  # create the tables outside the timing
    latencies = []

    async def one(s: int) -> None:
        for b in range(BATCHES):
            t = time.perf_counter()
            await sessions[s].add_items(batch(f"s{s}", b))
            latencies.append(time.perf_counter() - t)

    t = time.perf_counter()
    await asyncio.gather(*(one(s) for s in range(n)))
    elapsed = time.perf_counter() - t
    await engine.dispose()
    return n * BATCHES * 10 / elapsed, pct(latencies, 0.5), pct(latencies, 0.99)


def main() -> None:
    server = None
    given = os.environ.get("BENCH_DB")
    try:
        if not given:
            server = Server()
        home = tempfile.mkdtemp(prefix="turnsafe-pgbench-home-")
        rows = []
        for n in SESSIONS:
            ts_url = given or server.create_db(f"ts{n}")
            sdk_url = given or server.create_db(f"sdk{n}")
            ts = run_turnsafe(ts_url, n, home)
            sdk = asyncio.run(run_sdk(sdk_url, n))
            rows.append((n, ts, sdk))
        print(f"PostgreSQL {'(BENCH_DB)' if given else '15, local, fsync on'}; {BATCHES} batches x 10 messages "
              f"(~230 B) per session, one batch in flight per session")
        print("| sessions | turnsafe append --db msg/s | p50 / p99 ms | SQLAlchemySession (asyncpg) msg/s "
              "| p50 / p99 ms | ratio |")
        print("|---|---|---|---|---|---|")
        for n, ts, sdk in rows:
            print(f"| {n} | {ts[0]:,.0f} | {ts[1]:.2f} / {ts[2]:.2f} | {sdk[0]:,.0f} | {sdk[1]:.2f} / {sdk[2]:.2f} "
                  f"| {ts[0] / sdk[0]:.2f}x |")
        one, many = rows[0], rows[1]
        print(f"scaling 1 -> 16 sessions: turnsafe {many[1][0] / one[1][0]:.2f}x, "
              f"SQLAlchemySession {many[2][0] / one[2][0]:.2f}x")
        shutil.rmtree(home, ignore_errors=True)
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
