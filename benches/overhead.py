"""What turnsafe adds to every batch, in every runtime, beside the plain
store each one replaces, on a disk folder and on tmpfs, one session and 16.

Each row is a store and its peer, measured in the same run on the same
batches (10 messages of about 230 B, WAL, `synchronous=FULL`), K sessions
at once in a closed loop (each sends its next batch once the last was
stored), after one untimed batch each (the JavaScript sides: 100 untimed
batches in all, for V8 to compile the hot code; js/bench/overhead.mjs).

- `turnsafe append` (a child process, JSON Lines; with K > 1 one process
  for all sessions, as an application would run it) beside the bare
  rusqlite floor (`host/examples/bare_append.rs`: the same statements,
  same protocol, nothing else), and beside `SQLiteSession` at K = 16;
- `Store.append` (Python, in process) beside the same statements through
  Python's `sqlite3`;
- `TurnsafeSession.add_items` beside the Agents SDK's `SQLiteSession`;
- `TurnsafeSaver` beside LangGraph's `SqliteSaver` and `InMemorySaver`,
  one graph step being one `put` and its `put_writes`;
- the JavaScript `TurnsafeSession` beside the plain better-sqlite3 Session
  the Agents SDK's docs show, and beside the statements it runs for a
  batch through better-sqlite3 in the calling thread on its own schema
  (the floor); its synchronous path (`thread: false`, `addItemsSync`)
  beside both; and the asynchronous session beside itself with every flush
  step through `flush-step-json` (`js/bench/overhead.mjs`). The event
  loop's worst stall in the JavaScript rounds is printed under the table.

Every ratio is the median of ROUNDS interleaved rounds (the two sides take
turns, who goes first alternating), printed with its spread (lowest and
highest round); a busy machine moves single runs by 30%. The fsync cost
of each folder is measured first (4 KiB `pwrite` + `fdatasync`).

Run it with `benches/overhead`, which builds and installs everything.
Environment: TURNSAFE_BIN, FLOOR_BIN (required), BATCHES (per session at
K = 1, default 300), PER_CLIENT (per session at K = 16, default 40), STEPS
(graph steps per thread, default 100), ROUNDS (default 3), KS (default
"1,16"), FOLDERS (default "disk,tmpfs"), DISK_DIR (default the system's
temporary folder, which must not be tmpfs), ONLY (a comma-separated list
of row names, default all).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCHES = int(os.environ.get("BATCHES", "300"))
PER_CLIENT = int(os.environ.get("PER_CLIENT", "40"))
STEPS = int(os.environ.get("STEPS", "100"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
KS = [int(k) for k in os.environ.get("KS", "1,16").split(",")]
FOLDERS = os.environ.get("FOLDERS", "disk,tmpfs").split(",")
ONLY = set(filter(None, os.environ.get("ONLY", "").split(",")))


def batch(c: int, b: int) -> list:
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"client {c} batch {b} message {i} " + "x" * 200} for i in range(10)]


def per_session(k: int) -> int:
    return BATCHES if k == 1 else PER_CLIENT


# Each side runs K sessions of n batches in a fresh folder `d` and returns
# the wall time of the timed part, in seconds.


def cli_append(d: str, k: int, n: int) -> float:
    turnsafe = os.environ["TURNSAFE_BIN"]
    home = os.path.join(d, "home")
    if k == 1:
        return closed_loop([turnsafe, "append", "--home", home, "--session", "c0"], n)
    return asyncio.run(grouped_append(turnsafe, home, k, n))


def floor_append(d: str, k: int, n: int) -> float:
    assert k == 1
    return closed_loop([os.environ["FLOOR_BIN"], os.path.join(d, "home"), "c0"], n)


def closed_loop(argv: list, n: int) -> float:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(b: int) -> None:
        proc.stdin.write((json.dumps(batch(0, b)) + "\n").encode())
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        if not out.get("persisted"):
            raise SystemExit(f"{argv[0]}: batch {b} not persisted: {out}")

    send(-1)
    t = time.perf_counter()
    for b in range(n):
        send(b)
    wall = time.perf_counter() - t
    proc.stdin.close()
    proc.wait()
    return wall


async def grouped_append(turnsafe: str, home: str, k: int, n: int) -> float:
    proc = await asyncio.create_subprocess_exec(
        turnsafe, "append", "--home", home, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, limit=1 << 24)
    waiting: dict = {}

    async def reader():
        while line := await proc.stdout.readline():
            out = json.loads(line)
            if not out.get("persisted"):
                raise SystemExit(f"turnsafe append: not persisted: {out}")
            waiting.pop(out["session"]).set_result(None)

    read = asyncio.create_task(reader())
    loop = asyncio.get_running_loop()

    async def client(c: int, batches: range) -> None:
        for b in batches:
            fut = loop.create_future()
            waiting[f"c{c}"] = fut
            proc.stdin.write((json.dumps({"session": f"c{c}", "messages": batch(c, b)}) + "\n").encode())
            await proc.stdin.drain()
            await fut

    await asyncio.gather(*(client(c, range(-1, 0)) for c in range(k)))
    t = time.perf_counter()
    await asyncio.gather(*(client(c, range(n)) for c in range(k)))
    wall = time.perf_counter() - t
    proc.stdin.close()
    await read
    await proc.wait()
    return wall


def store_append(d: str, k: int, n: int) -> float:
    from turnsafe_store import Store

    store = Store(os.path.join(d, "home"))
    try:
        return threads(k, n, lambda c, b: check(store.append(f"c{c}", batch(c, b))))
    finally:
        store.close()


def check(outcome) -> None:
    if not outcome.persisted:
        raise SystemExit(f"Store.append: not persisted: {outcome}")


def threads(k: int, n: int, one) -> float:
    """k sessions, each on its own thread when k > 1, one untimed call each first."""
    def run(c: int, batches: range) -> None:
        for b in batches:
            one(c, b)

    if k == 1:
        run(0, range(-1, 0))
        t = time.perf_counter()
        run(0, range(n))
        return time.perf_counter() - t
    with ThreadPoolExecutor(max_workers=k) as pool:
        list(pool.map(lambda c: run(c, range(-1, 0)), range(k)))
        t = time.perf_counter()
        list(pool.map(lambda c: run(c, range(n)), range(k)))
        return time.perf_counter() - t


def sqlite3_same_statements(d: str, k: int, n: int) -> float:
    """The floor's statements through Python's sqlite3, on turnsafe's schema."""
    from turnsafe_store import Store

    home = os.path.join(d, "home")
    Store(home).close()  # turnsafe's own schema, nothing written
    conn = sqlite3.connect(os.path.join(home, "state.db"), isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    lock = threading.Lock()
    seqs: dict = {}

    def one(c: int, b: int) -> None:
        session = f"c{c}"
        with lock:
            now = int(time.time() * 1000)
            conn.execute("BEGIN IMMEDIATE")
            if session not in seqs:
                conn.execute("INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?, ?)", (session, now))
                seqs[session] = 0
            for m in batch(c, b):
                seqs[session] += 1
                conn.execute(
                    "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (session, os.urandom(16).hex(), seqs[session], m["role"], m["content"],
                     json.dumps(m, separators=(",", ":")), now))
            conn.execute("COMMIT")

    try:
        return threads(k, n, one)
    finally:
        conn.close()


def turnsafe_session(d: str, k: int, n: int) -> float:
    from turnsafe_store import Store
    from turnsafe_store.agents import TurnsafeSession

    store = Store(os.path.join(d, "home"))
    sessions = [TurnsafeSession(f"c{c}", d, store=store) for c in range(k)]
    try:
        return asyncio.run(gather(sessions, n))
    finally:
        store.close()


def sqlite_session(d: str, k: int, n: int) -> float:
    from agents.memory import SQLiteSession

    sessions = [SQLiteSession(f"c{c}", os.path.join(d, "sdk.db")) for c in range(k)]
    for s in sessions:
        s._get_connection().execute("PRAGMA synchronous=FULL")
    try:
        return asyncio.run(gather(sessions, n))
    finally:
        for s in sessions:
            s.close()


async def gather(sessions: list, n: int) -> float:
    async def one(c: int, s, batches: range) -> None:
        for b in batches:
            await s.add_items(batch(c, b))

    await asyncio.gather(*(one(c, s, range(-1, 0)) for c, s in enumerate(sessions)))
    t = time.perf_counter()
    await asyncio.gather(*(one(c, s, range(n)) for c, s in enumerate(sessions)))
    return time.perf_counter() - t


def graph_steps(saver, k: int) -> float:
    """k graph threads of STEPS steps each (one checkpoint and its writes a step)."""
    sys.path.insert(0, HERE)
    os.environ["STEPS"] = str(STEPS)
    import langgraph_vs_sqlitesaver as lg

    graph = lg.build(saver)

    def one(c: int) -> None:
        lg.check(graph.invoke({"messages": [], "n": 0}, lg.config(c), durability=lg.DURABILITY))

    one(10_000)  # untimed: the saver is open and warm
    t = time.perf_counter()
    if k == 1:
        one(0)
    else:
        with ThreadPoolExecutor(max_workers=k) as pool:
            list(pool.map(one, range(k)))
    return time.perf_counter() - t


def turnsafe_saver(d: str, k: int, _n: int) -> float:
    from turnsafe_store.langgraph import TurnsafeSaver

    with TurnsafeSaver(os.path.join(d, "home")) as saver:
        return graph_steps(saver, k)


def sqlite_saver(d: str, k: int, _n: int) -> float:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(os.path.join(d, "checkpoints.db"), check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        conn.execute("PRAGMA synchronous=FULL")
        return graph_steps(saver, k)
    finally:
        conn.close()


def in_memory_saver(_d: str, k: int, _n: int) -> float:
    from langgraph.checkpoint.memory import InMemorySaver

    return graph_steps(InMemorySaver(), k)


# The event loop's worst stall (ms) in each JavaScript side's rounds, by (folder, K, side).
LOOP_MAX: dict = {}


def js(side: str):
    def run(d: str, k: int, n: int) -> float:
        out = subprocess.run(["node", os.path.join(ROOT, "js", "bench", "overhead.mjs"), side, d, str(k), str(n)],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"js/bench/overhead.mjs {side}: {out.stderr.strip()}")
        line = json.loads(out.stdout.strip().splitlines()[-1])
        key = ("tmpfs" if fs_type(d) == "tmpfs" else "disk", k, side)
        LOOP_MAX[key] = max(LOOP_MAX.get(key, 0.0), line["loop_max_ms"])
        return line["wall"]
    return run


# (name, unit, store, its side, peer, its side, K values, targets by (folder, K)).
ROWS = [
    ("append", "batch", "turnsafe append", cli_append, "bare rusqlite floor", floor_append, [1],
     {("tmpfs", 1): 0.95}),
    ("append-16", "batch", "turnsafe append, one process", cli_append, "SQLiteSession", sqlite_session, [16],
     {("disk", 16): 5.0}),
    ("store", "batch", "Store.append (Python)", store_append, "same statements, Python sqlite3",
     sqlite3_same_statements, [1], {}),
    ("session", "batch", "TurnsafeSession (Python)", turnsafe_session, "SQLiteSession", sqlite_session, [1, 16],
     {("tmpfs", 1): 2.0, ("disk", 1): 1.3, ("disk", 16): 5.0}),
    ("saver", "step", "TurnsafeSaver", turnsafe_saver, "SqliteSaver", sqlite_saver, [1, 16],
     {("tmpfs", 1): 1.5, ("disk", 1): 1.0}),
    ("saver-memory", "step", "TurnsafeSaver", turnsafe_saver, "InMemorySaver", in_memory_saver, [1, 16],
     {("disk", 16): 0.9}),
    ("js", "batch", "TurnsafeSession (JavaScript)", js("turnsafe"), "plain better-sqlite3", js("plain"), [1, 16],
     {("tmpfs", 1): 0.35, ("disk", 1): 1.0, ("disk", 16): 3.0}),
    ("js-floor", "batch", "TurnsafeSession (JavaScript)", js("turnsafe"), "same statements, better-sqlite3",
     js("floor"), [1], {("tmpfs", 1): 0.8}),
    ("js-sync", "batch", "TurnsafeSession addItemsSync (JavaScript)", js("turnsafe-sync"), "plain better-sqlite3",
     js("plain"), [1], {("tmpfs", 1): 0.35, ("disk", 1): 1.0}),
    ("js-sync-floor", "batch", "TurnsafeSession addItemsSync (JavaScript)", js("turnsafe-sync"),
     "same statements, better-sqlite3", js("floor"), [1], {("tmpfs", 1): 0.8}),
    ("js-typed", "batch", "TurnsafeSession (JavaScript)", js("turnsafe"), "the same over flush-step-json only",
     js("turnsafe-json"), [1, 16], {}),
]


def fs_type(path: str) -> str:
    """The filesystem type of the mount that holds `path`, from /proc/mounts."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount = parts[1].replace("\\040", " ")
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                best, kind = mount, parts[2]
    return kind


def fsync_us(folder: str) -> float:
    fd, name = tempfile.mkstemp(dir=folder)
    try:
        block = os.urandom(4096)
        times = []
        for _ in range(200):
            t = time.perf_counter()
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e6
    finally:
        os.close(fd)
        os.unlink(name)


def folders() -> dict:
    out = {}
    for name in FOLDERS:
        if name == "disk":
            path = os.environ.get("DISK_DIR") or tempfile.gettempdir()
            if fs_type(path) == "tmpfs":
                raise SystemExit(f"DISK_DIR {path} is tmpfs: point DISK_DIR at a folder on a disk")
        elif name == "tmpfs":
            path = "/dev/shm"
            if fs_type(path) != "tmpfs":
                raise SystemExit("/dev/shm is not tmpfs here: run with FOLDERS=disk")
        else:
            raise SystemExit(f"FOLDERS: unknown folder {name!r} (disk, tmpfs)")
        out[name] = path
    return out


def main() -> int:
    for var in ("TURNSAFE_BIN", "FLOOR_BIN"):
        if not os.environ.get(var):
            print(f"{var} is required (run benches/overhead)", file=sys.stderr)
            return 2
    where = folders()
    print(f"10 messages of ~230 B a batch, WAL, synchronous=FULL; {BATCHES} batches at K=1, {PER_CLIENT} per session"
          f" at K=16, {STEPS} graph steps per thread; each ratio the median of {ROUNDS} interleaved rounds"
          f" [lowest, highest]")
    for name, path in where.items():
        print(f"  {name}: {path} ({fs_type(path)}), fsync {fsync_us(path):,.0f} µs (4 KiB pwrite + fdatasync, median)")
    print()
    header = (f"| folder | K | store | µs/unit | peer | µs/unit | store/peer | spread | target |\n"
              f"|---|---|---|---|---|---|---|---|---|")
    print(header)
    missed = []
    for folder, path in where.items():
        for (name, unit, store, store_run, peer, peer_run, ks, targets) in ROWS:
            if ONLY and name not in ONLY:
                continue
            for k in ks:
                if k not in KS:
                    continue
                n = per_session(k)
                units = k * (STEPS if unit == "step" else n)
                ratios, walls = [], {"store": [], "peer": []}
                for r in range(ROUNDS):
                    order = [("store", store_run), ("peer", peer_run)]
                    for side, run in (order if r % 2 == 0 else order[::-1]):
                        d = tempfile.mkdtemp(dir=path, prefix="overhead-")
                        try:
                            walls[side].append(run(d, k, n))
                        finally:
                            shutil.rmtree(d, ignore_errors=True)
                    ratios.append(walls["peer"][-1] / walls["store"][-1])
                ratio = statistics.median(ratios)
                target = targets.get((folder, k))
                mark = "" if target is None else (f"≥ {target:.2f} " + ("met" if ratio >= target else "**missed**"))
                if target is not None and ratio < target:
                    missed.append(f"{folder} K={k} {store} / {peer}: {ratio:.2f} (target {target:.2f})")
                us = lambda side: statistics.median(walls[side]) / units * 1e6  # noqa: E731
                print(f"| {folder} | {k} | {store} | {us('store'):,.0f} µs/{unit} | {peer} | {us('peer'):,.0f} µs/{unit}"
                      f" | {ratio:.2f}× | [{min(ratios):.2f}, {max(ratios):.2f}] | {mark} |", flush=True)
    print()
    if LOOP_MAX:
        print("event loop's worst stall while the JavaScript sides ran (ms, the largest gap of a 1 ms timer in any round): "
              + ", ".join(f"{f} K={k} {side} {ms:.1f}" for (f, k, side), ms in sorted(LOOP_MAX.items())))
    print("targets missed: " + ("none" if not missed else "; ".join(missed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
