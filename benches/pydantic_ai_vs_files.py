"""TurnsafeConversationStore against the documented ways of keeping a
Pydantic AI history, saving each run of conversations whose histories hold
HISTORY messages (default 200).

Each run adds a request and a response (about 230 B of text each) to a
conversation, then saves it:

- turnsafe: ``TurnsafeConversationStore.save`` of the conversation (loaded
  once from the store, as an app continues it): the two new entries and the
  record, one transaction, WAL, synchronous=FULL;
- files+fsync: ``ModelMessagesTypeAdapter.dump_json`` of the whole history
  rewritten to the conversation's file, then ``fsync``;
- files: the same without ``fsync``;
- sqlite3: the same JSON in a row per conversation (``INSERT OR REPLACE``),
  WAL, synchronous=FULL.

At 1 conversation the saves run one after another; at 16 they run at once
(``asyncio.gather``; the peers on threads, ``asyncio.to_thread``). Prints
saves/s and turnsafe's ratio to each peer: the median of ROUNDS interleaved
rounds (default 5), with the spread. Run through benches/pydantic-ai-vs-files.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time

from pydantic_ai.conversation import Conversation
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ModelResponse, TextPart

RUNS = int(os.environ.get("RUNS", "60"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
HISTORY = int(os.environ.get("HISTORY", "200"))
PEERS = ("files+fsync", "files", "sqlite3")


def pair(c: int, i: int) -> list:
    return [
        ModelRequest.user_text_prompt(f"c{c} turn {i} question " + "x" * 200),
        ModelResponse(parts=[TextPart(f"c{c} turn {i} answer " + "y" * 200)], model_name="bench"),
    ]


def history(c: int) -> list:
    out = []
    for i in range(HISTORY // 2):
        out += pair(c, i)
    return out


class Files:
    def __init__(self, d: str, sync: bool) -> None:
        self.d, self.sync = d, sync

    def save(self, c: int, messages: list) -> None:
        data = ModelMessagesTypeAdapter.dump_json(messages)
        with open(os.path.join(self.d, f"c{c}.json"), "wb") as f:
            f.write(data)
            if self.sync:
                f.flush()
                os.fsync(f.fileno())

    def close(self) -> None:
        pass


class Sqlite:
    def __init__(self, d: str) -> None:
        self.path = os.path.join(d, "conversations.db")
        c = self.connect()
        c.execute("CREATE TABLE IF NOT EXISTS conversations(id TEXT PRIMARY KEY, messages BLOB NOT NULL)")
        c.close()
        self.conns: dict = {}

    def connect(self) -> sqlite3.Connection:
        c = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        return c

    def save(self, c: int, messages: list) -> None:
        data = ModelMessagesTypeAdapter.dump_json(messages)
        conn = self.conns.get(c)
        if conn is None:
            conn = self.conns[c] = self.connect()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO conversations(id, messages) VALUES (?, ?)", (f"c{c}", data))
        conn.execute("COMMIT")

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


async def peer(kind: str, d: str, n: int) -> float:
    store = Files(d, True) if kind == "files+fsync" else Files(d, False) if kind == "files" else Sqlite(d)
    convs = {c: history(c) for c in range(n)}
    for c in range(n):  # the conversations exist before the clock starts
        store.save(c, convs[c])

    async def one(c: int) -> None:
        for i in range(RUNS):
            convs[c] += pair(c, HISTORY + i)
            if n == 1:
                store.save(c, convs[c])
            else:
                await asyncio.to_thread(store.save, c, convs[c])

    t = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(n)))
    took = time.perf_counter() - t
    store.close()
    return n * RUNS / took


async def turnsafe(d: str, n: int) -> float:
    from turnsafe_store.pydantic_ai import TurnsafeConversationStore

    store = TurnsafeConversationStore(os.path.join(d, "home"))
    convs = {}
    for c in range(n):
        await store.save(Conversation(conversation_id=f"c{c}", messages=history(c)))
        convs[c] = await store.load(f"c{c}")

    async def one(c: int) -> None:
        for i in range(RUNS):
            convs[c].messages.extend(pair(c, HISTORY + i))
            await store.save(convs[c])

    t = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(n)))
    took = time.perf_counter() - t
    # Every save is in the store: the last one's history, whole.
    last = await store.load("c0")
    assert len(last.messages) == HISTORY + 2 * RUNS
    store.close()
    return n * RUNS / took


def spread(xs: list) -> str:
    return f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    where = os.environ.get("BENCH_DIR") or None
    print(f"# {HISTORY}-message histories, {RUNS} saves per conversation, {ROUNDS} rounds, in {where or tempfile.gettempdir()}")
    print("| conversations | turnsafe saves/s | files+fsync | files | sqlite3 | vs files+fsync | vs files | vs sqlite3 |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (1, 16):
        ratios = {p: [] for p in PEERS}
        rates = {k: [] for k in ("turnsafe", *PEERS)}
        for r in range(ROUNDS):
            # Interleaved, who goes first alternating, each on a fresh folder.
            order = ["turnsafe", *PEERS] if r % 2 == 0 else [*PEERS, "turnsafe"]
            got = {}
            for kind in order:
                with tempfile.TemporaryDirectory(dir=where) as d:
                    got[kind] = asyncio.run(turnsafe(d, n) if kind == "turnsafe" else peer(kind, d, n))
            for k, v in got.items():
                rates[k].append(v)
            for p in PEERS:
                ratios[p].append(got["turnsafe"] / got[p])
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(
            f"| {n} | {med['turnsafe']:.0f} | {med['files+fsync']:.0f} | {med['files']:.0f} | {med['sqlite3']:.0f} | "
            + " | ".join(spread(ratios[p]) for p in PEERS)
            + " |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
