"""TurnsafeSaver and AsyncTurnsafeSaver against LangGraph's SqliteSaver and
AsyncSqliteSaver, in process.

A real StateGraph: one node that appends a ~200 B message to
``messages`` (an ``operator.add`` channel) and increments ``n``, looping
back to itself through a conditional edge until ``n`` reaches STEPS, so
each step is one checkpoint and its writes. One graph thread, then 16 at
once on one saver (16 OS threads for the sync savers, 16 asyncio tasks
for the async ones). Both WAL with synchronous=FULL: turnsafe's by its
default, the peers' read back from their connection (and set to FULL,
saying so, if it is not). Prints steps/s and the ratios, the median of
ROUNDS rounds (default 3); STEPS steps per graph thread (default 200);
DURABILITY is LangGraph's durability mode (default "async", LangGraph's
own). Run through benches/langgraph-vs-sqlitesaver, which builds the
package into the bench's venv first.
"""

from __future__ import annotations

import asyncio
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, TypedDict

STEPS = int(os.environ.get("STEPS", "200"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURABILITY = os.environ.get("DURABILITY", "async")
THREADS = 16
TARGET = {1: 1.5, THREADS: 3}
PAYLOAD = "x" * 180

# What each saver ran with, as read in the run: kind -> text.
RAN_WITH: dict = {}


class State(TypedDict):
    messages: Annotated[list, operator.add]
    n: int


def build(checkpointer):
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
    return g.compile(checkpointer=checkpointer)


def config(k: int) -> dict:
    return {"configurable": {"thread_id": f"bench-{k}"}, "recursion_limit": STEPS + 10}


def check(out: dict) -> None:
    if out["n"] != STEPS or len(out["messages"]) != STEPS:
        raise SystemExit(f"graph ended at n={out['n']} with {len(out['messages'])} messages, not {STEPS}")


def drive_sync(graph, n: int) -> float:
    def one(k: int) -> None:
        check(graph.invoke({"messages": [], "n": 0}, config(k), durability=DURABILITY))

    t = time.perf_counter()
    if n == 1:
        one(0)
    else:
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(one, range(n)))
    return n * STEPS / (time.perf_counter() - t)


async def drive_async(graph, n: int) -> float:
    async def one(k: int) -> None:
        check(await graph.ainvoke({"messages": [], "n": 0}, config(k), durability=DURABILITY))

    t = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n)))
    return n * STEPS / (time.perf_counter() - t)


def pragmas(conn) -> tuple:
    return conn.execute("PRAGMA journal_mode").fetchone()[0], conn.execute("PRAGMA synchronous").fetchone()[0]


def turnsafe_mode(home: str) -> str:
    # journal_mode is kept in the file; synchronous is the store's own,
    # set on its connection from TurnsafeSaver(home, synchronous="full").
    c = sqlite3.connect(os.path.join(home, "state.db"))
    try:
        return f'journal_mode={c.execute("PRAGMA journal_mode").fetchone()[0]}, synchronous=FULL (synchronous="full", its default)'
    finally:
        c.close()


def peer_mode(journal: str, sync: int, was: int) -> str:
    if was == 2:
        return f"journal_mode={journal}, synchronous={sync} (FULL, SQLite's default, read back from its connection)"
    return f"journal_mode={journal}, synchronous={sync} (FULL, set by this bench: its connection had {was})"


def run_sync(kind: str, d: str, n: int) -> float:
    if kind == "turnsafe":
        from turnsafe_store.langgraph import TurnsafeSaver

        home = os.path.join(d, "home")
        with TurnsafeSaver(home) as saver:
            rate = drive_sync(build(saver), n)
        RAN_WITH.setdefault("TurnsafeSaver", turnsafe_mode(home))
        return rate
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(os.path.join(d, "checkpoints.db"), check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        saver.setup()  # its PRAGMA journal_mode=WAL and tables
        journal, was = pragmas(conn)
        if was != 2:
            conn.execute("PRAGMA synchronous=FULL")
        RAN_WITH.setdefault("SqliteSaver", peer_mode(journal, pragmas(conn)[1], was))
        return drive_sync(build(saver), n)
    finally:
        conn.close()


async def run_async(kind: str, d: str, n: int) -> float:
    if kind == "turnsafe":
        from turnsafe_store.langgraph import AsyncTurnsafeSaver

        home = os.path.join(d, "home")
        async with AsyncTurnsafeSaver(home) as saver:
            rate = await drive_async(build(saver), n)
        RAN_WITH.setdefault("AsyncTurnsafeSaver", turnsafe_mode(home))
        return rate
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(os.path.join(d, "checkpoints.db")) as saver:
        await saver.setup()  # its PRAGMA journal_mode=WAL and tables

        async def read() -> tuple:
            out = []
            for p in ("journal_mode", "synchronous"):
                cur = await saver.conn.execute(f"PRAGMA {p}")
                out.append((await cur.fetchone())[0])
                await cur.close()
            return tuple(out)

        journal, was = await read()
        if was != 2:
            await saver.conn.execute("PRAGMA synchronous=FULL")
        RAN_WITH.setdefault("AsyncSqliteSaver", peer_mode(journal, (await read())[1], was))
        return await drive_async(build(saver), n)


def measure(pair: str, kind: str, n: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        if pair == "sync":
            return run_sync(kind, d, n)
        return asyncio.run(run_async(kind, d, n))


def main() -> int:
    # Rounds alternate which saver goes first, so a machine that gets busier
    # or quieter during the run slows both alike; the median round counts.
    results: dict = {}
    t0 = time.perf_counter()
    for r in range(ROUNDS):
        for pair in ("sync", "async"):
            for n in (1, THREADS):
                kinds = ("turnsafe", "peer") if r % 2 == 0 else ("peer", "turnsafe")
                for kind in kinds:
                    results.setdefault((pair, n, kind), []).append(measure(pair, kind, n))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"StateGraph of {STEPS} steps per graph thread (one node appending a ~200 B message and"
          f" incrementing n, a conditional edge back to itself), durability={DURABILITY!r};"
          f" median of {ROUNDS} round(s), {time.perf_counter() - t0:.0f} s in all")
    for name in ("TurnsafeSaver", "SqliteSaver", "AsyncTurnsafeSaver", "AsyncSqliteSaver"):
        print(f"  {name:<19} {RAN_WITH[name]}")
    print()
    print(f"{'savers':<40} {'threads':>7} {'turnsafe steps/s':>17} {'peer steps/s':>13} {'ratio':>6}  target")
    for pair, names in (("sync", "TurnsafeSaver / SqliteSaver"), ("async", "AsyncTurnsafeSaver / AsyncSqliteSaver")):
        for n in (1, THREADS):
            ts, peer = med[(pair, n, "turnsafe")], med[(pair, n, "peer")]
            print(f"{names:<40} {n:>7} {ts:>17,.0f} {peer:>13,.0f} {ts / peer:>6.2f}  {TARGET[n]}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
