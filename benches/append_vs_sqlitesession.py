"""`turnsafe append` end to end, one session, against the OpenAI Agents SDK's
`SQLiteSession` and the bare rusqlite floor, on the same batches.

Run it with `benches/append-vs-sqlitesession`, which builds the binaries
and the bench's own venv. Every store gets 10 messages of about 230 B per
batch, WAL and `synchronous=FULL`, in a closed loop: the next batch is sent
only once the previous outcome was read. The three stores take turns batch
by batch (rotating who goes first), so a busy machine slows them alike;
ROUNDS rounds, each on fresh databases.

- `turnsafe append` (guard on): a child process, batches on stdin as JSON
  Lines, outcomes read from stdout. The full-text index is off the commit
  path; the search catch-up that indexes what was committed is timed apart,
  after the run.
- `SQLiteSession.add_items` (no full-text index), in this process.
- The floor (`host/examples/bare_append.rs`): the same rows into the same
  tables with the same pragmas through rusqlite, same protocol as turnsafe.

Per store: msg/s (messages over the sum of its batch latencies, median
round), p50 and p99 batch latency (from the line written, or `add_items`
called, to the outcome read, over every round),
and WAL frames per batch, read from the wal-index header (`mxFrame`, in the
`-shm` file) after each batch, the same way for all three.

Environment: TURNSAFE_BIN, FLOOR_BIN (required), BATCHES (default 1000),
ROUNDS (default 3).
"""

import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

BATCHES = int(os.environ.get("BATCHES", "1000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def batch(b: int) -> list:
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"batch {b:>4} message {i} " + "x" * 210} for i in range(10)]


class WalFrames:
    """Frames per commit from the wal-index header's mxFrame (offset 16).
    After a checkpoint the WAL restarts and mxFrame counts from 0 again."""

    def __init__(self, db: str):
        self.shm = db + "-shm"
        self.last = None
        self.frames = []

    def read(self) -> int:
        with open(self.shm, "rb") as f:
            f.seek(16)
            return struct.unpack("=I", f.read(4))[0]

    def after_batch(self) -> None:
        now = self.read()
        if self.last is not None:
            self.frames.append(now - self.last if now >= self.last else now)
        self.last = now


class Process:
    """A JSON Lines writer (`turnsafe append`, the floor) driven one batch at a time."""

    def __init__(self, cmd: list, db: str):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.wal = WalFrames(db)

    async def send(self, items: list) -> float:
        line = (json.dumps(items) + "\n").encode()
        t = time.perf_counter()
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        took = time.perf_counter() - t
        o = json.loads(out)
        assert o.get("persisted") is True and o.get("committed") == len(items), o
        self.wal.after_batch()
        return took

    def close(self) -> None:
        self.proc.stdin.close()
        rc = self.proc.wait()
        assert rc == 0, self.proc.stderr.read()[-2000:]


class Sdk:
    """The Agents SDK's SQLiteSession, every connection FULL like the others."""

    def __init__(self, db: str):
        from agents.memory import SQLiteSession

        original = SQLiteSession._configure_connection

        def configure(conn):
            original(conn)
            conn.execute("PRAGMA synchronous=FULL")

        # SQLiteSession opens one connection per worker thread.
        SQLiteSession._configure_connection = staticmethod(configure)
        self.session = SQLiteSession("bench", db)
        self.wal = WalFrames(db)

    async def send(self, items: list) -> float:
        t = time.perf_counter()
        await self.session.add_items(items)
        took = time.perf_counter() - t
        self.wal.after_batch()
        return took

    def close(self) -> None:
        self.session.close()


async def round_(d: str, r: int, turnsafe: str, floor: str) -> dict:
    """One round on fresh databases. The stores take turns batch by batch
    (rotating who goes first), so all three meet the same machine
    conditions; each is still a closed loop of its own."""
    home, fhome = os.path.join(d, f"ts{r}"), os.path.join(d, f"floor{r}")
    stores = {
        "turnsafe": Process([turnsafe, "append", "--home", home, "--session", "bench"],
                            os.path.join(home, "state.db")),
        "sqlitesession": Sdk(os.path.join(d, f"sdk{r}.db")),
        "floor": Process([floor, fhome, "bench"], os.path.join(fhome, "state.db")),
    }
    names = list(stores)
    for s in stores.values():
        await s.send(batch(-1))  # opens and creates the store: not counted
    lat = {n: [] for n in names}
    for b in range(BATCHES):
        items = batch(b)
        for k in range(len(names)):
            n = names[(b + k) % len(names)]
            lat[n].append(await stores[n].send(items))
    for s in stores.values():
        s.close()
    return {n: (BATCHES * 10 / sum(lat[n]), lat[n], stores[n].wal.frames) for n in names}


def pct(xs: list, p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main() -> int:
    turnsafe, floor = os.environ["TURNSAFE_BIN"], os.environ["FLOOR_BIN"]
    results = {"turnsafe": [], "sqlitesession": [], "floor": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(ROUNDS):
            for n, v in asyncio.run(round_(d, r, turnsafe, floor)).items():
                results[n].append(v)

        # Apart from the timed run: search's catch-up indexes what was committed.
        home = os.path.join(d, f"ts{ROUNDS - 1}")
        t = time.perf_counter()
        out = subprocess.run([turnsafe, "search", "--home", home, "--json", "message 7"],
                             capture_output=True, check=True, text=True)
        catch_up = time.perf_counter() - t
        end = json.loads(out.stdout.splitlines()[-1])
        t = time.perf_counter()
        subprocess.run([turnsafe, "search", "--home", home, "--json", "message 7"], capture_output=True, check=True)
        warm = time.perf_counter() - t
        indexed = (BATCHES + 1) * 10

    rows = {}
    for name, runs in results.items():
        rows[name] = {
            "msgs": statistics.median(r[0] for r in runs),
            "p50": pct([x for r in runs for x in r[1]], 0.50) * 1e3,
            "p99": pct([x for r in runs for x in r[1]], 0.99) * 1e3,
            "frames": statistics.mean(x for r in runs for x in r[2]),
        }
    sdk, fl = rows["sqlitesession"], rows["floor"]
    print(f"{BATCHES} batches x 10 messages of ~230 B, one session, closed loop, WAL, synchronous=FULL; "
          f"msg/s is the median of {ROUNDS} rounds")
    print(f"{'store':<34} {'msg/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'WAL frames/batch':>17} "
          f"{'vs SQLiteSession':>17} {'vs floor':>9}")
    labels = {"turnsafe": "turnsafe append (guard on)", "sqlitesession": "SQLiteSession.add_items",
              "floor": "bare rusqlite floor"}
    for name in ("turnsafe", "sqlitesession", "floor"):
        row = rows[name]
        print(f"{labels[name]:<34} {row['msgs']:>8,.0f} {row['p50']:>8.3f} {row['p99']:>8.3f} {row['frames']:>17.2f} "
              f"{row['msgs'] / sdk['msgs']:>16.2f}x {row['msgs'] / fl['msgs']:>8.2f}x")
    ts = rows["turnsafe"]
    print(f"turnsafe/SQLiteSession msg/s: {ts['msgs'] / sdk['msgs']:.2f}x (target >= 1.2)")
    print(f"floor/turnsafe batch time (msg/s ratio): {fl['msgs'] / ts['msgs']:.2f}x (target <= 1.25)")
    print(f"WAL frames per batch: turnsafe {ts['frames']:.2f}, SQLiteSession {sdk['frames']:.2f} "
          f"(target <= SQLiteSession + 2)")
    print(f"search catch-up, apart: {indexed} messages indexed and searched in {catch_up * 1e3:.0f} ms "
          f"({indexed / catch_up:,.0f} msg/s; {end['data']['hits']} hits, unindexed {end['data']['unindexed']}); "
          f"the next search {warm * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
