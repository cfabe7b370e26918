"""TurnsafeSession against the OpenAI Agents SDK's SQLiteSession, in process.

Same items (10 per batch, about 230 B each), both WAL with synchronous=FULL;
turnsafe keeps its full-text index, SQLiteSession has none. One session,
then 16 sessions on one home through asyncio.gather. Prints msg/s and the
ratios, the median of ROUNDS rounds (default 3). Run through
benches/session-vs-sqlitesession, which builds the package with its extra
into the bench's venv first.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time

BATCHES = int(os.environ.get("BATCHES", "300"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SESSIONS = 16


def batch(s: int, b: int) -> list:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"s{s} batch {b} message {i} " + "x" * 200}
        for i in range(10)
    ]


async def drive(sessions, batches: int) -> float:
    async def one(k, s):
        for b in range(batches):
            await s.add_items(batch(k, b))

    t = time.perf_counter()
    await asyncio.gather(*(one(k, s) for k, s in enumerate(sessions)))
    return len(sessions) * batches * 10 / (time.perf_counter() - t)


def sqlite_sessions(path: str, n: int):
    from agents.memory import SQLiteSession

    out = [SQLiteSession(f"bench-{k}", path) for k in range(n)]
    for s in out:
        s._get_connection().execute("PRAGMA synchronous=FULL")
    return out


async def run(kind: str, d: str, n: int, batches: int) -> float:
    if kind == "turnsafe":
        from turnsafe_store import Store
        from turnsafe_store.agents import TurnsafeSession

        store = Store(os.path.join(d, "home"))
        sessions = [TurnsafeSession(f"bench-{k}", d, store=store) for k in range(n)]
        try:
            return await drive(sessions, batches)
        finally:
            store.close()
    sessions = sqlite_sessions(os.path.join(d, "sdk.db"), n)
    try:
        return await drive(sessions, batches)
    finally:
        for s in sessions:
            s.close()


async def taking_turns(d: str, steps: int, step) -> tuple:
    """One session of each, taking turns step by step (who goes first
    alternates), so both meet the same moment of the machine: steps per
    second over the sum of each one's time in `step(session, b)`."""
    from turnsafe_store import Store
    from turnsafe_store.agents import TurnsafeSession

    store = Store(os.path.join(d, "home"))
    ts = TurnsafeSession("bench-0", d, store=store)
    (sdk,) = sqlite_sessions(os.path.join(d, "sdk.db"), 1)
    spent = {"turnsafe": 0.0, "sqlitesession": 0.0}
    try:
        for b in range(steps):
            order = (("turnsafe", ts), ("sqlitesession", sdk))
            for name, s in order if b % 2 == 0 else order[::-1]:
                t = time.perf_counter()
                await step(s, b)
                spent[name] += time.perf_counter() - t
    finally:
        store.close()
        sdk.close()
    return steps / spent["turnsafe"], steps / spent["sqlitesession"]


async def add_batch(s, b: int) -> None:
    await s.add_items(batch(0, b))


async def agent_turn(s, b: int) -> None:
    """What a runner does each turn: read the last 20 items, then add the
    turn's batch."""
    await s.get_items(limit=20)
    await s.add_items(batch(0, b))


def main() -> int:
    # Rounds alternate which store goes first, so a machine that gets busier
    # or quieter during the run slows both alike; the median round counts.
    results: dict = {}
    for r in range(ROUNDS):
        for n, batches in ((1, BATCHES), (SESSIONS, max(1, BATCHES // 4))):
            kinds = ("turnsafe", "sqlitesession") if r % 2 == 0 else ("sqlitesession", "turnsafe")
            for kind in kinds:
                with tempfile.TemporaryDirectory() as d:
                    results.setdefault((kind, n), []).append(asyncio.run(run(kind, d, n, batches)))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"10 messages of ~230 B per batch, WAL, synchronous=FULL; {BATCHES} batches for 1 session,"
          f" {max(1, BATCHES // 4)} per session for {SESSIONS}; median of {ROUNDS} rounds")
    for n in (1, SESSIONS):
        ts, sdk = med[("turnsafe", n)], med[("sqlitesession", n)]
        print(f"{n:>2} session(s): TurnsafeSession {ts:>9,.0f} msg/s   SQLiteSession {sdk:>9,.0f} msg/s"
              f"   ratio {ts / sdk:.2f} (target >= {1.2 if n == 1 else 3})")
    with tempfile.TemporaryDirectory() as d:
        ts, sdk = (10 * r for r in asyncio.run(taking_turns(d, BATCHES * 2, add_batch)))
    print(f" 1 session, the two taking turns batch by batch ({BATCHES * 2} batches each): "
          f"TurnsafeSession {ts:,.0f} msg/s   SQLiteSession {sdk:,.0f} msg/s   ratio {ts / sdk:.2f}")
    with tempfile.TemporaryDirectory() as d:
        ts, sdk = asyncio.run(taking_turns(d, BATCHES * 2, agent_turn))
    print(f" 1 session, agent turns (get_items(limit=20), then add_items), taking turns ({BATCHES * 2} each): "
          f"TurnsafeSession {ts:,.0f} turns/s   SQLiteSession {sdk:,.0f} turns/s   ratio {ts / sdk:.2f}")
    base = med[("sqlitesession", 1)]
    print(f"16 sessions, TurnsafeSession vs single-session SQLiteSession: {med[('turnsafe', SESSIONS)] / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
