"""Many conversations at once on one home, closed loop: K clients, each
sending its next batch only after reading the previous outcome, K = 1, 4,
16 and 64 (env KS). Three stores, measured in the same run on the same
batches (10 messages of about 230 B, WAL, `synchronous=FULL`):

- `turnsafe append` without `--session`: one process; the K clients write
  session-tagged lines to its stdin and read their outcomes from its
  stdout, so batches waiting together are committed together;
- K `turnsafe append --session` processes, one per client;
- the OpenAI Agents SDK's `SQLiteSession`, K sessions on one database file,
  driven through `asyncio.gather`.

Per store and K: msg/s (all messages over the wall time of the run), p50
and p99 batch latency (line written, or `add_items` called, to outcome
read), and batches per commit (for the grouped turnsafe, counted from its
own `group committed` log lines; every other store commits each batch
alone). The ratios are against `SQLiteSession` at the same K; the last
lines check the targets.

Run it with `benches/many-sessions` (builds the binary and the venv).
Environment: TURNSAFE_BIN (required), KS (default "1,4,16,64"),
PER_CLIENT (batches per client, default 60), ROUNDS (default 3). Every
client first sends one untimed batch, so each store is open and each
session exists before the clock starts (SQLiteSession's constructor does
both).
"""

import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time

KS = [int(k) for k in os.environ.get("KS", "1,4,16,64").split(",")]
PER_CLIENT = int(os.environ.get("PER_CLIENT", "60"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def batch(client: int, b: int) -> list:
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"client {client:>3} batch {b:>4} message {i} " + "x" * 200} for i in range(10)]


def pct(xs: list, p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def grouped(turnsafe: str, home: str, k: int) -> dict:
    """One `turnsafe append` process for all K clients."""
    proc = await asyncio.create_subprocess_exec(
        turnsafe, "append", "--home", home,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TURNSAFE_LOG": "turnsafe::commit=debug"}, limit=1 << 24)
    waiting: dict = {}
    lost = 0

    async def reader():
        nonlocal lost
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            out = json.loads(line)
            if not out.get("persisted"):
                lost += 1
            fut = waiting.pop(out.get("session"), None)
            if fut is not None:
                fut.set_result(out)

    stderr_task = asyncio.create_task(proc.stderr.read())
    read_task = asyncio.create_task(reader())
    loop = asyncio.get_running_loop()

    async def client(c: int, batches: range) -> list:
        lat = []
        session = f"c{c}"
        for b in batches:
            fut = loop.create_future()
            waiting[session] = fut
            t = time.perf_counter()
            proc.stdin.write((json.dumps({"session": session, "messages": batch(c, b)}) + "\n").encode())
            await proc.stdin.drain()
            await fut
            lat.append(time.perf_counter() - t)
        return lat

    # One batch per client first, untimed: the store is opened and every
    # session exists, as for SQLiteSession, whose constructor does both.
    await asyncio.gather(*(client(c, range(-1, 0)) for c in range(k)))
    t0 = time.perf_counter()
    lats = await asyncio.gather(*(client(c, range(PER_CLIENT)) for c in range(k)))
    wall = time.perf_counter() - t0
    proc.stdin.close()
    await read_task
    err = (await stderr_task).decode(errors="replace")
    await proc.wait()
    commits = [int(m) for m in re.findall(r"batches=(\d+)", err)]
    return {"lat": [x for l in lats for x in l], "wall": wall, "not_persisted": lost,
            "per_commit": (sum(commits) / len(commits)) if commits else float("nan")}


async def processes(turnsafe: str, home: str, k: int) -> dict:
    """K `turnsafe append --session` processes, one per client."""
    procs = [await asyncio.create_subprocess_exec(
        turnsafe, "append", "--home", home, "--session", f"c{c}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        limit=1 << 24) for c in range(k)]
    lost = 0

    async def client(c: int, batches: range) -> list:
        nonlocal lost
        p = procs[c]
        lat = []
        for b in batches:
            t = time.perf_counter()
            p.stdin.write((json.dumps(batch(c, b)) + "\n").encode())
            await p.stdin.drain()
            out = json.loads(await p.stdout.readline())
            lat.append(time.perf_counter() - t)
            if not out.get("persisted"):
                lost += 1
        return lat

    await asyncio.gather(*(client(c, range(-1, 0)) for c in range(k)))
    t0 = time.perf_counter()
    lats = await asyncio.gather(*(client(c, range(PER_CLIENT)) for c in range(k)))
    wall = time.perf_counter() - t0
    for p in procs:
        p.stdin.close()
        await p.wait()
    return {"lat": [x for l in lats for x in l], "wall": wall, "not_persisted": lost, "per_commit": 1.0}


async def sdk(db: str, k: int) -> dict:
    """K SQLiteSessions on one file, through asyncio.gather."""
    from agents.memory import SQLiteSession

    original = SQLiteSession._configure_connection

    def configure(conn):
        original(conn)
        conn.execute("PRAGMA synchronous=FULL")

    SQLiteSession._configure_connection = staticmethod(configure)
    sessions = [SQLiteSession(f"c{c}", db) for c in range(k)]

    async def client(c: int, batches: range) -> list:
        lat = []
        for b in batches:
            t = time.perf_counter()
            await sessions[c].add_items(batch(c, b))
            lat.append(time.perf_counter() - t)
        return lat

    await asyncio.gather(*(client(c, range(-1, 0)) for c in range(k)))
    t0 = time.perf_counter()
    lats = await asyncio.gather(*(client(c, range(PER_CLIENT)) for c in range(k)))
    wall = time.perf_counter() - t0
    for s in sessions:
        s.close()
    SQLiteSession._configure_connection = original
    return {"lat": [x for l in lats for x in l], "wall": wall, "not_persisted": 0, "per_commit": 1.0}


def summary(runs: list, k: int) -> dict:
    # The median round by throughput; latencies over every round.
    walls = sorted(r["wall"] for r in runs)
    wall = walls[len(walls) // 2]
    lat = [x for r in runs for x in r["lat"]]
    return {"msgs": k * PER_CLIENT * 10 / wall, "p50": pct(lat, 0.50) * 1e3, "p99": pct(lat, 0.99) * 1e3,
            "per_commit": statistics.fmean(r["per_commit"] for r in runs),
            "not_persisted": sum(r["not_persisted"] for r in runs)}


def main() -> int:
    turnsafe = os.environ.get("TURNSAFE_BIN")
    if not turnsafe:
        print("TURNSAFE_BIN is required (run benches/many-sessions)", file=sys.stderr)
        return 2
    results = {}
    for k in KS:
        runs = {"grouped": [], "processes": [], "sdk": []}
        for r in range(ROUNDS):
            # Rotate who goes first, so a busy machine slows all alike.
            order = ["grouped", "processes", "sdk"]
            order = order[r % 3:] + order[:r % 3]
            for name in order:
                with tempfile.TemporaryDirectory() as d:
                    if name == "grouped":
                        runs[name].append(asyncio.run(grouped(turnsafe, os.path.join(d, "home"), k)))
                    elif name == "processes":
                        runs[name].append(asyncio.run(processes(turnsafe, os.path.join(d, "home"), k)))
                    else:
                        runs[name].append(asyncio.run(sdk(os.path.join(d, "sdk.db"), k)))
        results[k] = {n: summary(v, k) for n, v in runs.items()}

    labels = {"grouped": "turnsafe append, one process (group commit)",
              "processes": "turnsafe append, K processes",
              "sdk": "SQLiteSession, asyncio.gather"}
    print(f"{PER_CLIENT} batches of 10 messages per client, WAL, synchronous=FULL, {ROUNDS} round(s)")
    print(f"{'K':>3} {'store':<45} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'batch/commit':>13} {'vs SDK':>7}")
    for k, res in results.items():
        for name in ("grouped", "processes", "sdk"):
            s = res[name]
            ratio = s["msgs"] / res["sdk"]["msgs"]
            print(f"{k:>3} {labels[name]:<45} {s['msgs']:>9.0f} {s['p50']:>8.2f} {s['p99']:>8.2f} "
                  f"{s['per_commit']:>13.2f} {ratio:>6.2f}x")
    bad = sum(s["not_persisted"] for res in results.values() for s in res.values())
    print(f"batches not persisted: {bad}")
    base = results.get(1, {}).get("grouped")
    for k in (16, 64):
        if k in results:
            g, s = results[k]["grouped"], results[k]["sdk"]
            print(f"K={k}: grouped turnsafe / SQLiteSession = {g['msgs'] / s['msgs']:.2f}x (target >= 3)")
    if base and 64 in results:
        print(f"K=64: p99 {results[64]['grouped']['p99']:.2f} ms = "
              f"{results[64]['grouped']['p99'] / base['p50']:.2f}x the single-session p50 "
              f"{base['p50']:.2f} ms (target <= 4)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
