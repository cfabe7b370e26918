"""TurnsafeSaver and AsyncTurnsafeSaver on PostgreSQL (``db=URL``) against
LangGraph's PostgresSaver and AsyncPostgresSaver (langgraph-checkpoint-postgres
3.2), in process, on one PostgreSQL server.

The graph is the one benches/langgraph_vs_sqlitesaver.py runs: a real
StateGraph with one node that appends a ~200 B message to ``messages`` (an
``operator.add`` channel) and increments ``n``, looping back to itself through
a conditional edge until ``n`` reaches STEPS, so each step is one checkpoint
and its writes. One graph thread, then 16 at once on one saver (16 OS threads
for the sync savers, 16 asyncio tasks for the async ones).

The peers are set up as their README says: ``PostgresSaver(pool)`` over a
``psycopg_pool.ConnectionPool`` (``AsyncPostgresSaver`` over an
``AsyncConnectionPool``), ``max_size=16``, connections made with
``autocommit=True, prepare_threshold=0, row_factory=dict_row``, and
``.setup()`` once. turnsafe's savers are ``TurnsafeSaver(home, db=URL)`` and
``AsyncTurnsafeSaver(home, db=URL)`` with their defaults. Every case (saver,
thread count, round) gets a database of its own, created for it and dropped
after it, so no saver sees another's tables. LangGraph's ``InMemorySaver``
runs the same graph in the same rounds: its rate is LangGraph's own CPU
ceiling on this machine, which bounds every saver's.

Per case: steps/s (all steps over the wall time); p99 step latency, from one
of a graph thread's checkpoints being stored (its ``put``/``aput`` returned)
to its next, all threads pooled (with durability "async" the node runs on
while checkpoints are written behind it, so the time between node calls would
not show the saver); and, on the server this script starts, the COMMIT
records the server wrote to its WAL during the timed run, per step (each a
durable commit, counted with ``pg_waldump``; read-only transactions write
none). Beside each row, the server's flush cost: the median time of 200
single-row INSERTs, each its own autocommit transaction with
``synchronous_commit=on``, measured just before that row's cases. Printed:
the median of ROUNDS rounds, the ratio turnsafe/peer and the targets
(>= 1.0x at one thread, >= 2x at 16). The event loop's default executor is
left as asyncio makes it, as an application would have it, unless
ASYNC_EXECUTOR says otherwise.

    benches/langgraph-vs-postgressaver   # makes the venv, builds the package, runs this

The server: PostgreSQL 15 from ``pg_config --bindir``, initdb'd into a
temporary folder (as the ``postgres`` account when run as root), fsync on,
synchronous_commit on, on a free loopback port, removed at the end; or, with
BENCH_DB set, the server at that URL (a role that may CREATE DATABASE; WAL
commits are then not counted). Environment: STEPS (steps per graph thread,
default 200), ROUNDS (default 3), DURABILITY (LangGraph's durability mode,
default "async", LangGraph's own), ASYNC_EXECUTOR (threads in the event
loop's default executor in the async cases; default asyncio's own), BENCH_DB.
Not for CI: it refuses to run under CI=true.
"""

from __future__ import annotations

import asyncio
import operator
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, TypedDict
from urllib.parse import urlsplit, urlunsplit

STEPS = int(os.environ.get("STEPS", "200"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURABILITY = os.environ.get("DURABILITY", "async")
# Threads in the event loop's default executor for the async cases (where
# AsyncTurnsafeSaver runs its calls); empty: asyncio's own.
ASYNC_EXECUTOR = int(os.environ.get("ASYNC_EXECUTOR") or 0)
THREADS = 16
TARGET = {1: 1.0, THREADS: 2.0}
PAYLOAD = "x" * 180
FSYNC_INSERTS = 200
CONN_KWARGS_TEXT = 'autocommit=True, prepare_threshold=0, row_factory=dict_row'

# What each saver ran with, as read in the run: name -> text.
RAN_WITH: dict = {}


# -- the server ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway PostgreSQL server on a loopback port, fsync on; as the
    `postgres` account when run as root (initdb refuses root). With
    BENCH_DB, the server at that URL instead (nothing started)."""

    def __init__(self) -> None:
        self.own = not os.environ.get("BENCH_DB")
        self.dir = None
        if not self.own:
            self.admin = os.environ["BENCH_DB"]
            return
        if shutil.which("pg_config") is None:
            raise SystemExit("error: pg_config not found; install postgresql-15 (or set BENCH_DB)")
        self.bindir = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True,
                                     text=True).stdout.strip()
        self.dir = tempfile.mkdtemp(prefix="turnsafe-lgpgbench-")
        os.chmod(self.dir, 0o755)
        self.prefix: list = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.prefix = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            # Durability as shipped; the last case's WAL is kept for
            # pg_waldump to count its commit records.
            f.write("listen_addresses = '127.0.0.1'\nmax_connections = 200\n"
                    "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\nwal_keep_size = '2GB'\n")
        self.run("pg_ctl", "-D", self.data, "-o", f"-p {self.port} -k {self.dir}",
                 "-l", os.path.join(self.dir, "log"), "-w", "start")
        self.admin = f"postgres://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable"

    def run(self, binary: str, *args: str, check: bool = True) -> str:
        return subprocess.run(self.prefix + [os.path.join(self.bindir, binary), *args], check=check,
                              capture_output=True, text=True, cwd=self.dir).stdout

    def sql(self, query: str, url: str = "") -> list:
        import psycopg

        with psycopg.connect(url or self.admin, autocommit=True) as conn:
            cur = conn.execute(query)
            return cur.fetchall() if cur.description else []

    def url(self, db: str) -> str:
        """The admin URL with its database swapped for `db`."""
        parts = urlsplit(self.admin)
        return urlunsplit((parts.scheme, parts.netloc, "/" + db, parts.query, parts.fragment))

    def create_db(self, name: str) -> str:
        self.sql(f'DROP DATABASE IF EXISTS "{name}"')
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_db(self, name: str) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def wal_lsn(self) -> str:
        return self.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]

    def commits_between(self, start: str, end: str):
        """COMMIT records in the WAL from `start` to `end` (top-level
        transactions that wrote), or None on a server not started here."""
        if not self.own:
            return None
        out = self.run("pg_waldump", "-p", os.path.join(self.data, "pg_wal"), "-s", start, "-e", end,
                       "-r", "Transaction", check=False)
        return sum(1 for line in out.splitlines() if "desc: COMMIT " in line)

    def cpu_seconds(self):
        """User and system CPU seconds of the server's processes alive now
        (the postmaster and its children: backends, WAL writer,
        checkpointer), or None on a server not started here."""
        if not self.own:
            return None
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            master = int(f.readline())
        ticks = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # After the name: state, ppid, ...; utime and stime are the
            # 14th and 15th fields of the line, the 12th and 13th here.
            if int(pid) == master or int(fields[1]) == master:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def flush_cost_us(self) -> float:
        """Median µs of FSYNC_INSERTS single-row INSERTs, each its own
        autocommit transaction with synchronous_commit=on."""
        import psycopg

        url = self.create_db("flushcost")
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SET synchronous_commit = on")
                conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
                times = []
                for i in range(FSYNC_INSERTS):
                    t = time.perf_counter()
                    conn.execute("INSERT INTO t VALUES (%s, %s)", (i, PAYLOAD))
                    times.append(time.perf_counter() - t)
            return statistics.median(times) * 1e6
        finally:
            self.drop_db("flushcost")

    def stop(self) -> None:
        if not self.own:
            return
        subprocess.run(self.prefix + [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "fast",
                                      "stop"], check=False, capture_output=True, cwd=self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the graph -------------------------------------------------------------


class State(TypedDict):
    messages: Annotated[list, operator.add]
    n: int


class Clock:
    """When each graph thread's checkpoints were stored (`put` or `aput`
    returned), for the step latencies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict = {}

    def tick(self, thread_id: str) -> None:
        t = time.perf_counter()
        with self.lock:
            self.calls.setdefault(thread_id, []).append(t)

    def gaps(self) -> list:
        return [b - a for ts in self.calls.values() for a, b in zip(ts, ts[1:])]


def stamped(saver, clock: Clock, pair: str):
    """`saver` with its `put` (sync pair) or `aput` (async pair) noting when
    each returned, per graph thread: instance attributes, the class is
    untouched. Only the one the graph calls is wrapped, so
    AsyncTurnsafeSaver's `aput`, which runs `put` in the executor, is noted
    once."""
    if pair == "sync":
        put = saver.put

        def timed_put(config, *args, **kwargs):
            out = put(config, *args, **kwargs)
            clock.tick(config["configurable"]["thread_id"])
            return out

        saver.put = timed_put
    else:
        aput = saver.aput

        async def timed_aput(config, *args, **kwargs):
            out = await aput(config, *args, **kwargs)
            clock.tick(config["configurable"]["thread_id"])
            return out

        saver.aput = timed_aput
    return saver


def build(checkpointer, clock: Clock, pair: str):
    from langgraph.graph import END, START, StateGraph

    def step(state: State) -> dict:
        n = state["n"] + 1
        return {"messages": [{"role": "assistant", "content": f"step {n:05d} " + PAYLOAD}], "n": n}

    def again(state: State) -> str:
        return END if state["n"] >= STEPS else "step"

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", again, ["step", END])
    return g.compile(checkpointer=stamped(checkpointer, clock, pair))


def config(k: int) -> dict:
    return {"configurable": {"thread_id": f"bench-{k}"}, "recursion_limit": STEPS + 10}


def check(out: dict) -> None:
    if out["n"] != STEPS or len(out["messages"]) != STEPS:
        raise RuntimeError(f"graph ended at n={out['n']} with {len(out['messages'])} messages, not {STEPS}")


def drive_sync(graph, n: int) -> float:
    def one(k: int) -> None:
        check(graph.invoke({"messages": [], "n": 0}, config(k), durability=DURABILITY))

    t = time.perf_counter()
    if n == 1:
        one(0)
    else:
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(one, range(n)))
    return time.perf_counter() - t


async def drive_async(graph, n: int) -> float:
    async def one(k: int) -> None:
        check(await graph.ainvoke({"messages": [], "n": 0}, config(k), durability=DURABILITY))

    t = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n)))
    return time.perf_counter() - t


# -- the savers ------------------------------------------------------------


def sync_commit_of(conn) -> str:
    row = conn.execute("SHOW synchronous_commit").fetchone()
    return row["synchronous_commit"] if isinstance(row, dict) else row[0]


def snapshot(server: Server) -> tuple:
    """Where the server's WAL is, and the CPU seconds this process and the
    server have used so far."""
    return server.wal_lsn(), time.process_time(), server.cpu_seconds()


def since(server: Server, before: tuple, wall: float) -> dict:
    lsn, client, srv = before
    now = snapshot(server)
    return {"wall": wall, "commits": server.commits_between(lsn, now[0]), "client_cpu": now[1] - client,
            "server_cpu": None if srv is None else now[2] - srv}


def timed(server: Server, run) -> dict:
    """Run `run()` (which returns the wall time), counting WAL commits and
    CPU time."""
    before = snapshot(server)
    return since(server, before, run())


def run_sync(kind: str, server: Server, url: str, home: str, n: int, clock: Clock) -> dict:
    if kind == "turnsafe":
        from turnsafe_store.langgraph import TurnsafeSaver

        with TurnsafeSaver(home, db=url) as saver:
            res = timed(server, lambda: drive_sync(build(saver, clock, "sync"), n))
        RAN_WITH.setdefault("TurnsafeSaver", 'TurnsafeSaver(home, db=URL), synchronous="full" (its default)')
        return res
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        return timed(server, lambda: drive_sync(build(InMemorySaver(), clock, "sync"), n))
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with ConnectionPool(url, max_size=THREADS, kwargs=kwargs, open=False) as pool:
        pool.wait()
        saver = PostgresSaver(pool)
        saver.setup()
        with pool.connection() as conn:
            sc = sync_commit_of(conn)
        RAN_WITH.setdefault("PostgresSaver", f"PostgresSaver(ConnectionPool(max_size={THREADS}, "
                            f"kwargs={{{CONN_KWARGS_TEXT}}})), .setup(); synchronous_commit={sc}")
        return timed(server, lambda: drive_sync(build(saver, clock, "sync"), n))


async def run_async(kind: str, server: Server, url: str, home: str, n: int, clock: Clock) -> dict:
    if ASYNC_EXECUTOR:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(ASYNC_EXECUTOR))

    async def atimed(coro_fn) -> dict:
        # Nothing else runs on the loop before and after the timed run.
        before = snapshot(server)
        return since(server, before, await coro_fn())

    if kind == "turnsafe":
        from turnsafe_store.langgraph import AsyncTurnsafeSaver

        async with AsyncTurnsafeSaver(home, db=url) as saver:
            res = await atimed(lambda: drive_async(build(saver, clock, "async"), n))
        RAN_WITH.setdefault("AsyncTurnsafeSaver",
                            'AsyncTurnsafeSaver(home, db=URL), synchronous="full" (its default)')
        return res
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        return await atimed(lambda: drive_async(build(InMemorySaver(), clock, "async"), n))
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(url, max_size=THREADS, kwargs=kwargs, open=False) as pool:
        await pool.wait()
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        async with pool.connection() as conn:
            row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
        RAN_WITH.setdefault("AsyncPostgresSaver", f"AsyncPostgresSaver(AsyncConnectionPool(max_size={THREADS}, "
                            f"kwargs={{{CONN_KWARGS_TEXT}}})), .setup(); "
                            f"synchronous_commit={row['synchronous_commit']}")
        return await atimed(lambda: drive_async(build(saver, clock, "async"), n))


def measure(server: Server, pair: str, kind: str, n: int, r: int) -> dict:
    """One case on a database of its own: steps/s, p99 step latency (ms),
    WAL commits per step, this process's and the server's CPU ms per step;
    or the error it raised."""
    name = f"lg_{pair}_{kind}_{n}_r{r}"
    url = server.create_db(name) if kind != "memory" else ""
    clock = Clock()
    try:
        with tempfile.TemporaryDirectory(prefix="turnsafe-lgpg-home-") as home:
            if pair == "sync":
                res = run_sync(kind, server, url, home, n, clock)
            else:
                res = asyncio.run(run_async(kind, server, url, home, n, clock))
    except Exception as e:  # a saver that fails is reported, not hidden
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:160]}
    finally:
        if url:
            server.drop_db(name)
    gaps = sorted(clock.gaps())
    steps = n * STEPS
    commits = res["commits"] if kind != "memory" else None
    return {"rate": steps / res["wall"],
            "p99": gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] * 1000 if gaps else float("nan"),
            "per_step": commits / steps if commits is not None else None,
            "client_cpu": res["client_cpu"] / steps * 1000,
            "server_cpu": None if res["server_cpu"] is None or kind == "memory"
            else res["server_cpu"] / steps * 1000}


# -- the run ---------------------------------------------------------------


def med(cases: list, key: str):
    vals = [c[key] for c in cases if "error" not in c and c.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def main() -> int:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        print("benches/langgraph_vs_postgressaver.py is a benchmark, not run under CI", file=sys.stderr)
        return 2
    server = Server()
    results: dict = {}
    flush: dict = {}
    t0 = time.perf_counter()
    try:
        version = server.sql("SHOW server_version")[0][0]
        settings = {k: server.sql(f"SHOW {k}")[0][0] for k in ("fsync", "synchronous_commit", "wal_sync_method")}
        # LangGraph's imports and first compile, untimed.
        run_sync("memory", server, "", "", 1, Clock())
        # Rounds alternate which saver goes first, so a machine that gets
        # busier or quieter during the run slows both alike; the median
        # round counts.
        for r in range(ROUNDS):
            for pair in ("sync", "async"):
                for n in (1, THREADS):
                    flush.setdefault((pair, n), []).append(server.flush_cost_us())
                    kinds = ("turnsafe", "peer", "memory") if r % 2 == 0 else ("peer", "turnsafe", "memory")
                    for kind in kinds:
                        results.setdefault((pair, n, kind), []).append(measure(server, pair, kind, n, r))
    finally:
        server.stop()

    where = ("one throwaway server initdb'd by this run, loopback" if server.own
             else "the server at BENCH_DB")
    print(f"PostgreSQL {version}, {where}; " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(f"StateGraph of {STEPS} steps per graph thread (one node appending a ~200 B message and"
          f" incrementing n, a conditional edge back to itself), durability={DURABILITY!r};"
          f" median of {ROUNDS} round(s), {time.perf_counter() - t0:.0f} s in all")
    for name in ("TurnsafeSaver", "PostgresSaver", "AsyncTurnsafeSaver", "AsyncPostgresSaver"):
        print(f"  {name:<19} {RAN_WITH.get(name, 'never ran')}")
    executor = (f"{ASYNC_EXECUTOR} threads (ASYNC_EXECUTOR)" if ASYNC_EXECUTOR
                else f"asyncio's own, {min(32, (os.cpu_count() or 1) + 4)} threads")
    print(f"  event loop's default executor in the async cases: {executor}")
    print(f"  flush µs: median of {FSYNC_INSERTS} single-row INSERT autocommits (synchronous_commit=on),"
          " measured before each row's cases, median over rounds")
    print("  commits/step: COMMIT records in the server's WAL during the timed run, over the steps")
    print("  CPU ms/step: this process's (client) and the server's processes' CPU time during the timed"
          " run, over the steps")
    print()
    print("| savers | threads | turnsafe steps/s | peer steps/s | ratio | target | p99 step ms turnsafe / peer"
          " | commits/step turnsafe / peer | client CPU ms/step turnsafe / peer"
          " | server CPU ms/step turnsafe / peer | InMemorySaver steps/s | flush µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    missed = []
    errors = []
    for pair, names in (("sync", "TurnsafeSaver / PostgresSaver"),
                        ("async", "AsyncTurnsafeSaver / AsyncPostgresSaver")):
        for n in (1, THREADS):
            cases = {k: results[(pair, n, k)] for k in ("turnsafe", "peer", "memory")}
            for k, cs in cases.items():
                errors += [f"{pair} {n} thread(s) {k}: {c['error']}" for c in cs if "error" in c]
            ts, peer, mem = (med(cases[k], "rate") for k in ("turnsafe", "peer", "memory"))
            ratio = ts / peer if ts and peer else None
            if ratio is None or ratio < TARGET[n]:
                missed.append(f"{names}, {n} thread(s)")
            verdict = "-" if ratio is None else ("met" if ratio >= TARGET[n] else "**missed**")

            def both(key: str, spec: str) -> str:
                return f"{fmt(med(cases['turnsafe'], key), spec)} / {fmt(med(cases['peer'], key), spec)}"

            print(f"| {names} | {n} | {fmt(ts, ',.0f')} | {fmt(peer, ',.0f')} | {fmt(ratio, '.2f')}× "
                  f"| ≥ {TARGET[n]:.1f}× {verdict} | {both('p99', '.1f')} | {both('per_step', '.2f')} "
                  f"| {both('client_cpu', '.2f')} | {both('server_cpu', '.2f')} "
                  f"| {fmt(mem, ',.0f')} | {statistics.median(flush[(pair, n)]):,.0f} |")
    print()
    for e in errors:
        print(f"error: {e}")
    print("targets missed: " + ("; ".join(missed) if missed else "none"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
