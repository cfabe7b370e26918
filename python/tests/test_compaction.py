"""The Agents SDK's atomic compaction over TurnsafeSession: the snapshot
hook and the whole-history hook replace in one transaction, keep what they
replaced in the archive, refuse a changed suffix, and on a real storage
failure (an abort trigger installed in state.db, a write lock held past the
patience, a home made read-only) raise and change nothing; no reader ever sees a partial replace.
``OpenAIResponsesCompactionSession`` is driven by ``Runner.run`` with a
scripted model and a compaction client written for the test (no network)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from agents import Agent, Runner
from agents.memory.openai_responses_compaction_session import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message

import turnsafe_store
from conftest import immutable
from turnsafe_store import Store
from turnsafe_store.agents import TurnsafeSession


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def summary(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


class CompactClient:
    """`client.responses.compact(...)`, answered from the test: one
    summary item for whatever it is given, and every call recorded."""

    def __init__(self) -> None:
        self.calls: list = []
        self.responses = SimpleNamespace(compact=self.compact)

    async def compact(self, **kwargs):
        self.calls.append(kwargs)
        n = len(kwargs.get("input") or [])
        return SimpleNamespace(output=[summary(f"summary of {n} items")], usage=None)


def sql(db: Path, statement: str) -> None:
    """Run SQL from another process: two copies of SQLite in one process
    (the store's and Python's) do not see each other's file locks."""
    subprocess.run(
        [sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2])",
         str(db), statement],
        check=True,
    )


HOLD = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute('BEGIN IMMEDIATE')
print('ready', flush=True)
sys.stdin.readline()
c.execute('ROLLBACK')
"""

READ = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print('ready', flush=True)
seen = set()
while True:
    seen.add(c.execute("SELECT count(*) FROM messages WHERE session_id = 's1'").fetchone()[0])
    try:
        import select
        if select.select([sys.stdin], [], [], 0)[0]:
            break
    except Exception:
        break
print(sorted(seen), flush=True)
"""


def stored(home, session) -> list:
    with Store(home) as s:
        return s.rows(session)


def test_snapshot_replace_suffix_is_atomic_and_archives(home):
    session = TurnsafeSession("s1", home)

    async def go():
        await session.add_items([user(f"m{i}") for i in range(6)])
        snap = await session._get_compaction_snapshot(4)
        assert [i["content"] for i in snap.items] == ["m2", "m3", "m4", "m5"]
        assert snap.complete is False
        assert await snap.replace_suffix(1, [summary("m3..m5")]) is True
        return await session.get_items()

    items = asyncio.run(go())
    assert [i.get("content") for i in items[:3]] == ["m0", "m1", "m2"]
    assert items[3]["content"][0]["text"] == "m3..m5"
    archived = session.store.show(session.turnsafe_id, archived=True)
    assert sorted(a["message"]["content"] for a in archived) == ["m3", "m4", "m5"]
    assert {a["reason"] for a in archived} == {"compaction"}
    # Restoring the compaction brings the originals back.
    report = session.store.restore(session.turnsafe_id, reason="compaction")
    assert len(report["restored"]) == 3


def test_a_changed_suffix_is_refused_and_changes_nothing(home):
    session = TurnsafeSession("s1", home)

    async def go():
        await session.add_items([user("a"), user("b"), user("c")])
        snap = await session._get_compaction_snapshot(10)
        assert snap.complete is True
        await session.add_items([user("d")])  # the history moved on
        return await snap.replace_suffix(1, [summary("b..c")])

    assert asyncio.run(go()) is False
    assert [r["message"]["content"] for r in stored(home, session.turnsafe_id)] == ["a", "b", "c", "d"]
    assert session.store.show(session.turnsafe_id, archived=True) == []


def test_prune_prefix_archives_the_expired_items_in_the_same_transaction(home):
    session = TurnsafeSession("s1", home)

    async def go():
        await session.add_items([user("old-1"), user("old-2"), user("keep"), user("x"), user("y")])
        snap = await session._get_compaction_snapshot(2, prune_prefix=lambda item: item["content"].startswith("old"))
        assert await snap.replace_suffix(0, [summary("x..y")])
        return await session.get_items()

    items = asyncio.run(go())
    assert items[0]["content"] == "keep"
    assert items[1]["content"][0]["text"] == "x..y"
    reasons = session.store.show(session.turnsafe_id, archived=True)
    assert sorted(a["message"]["content"] for a in reasons) == ["old-1", "old-2", "x", "y"]


def test_a_storage_failure_mid_compaction_raises_and_changes_nothing(home):
    session = TurnsafeSession("s1", home)

    async def fill():
        await session.add_items([user(f"m{i}") for i in range(4)])
        return await session._get_compaction_snapshot(10)

    snap = asyncio.run(fill())
    before = stored(home, session.turnsafe_id)
    # A real failure inside the transaction: the archive insert aborts.
    sql(home / "state.db", "CREATE TRIGGER refuse BEFORE INSERT ON archive BEGIN SELECT RAISE(ABORT, 'no room'); END;")
    with pytest.raises(turnsafe_store.Error) as e:
        asyncio.run(snap.replace_suffix(1, [summary("m1..m3")]))
    assert "no room" in str(e.value)
    with pytest.raises(turnsafe_store.Error):
        asyncio.run(session._atomic_replace_items([summary("all")]))
    sql(home / "state.db", "DROP TRIGGER refuse;")
    assert stored(home, session.turnsafe_id) == before, "never half applied"


def test_a_lock_held_past_the_patience_raises_locked_and_changes_nothing(home):
    session = TurnsafeSession("s1", home)

    async def fill():
        await session.add_items([user("a"), user("b")])
        return await session._get_compaction_snapshot(10)

    snap = asyncio.run(fill())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home / "state.db")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "ready"
    try:
        with pytest.raises(turnsafe_store.Error) as e:
            asyncio.run(snap.replace_suffix(0, [summary("a..b")]))
        assert e.value.cause == "locked"
    finally:
        holder.communicate("done\n", timeout=30)
    assert [r["message"]["content"] for r in stored(home, session.turnsafe_id)] == ["a", "b"]


def test_a_read_only_home_mid_compaction_raises_disk_and_changes_nothing(home):
    session = TurnsafeSession("s1", home)

    async def fill():
        await session.add_items([user(f"m{i}") for i in range(4)])
        return await session._get_compaction_snapshot(10)

    snap = asyncio.run(fill())
    before = stored(home, session.turnsafe_id)
    # Between the snapshot and the replace, the home stops taking writes:
    # the folder and every file of the database, even for root.
    files = [home / n for n in ("state.db", "state.db-wal", "state.db-shm") if (home / n).exists()]
    with immutable(home, *files):
        with pytest.raises(turnsafe_store.Error) as e:
            asyncio.run(snap.replace_suffix(1, [summary("m1..m3")]))
        assert e.value.cause in ("disk", "read_only"), e.value
        assert "did not happen; nothing changed" in str(e.value), e.value
        with pytest.raises(turnsafe_store.Error):
            asyncio.run(session._atomic_replace_items([summary("all")]))
    assert stored(home, session.turnsafe_id) == before, "never half applied"
    assert session.store.show(session.turnsafe_id, archived=True) == [], "nothing archived"


def test_no_reader_sees_a_partial_replace(home):
    session = TurnsafeSession("s1", home)
    asyncio.run(session.add_items([user(f"m{i}") for i in range(40)]))
    reader = subprocess.Popen(
        [sys.executable, "-c", READ, str(home / "state.db")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert reader.stdout.readline().strip() == "ready"
    for k in range(4):
        snap = asyncio.run(session._get_compaction_snapshot(100))
        start = len(snap.items) - 10
        assert asyncio.run(snap.replace_suffix(start, [summary(f"round {k}")]))
        time.sleep(0.05)
    out, _ = reader.communicate("done\n", timeout=30)
    seen = eval(out.strip())  # the reader's sorted list of counts
    # 40, then 31, 22, 13, 4: each round replaces 10 items with 1, atomically.
    assert set(seen) <= {40, 31, 22, 13, 4}, seen
    assert len(seen) >= 2, "the reader saw the history change"
    assert len(stored(home, "s1")) == 4
    assert len(session.store.show("s1", archived=True)) == 40


def test_manual_run_compaction_uses_the_atomic_whole_history_hook(home):
    underlying = TurnsafeSession("s1", home)
    client = CompactClient()
    compacting = OpenAIResponsesCompactionSession("s1", underlying, client=client, model="gpt-4.1")

    async def go():
        await compacting.add_items([user(f"m{i}") for i in range(5)])
        await compacting.run_compaction({"force": True})
        return await underlying.get_items()

    items = asyncio.run(go())
    assert len(client.calls) == 1
    assert len(items) == 1 and items[0]["content"][0]["text"] == "summary of 5 items"
    archived = underlying.store.show(underlying.turnsafe_id, archived=True)
    assert len(archived) == 5 and {a["reason"] for a in archived} == {"compaction"}


def test_runner_with_compaction_over_turnsafe_keeps_what_it_replaced(home):
    underlying = TurnsafeSession("conv", home)
    client = CompactClient()
    compacting = OpenAIResponsesCompactionSession(
        "conv",
        underlying,
        client=client,
        model="gpt-4.1",
        should_trigger_compaction=lambda ctx: len(ctx["compaction_candidate_items"]) >= 2,
    )
    model = ScriptedModel()
    agent = Agent(name="a", instructions="Reply.", model=model)

    async def go():
        for i in range(3):
            model.enqueue([assistant_message(f"reply {i}")])
            await Runner.run(agent, f"question {i}", session=compacting)
        return await underlying.get_items()

    items = asyncio.run(go())
    archived = underlying.store.show(underlying.turnsafe_id, archived=True)
    assert client.calls, "compaction ran"
    assert archived, "what compaction replaced is kept"
    texts = [str(i) for i in items]
    assert any("summary of" in t for t in texts), texts
    # Every replaced item is in the archive: nothing the runner stored was lost.
    every = {str(a["message"]) for a in archived} | set(texts)
    for i in range(3):
        assert any(f"question {i}" in t for t in every), i
