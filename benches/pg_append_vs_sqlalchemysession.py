"""turnsafe on PostgreSQL against the OpenAI Agents SDK's SQLAlchemySession
(asyncpg), in one run, on one throwaway server this script initdb's itself
(PostgreSQL 15 from `pg_config --bindir`, fsync on, synchronous_commit on,
a free loopback port), with 1, 16 and 64 sessions at once (env SESSIONS).

Three stores, on the same batches (10 messages of about 230 B each), each
session sending its next batch only after its previous one is answered, as
an agent turn does:

- `turnsafe append --db` without `--session`: ONE process; the sessions
  write session-tagged lines to its stdin and read their outcomes from its
  stdout, so batches waiting together are committed together;
- `TurnsafeSession(db=...)` (the Python package, in process): the sessions
  share one `Store` and go through `asyncio.gather`;
- `SQLAlchemySession` with asyncpg: ONE engine shared by every session,
  `pool_size` equal to the number of sessions and `max_overflow=0`, through
  `asyncio.gather`.

Each store and session count gets a fresh database. Every session first
sends one untimed batch (tables, session rows and connections made). Per
store and count: msg/s (all messages over the wall time), p50 and p99 batch
latency, p99 over the same store's single-session p50, batches per commit
(the batches over the COMMIT records the server wrote to its WAL while the
store ran, counted with `pg_waldump`: each is one durable commit, one WAL
flush; for the command line also from its own `turnsafe::commit` log
lines), and the ratios against SQLAlchemySession at the same count.

    benches/pg-append-vs-sqlalchemysession   # builds, makes the venv, runs this

Environment: TURNSAFE_BIN (required), SESSIONS (default "1,16,64"),
BATCHES (batches per session, default 200), ROUNDS (interleaved rounds,
default 3: every figure is the median over them, and each ratio is taken
within a round and printed with its spread), PIPELINES (default "2,1": the
`TURNSAFE_PG_PIPELINE` of the first command-line row and of
`TurnsafeSession`, then one more command-line row per further depth, so
what pipelining buys is measured in the same run). Not for CI: it refuses to run
under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SESSIONS = [int(k) for k in os.environ.get("SESSIONS", "1,16,64").split(",")]
BATCHES = int(os.environ.get("BATCHES", "200"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
# `turnsafe append --db` once per pipeline depth (TURNSAFE_PG_PIPELINE):
# the first is the default's row, the others show what pipelining buys.
PIPELINES = [int(k) for k in os.environ.get("PIPELINES", "2,1").split(",")]
STORES = tuple(f"cli{d}" if i else "cli" for i, d in enumerate(PIPELINES)) + ("session", "sdk")
LABELS = {
    "cli": f"turnsafe append --db (one process, pipeline {PIPELINES[0]})",
    **{f"cli{d}": f"turnsafe append --db (one process, pipeline {d})" for d in PIPELINES[1:]},
    "session": f"TurnsafeSession(db=...) (pipeline {PIPELINES[0]})",
    "sdk": "SQLAlchemySession (asyncpg, one engine)",
}
DEPTH = {"cli": PIPELINES[0], "session": PIPELINES[0], **{f"cli{d}": d for d in PIPELINES[1:]}}


def batch(tag: str, b: int) -> list:
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"{tag} batch {b:>4} message {i} " + "x" * 200} for i in range(10)]


def pct(xs: list, p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway PostgreSQL server on a loopback port, fsync on; as the
    `postgres` account when run as root (initdb refuses root)."""

    def __init__(self) -> None:
        self.bindir = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True,
                                     text=True).stdout.strip()
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
            # The stores' connections (64 pooled for the SDK, the turnsafe
            # writers) and the bench's own; durability as shipped.
            # WAL is kept, so every run's commit records are still there
            # for pg_waldump to count.
            f.write("listen_addresses = '127.0.0.1'\nmax_connections = 200\n"
                    "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\nwal_keep_size = '4GB'\n")
        self.run("pg_ctl", "-D", self.data, "-o", f"-p {self.port} -k {self.dir}",
                 "-l", os.path.join(self.dir, "log"), "-w", "start")

    def run(self, binary: str, *args: str, check: bool = True) -> str:
        return subprocess.run(self.prefix + [os.path.join(self.bindir, binary), *args], check=check,
                              capture_output=True, text=True, cwd=self.dir).stdout

    def sql(self, query: str, db: str = "postgres") -> str:
        return subprocess.run(
            [os.path.join(self.bindir, "psql"), "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", db, "-c", query],
            check=True, capture_output=True, text=True).stdout.strip()

    def create_db(self, name: str) -> str:
        self.sql(f'CREATE DATABASE "{name}"')
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    async def flush_cost_us(self, inserts: int = 200) -> float:
        """The server's commit cost: median µs of `inserts` single-row
        INSERTs, each its own transaction (synchronous_commit=on)."""
        import asyncpg

        conn = await asyncpg.connect(self.create_db("flushcost"))
        try:
            await conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
            times = []
            for i in range(inserts):
                t = time.perf_counter()
                await conn.execute("INSERT INTO t VALUES ($1, $2)", i, "x" * 230)
                times.append(time.perf_counter() - t)
            return statistics.median(times) * 1e6
        finally:
            await conn.close()

    def wal_lsn(self) -> str:
        return self.sql("SELECT pg_current_wal_insert_lsn()")

    def commits_between(self, start: str, end: str) -> int:
        """COMMIT records in the WAL from `start` to `end`: top-level
        transactions that wrote (a savepoint's is part of its parent's,
        a read-only transaction writes none)."""
        out = self.run("pg_waldump", "-p", os.path.join(self.data, "pg_wal"), "-s", start, "-e", end,
                       "-r", "Transaction", check=False)
        return sum(1 for line in out.splitlines() if "desc: COMMIT " in line)

    def stop(self) -> None:
        subprocess.run(self.prefix + [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "fast",
                                      "stop"], check=False, capture_output=True, cwd=self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


async def timed(server: Server, sessions: int, send) -> dict:
    """Warm up (one untimed batch per session), then BATCHES per session,
    every session through `send(session, b)`, counting the commits."""
    await asyncio.gather(*(send(s, -1) for s in range(sessions)))
    lat: list = []

    async def client(s: int) -> None:
        for b in range(BATCHES):
            t = time.perf_counter()
            await send(s, b)
            lat.append(time.perf_counter() - t)

    start = server.wal_lsn()
    t0 = time.perf_counter()
    await asyncio.gather(*(client(s) for s in range(sessions)))
    wall = time.perf_counter() - t0
    commits = server.commits_between(start, server.wal_lsn())
    return {"wall": wall, "lat": lat, "commits": commits}


async def run_cli(server: Server, url: str, home: str, n: int, depth: int) -> dict:
    """One `turnsafe append --db` process for all n sessions (no --session)."""
    env = dict(os.environ, TURNSAFE_DB=url, TURNSAFE_LOG="turnsafe::commit=debug",
               TURNSAFE_PG_PIPELINE=str(depth))
    proc = await asyncio.create_subprocess_exec(
        os.environ["TURNSAFE_BIN"], "append", "--home", home,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, limit=1 << 24)
    waiting: dict = {}
    not_persisted = 0

    async def reader() -> None:
        nonlocal not_persisted
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            out = json.loads(line)
            if not out.get("persisted"):
                not_persisted += 1
            fut = waiting.pop(out.get("session"), None)
            if fut is not None:
                fut.set_result(out)

    stderr_task = asyncio.create_task(proc.stderr.read())
    read_task = asyncio.create_task(reader())
    loop = asyncio.get_running_loop()

    async def send(s: int, b: int) -> None:
        session = f"cli-{n}-{s}"
        fut = loop.create_future()
        waiting[session] = fut
        proc.stdin.write((json.dumps({"session": session, "messages": batch(session, b)}) + "\n").encode())
        await proc.stdin.drain()
        await fut

    res = await timed(server, n, send)
    proc.stdin.close()
    await read_task
    err = (await stderr_task).decode(errors="replace")
    await proc.wait()
    logged = [int(m) for m in re.findall(r"batches=(\d+)", err)]
    res["logged_per_commit"] = sum(logged) / len(logged) if logged else float("nan")
    res["not_persisted"] = not_persisted
    return res


async def run_session(server: Server, url: str, home: str, n: int) -> dict:
    """n TurnsafeSessions (one shared Store) through asyncio.gather."""
    from turnsafe_store.agents import TurnsafeSession

    os.environ["TURNSAFE_PG_PIPELINE"] = str(DEPTH["session"])
    sessions = [TurnsafeSession(f"py-{n}-{s}", home, db=url) for s in range(n)]
    not_persisted = 0

    async def send(s: int, b: int) -> None:
        nonlocal not_persisted
        from turnsafe_store import TurnNotPersisted

        try:
            await sessions[s].add_items(batch(sessions[s].session_id, b))
        except TurnNotPersisted:
            not_persisted += 1

    res = await timed(server, n, send)
    for s in sessions:
        s.close()
    sessions[0].store.close()
    res["not_persisted"] = not_persisted
    return res


async def run_sdk(server: Server, url: str, n: int) -> dict:
    """n SQLAlchemySessions on ONE engine (pool_size=n, max_overflow=0)."""
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url.replace("postgres://", "postgresql+asyncpg://"),
                                 pool_size=n, max_overflow=0)
    sessions = [SQLAlchemySession(f"sdk-{n}-{s}", engine=engine, create_tables=True) for s in range(n)]

    async def send(s: int, b: int) -> None:
        await sessions[s].add_items(batch(sessions[s].session_id, b))

    res = await timed(server, n, send)
    res["pool"] = f"pool_size={engine.pool.size()}, max_overflow=0"
    await engine.dispose()
    res["not_persisted"] = 0
    return res


def summary(res: dict, n: int) -> dict:
    return {"msgs": n * BATCHES * 10 / res["wall"], "p50": pct(res["lat"], 0.5), "p99": pct(res["lat"], 0.99),
            "per_commit": n * BATCHES / res["commits"] if res["commits"] else float("nan"),
            "logged": res.get("logged_per_commit"),
            "not_persisted": res["not_persisted"], "pool": res.get("pool")}


def main() -> int:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        print("benches/pg_append_vs_sqlalchemysession.py is a benchmark, not run under CI", file=sys.stderr)
        return 2
    if not os.environ.get("TURNSAFE_BIN"):
        print("TURNSAFE_BIN is required (run benches/pg-append-vs-sqlalchemysession)", file=sys.stderr)
        return 2
    server = Server()
    homes = tempfile.mkdtemp(prefix="turnsafe-pgbench-home-")
    results: dict = {}
    try:
        version = server.sql("SHOW server_version")
        settings = {k: server.sql(f"SHOW {k}") for k in ("fsync", "synchronous_commit", "wal_sync_method")}
        flush_us = asyncio.run(server.flush_cost_us())
        for i, n in enumerate(SESSIONS):
            results[n] = {name: [] for name in STORES}
            for r in range(ROUNDS):
                # Rotate who goes first, so a busy machine slows all alike.
                k = (i + r) % len(STORES)
                for name in STORES[k:] + STORES[:k]:
                    url = server.create_db(f"{name}{n}r{r}")
                    home = os.path.join(homes, f"{name}{n}r{r}")
                    if name.startswith("cli"):
                        res = asyncio.run(run_cli(server, url + "?sslmode=disable", home, n, DEPTH[name]))
                    elif name == "session":
                        res = asyncio.run(run_session(server, url + "?sslmode=disable", home, n))
                    else:
                        res = asyncio.run(run_sdk(server, url, n))
                    results[n][name].append(summary(res, n))
    finally:
        server.stop()
        shutil.rmtree(homes, ignore_errors=True)

    print(f"PostgreSQL {version}, one throwaway server initdb'd by this run, local loopback; "
          + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(f"server commit cost: {flush_us:,.0f} µs (median of 200 single-row INSERT autocommits)")
    print(f"{BATCHES} batches x 10 messages (~230 B) per session, one batch in flight per session; "
          f"sessions at once: {', '.join(map(str, SESSIONS))}")
    pools = ", ".join(f"{n}: {results[n]['sdk'][0]['pool']}" for n in SESSIONS)
    print(f"SQLAlchemySession: one engine shared by all sessions ({pools})")
    print()
    print(f"each figure the median of {ROUNDS} interleaved round(s); a ratio is each round's own, "
          "with its spread (lowest, highest)")
    print()
    print("| sessions | store | msg/s | p50 ms | p99 ms | p99 / p50 at 1 | batches/commit "
          "| vs SQLAlchemySession | spread |")
    print("|---|---|---|---|---|---|---|---|---|")
    med = statistics.median

    def figure(n: int, name: str, key: str) -> float:
        return med(round_[key] for round_ in results[n][name])

    def ratios(n: int, name: str) -> list:
        return sorted(a["msgs"] / b["msgs"] for a, b in zip(results[n][name], results[n]["sdk"]))

    for n in SESSIONS:
        for name in STORES:
            tail = f"{figure(n, name, 'p99') / figure(1, name, 'p50'):.2f}x" if 1 in results else "-"
            per_commit = f"{figure(n, name, 'per_commit'):.2f}"
            if name.startswith("cli"):
                per_commit += f" (log {figure(n, name, 'logged'):.2f})"
            rs = ratios(n, name)
            print(f"| {n} | {LABELS[name]} | {figure(n, name, 'msgs'):,.0f} | {figure(n, name, 'p50'):.2f} "
                  f"| {figure(n, name, 'p99'):.2f} | {tail} | {per_commit} | {med(rs):.2f}x "
                  f"| [{rs[0]:.2f}, {rs[-1]:.2f}] |")
    print()
    bad = sum(s["not_persisted"] for res in results.values() for rounds in res.values() for s in rounds)
    print(f"batches not persisted: {bad}")
    targets = {1: 1.5 if flush_us < 500 else 0.95, 16: 3.0, 64: 5.0}
    for n in SESSIONS:
        if n in targets:
            for name in ("cli", "session"):
                r = med(ratios(n, name))
                verdict = "met" if r >= targets[n] else "NOT met"
                print(f"{n} session(s): {LABELS[name]} / SQLAlchemySession = {r:.2f}x "
                      f"(target >= {targets[n]:g}x: {verdict})")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
