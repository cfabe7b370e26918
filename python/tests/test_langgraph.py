"""TurnsafeSaver under real LangGraph graphs: human-in-the-loop interrupt
and resume, time travel, subgraphs (checkpoint_ns), and real failures in
the middle of a running graph (an immutable state.db, a lock held past
the policy's patience, a PostgreSQL server stopped): each raises
TurnNotPersisted with a receipt, loses nothing, and after `replay` the
graph resumes where it stopped."""

from __future__ import annotations

import base64
import json
import operator
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Callable, Optional

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

import turnsafe_store
from turnsafe_store import TurnNotPersisted
from turnsafe_store.langgraph import AsyncTurnsafeSaver, TurnsafeSaver

from conftest import immutable, turnsafe_bin


class State(TypedDict):
    log: Annotated[list, operator.add]


def three_steps(ran: list, between: Optional[Callable[[], None]] = None):
    """a -> b -> c, each adding its name; `between` runs inside b (the
    failure arrives while the graph runs)."""

    def node(name):
        def run(state: State):
            ran.append(name)
            if name == "b" and between is not None:
                between()
            return {"log": [name]}

        return run

    g = StateGraph(State)
    for n in "abc":
        g.add_node(n, node(n))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


class Recorder:
    """Stands between a saver and its store and keeps every record the
    saver hands over and the store takes (a put's or a put_writes' batch,
    exactly as passed), so a test compares what is read back with what it
    stored, not with another read."""

    def __init__(self, store) -> None:
        self._store = store
        self._count = threading.Lock()
        # Batches handed to the store, and those it has answered.
        self.entered = 0
        self.batches = 0
        self.checkpoints: dict = {}
        self.writes: dict = {}

    def _enter(self) -> None:
        with self._count:
            self.entered += 1

    def _answered(self) -> None:
        with self._count:
            self.batches += 1

    @classmethod
    def around(cls, saver) -> "Recorder":
        saver.store = cls(saver.store)
        return saver.store

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def _lg_put_checkpoint(self, thread_id, checkpoint_ns, checkpoint_id, parent_id, type_, blob, metadata):
        self._enter()
        outcome = self._store._lg_put_checkpoint(thread_id, checkpoint_ns, checkpoint_id, parent_id, type_, blob, metadata)
        self._answered()
        if outcome.persisted:
            # A put replaces the checkpoint it meets.
            self.checkpoints[(thread_id, checkpoint_ns, checkpoint_id)] = {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint_id,
                "parent_checkpoint_id": parent_id,
                "type": type_,
                "checkpoint": base64.b64encode(bytes(blob)).decode(),
                "metadata": json.loads(metadata),
            }
        return outcome

    def _lg_put_writes(self, thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, records):
        self._enter()
        outcome = self._store._lg_put_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, records)
        self._answered()
        if outcome.persisted:
            # LangGraph's rule: special writes only (negative indices)
            # replace; otherwise the first copy is kept.
            replace = all(idx < 0 for idx, _, _, _ in records)
            for idx, channel, type_, blob in records:
                key = (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
                if replace or key not in self.writes:
                    self.writes[key] = {
                        "task_id": task_id,
                        "task_path": task_path,
                        "idx": idx,
                        "channel": channel,
                        "type": type_,
                        "value": base64.b64encode(bytes(blob)).decode(),
                    }
        return outcome

    def thread(self, thread_id: str) -> list:
        """The thread's checkpoints as `show --thread --json` prints them
        (without `created_ms`): every namespace, newest first, each with
        its pending writes in (task_path, task_id, idx) order."""
        rows = []
        for (thread, ns, cid), record in self.checkpoints.items():
            if thread != thread_id:
                continue
            writes = [w for (t, n, c, _, _), w in self.writes.items() if (t, n, c) == (thread, ns, cid)]
            writes.sort(key=lambda w: (w["task_path"], w["task_id"], w["idx"]))
            rows.append({**record, "pending_writes": writes})
        rows.sort(key=lambda r: r["checkpoint_ns"])
        rows.sort(key=lambda r: r["checkpoint_id"], reverse=True)
        return rows


def test_interrupt_and_resume_across_savers(home: Path) -> None:
    def ask(state: State):
        answer = interrupt("approve?")
        return {"log": [f"answer:{answer}"]}

    g = StateGraph(State)
    g.add_node("first", lambda s: {"log": ["first"]})
    g.add_node("ask", ask)
    g.add_edge(START, "first")
    g.add_edge("first", "ask")
    g.add_edge("ask", END)
    with TurnsafeSaver(home) as saver:
        graph = g.compile(checkpointer=saver)
        out = graph.invoke({"log": []}, cfg("hitl"))
        assert out["__interrupt__"][0].value == "approve?"
        state = graph.get_state(cfg("hitl"))
        assert state.next == ("ask",)
        assert state.tasks[0].interrupts[0].value == "approve?"
    # Another saver (another process, after a restart) resumes it.
    with TurnsafeSaver(home) as saver:
        graph = g.compile(checkpointer=saver)
        assert graph.get_state(cfg("hitl")).next == ("ask",)
        out = graph.invoke(Command(resume="yes"), cfg("hitl"))
        assert out["log"] == ["first", "answer:yes"]
        assert graph.get_state(cfg("hitl")).next == ()


def test_time_travel_resumes_from_an_earlier_checkpoint(home: Path) -> None:
    ran: list = []
    with TurnsafeSaver(home) as saver:
        graph = three_steps(ran).compile(checkpointer=saver)
        assert graph.invoke({"log": []}, cfg("tt"))["log"] == ["a", "b", "c"]
        history = list(graph.get_state_history(cfg("tt")))
        # Newest first: after c, after b, after a, the input, the start.
        assert [h.next for h in history] == [(), ("c",), ("b",), ("a",), ("__start__",)]
        ids = [h.config["configurable"]["checkpoint_id"] for h in history]
        assert ids == sorted(ids, reverse=True)
        after_a = history[2]
        assert after_a.values["log"] == ["a"]
        ran.clear()
        out = graph.invoke(None, after_a.config)
        assert out["log"] == ["a", "b", "c"] and ran == ["b", "c"]
        # The fork is a new branch: the newest checkpoint's parent is on it.
        newest = graph.get_state(cfg("tt"))
        assert newest.values["log"] == ["a", "b", "c"]
        assert len(list(graph.get_state_history(cfg("tt")))) > len(history)
        # Updating an old state forks too, as LangGraph documents.
        forked = graph.update_state(after_a.config, {"log": ["edited"]})
        assert graph.get_state(forked).values["log"] == ["a", "edited"]


def test_subgraph_checkpoints_live_under_their_namespace(home: Path) -> None:
    def inner_ask(state: State):
        return {"log": [f"inner:{interrupt('inner?')}"]}

    sub = StateGraph(State)
    sub.add_node("inner_a", lambda s: {"log": ["inner_a"]})
    sub.add_node("inner_ask", inner_ask)
    sub.add_edge(START, "inner_a")
    sub.add_edge("inner_a", "inner_ask")
    sub.add_edge("inner_ask", END)
    parent = StateGraph(State)
    parent.add_node("outer", lambda s: {"log": ["outer"]})
    parent.add_node("child", sub.compile())
    parent.add_edge(START, "outer")
    parent.add_edge("outer", "child")
    parent.add_edge("child", END)
    with TurnsafeSaver(home) as saver:
        stored = Recorder.around(saver)
        graph = parent.compile(checkpointer=saver)
        graph.invoke({"log": []}, cfg("sub"))
        state = graph.get_state(cfg("sub"), subgraphs=True)
        child = state.tasks[0].state
        ns = child.config["configurable"]["checkpoint_ns"]
        assert ns.startswith("child:"), ns
        assert child.values["log"] == ["outer", "inner_a"]
        namespaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(cfg("sub"))}
        assert "" in namespaces and ns in namespaces
        root_only = {"configurable": {"thread_id": "sub", "checkpoint_ns": ""}}
        assert {t.config["configurable"]["checkpoint_ns"] for t in saver.list(root_only)} == {""}
        out = graph.invoke(Command(resume="ok"), cfg("sub"))
        assert out["log"] == ["outer", "outer", "inner_a", "inner:ok"] or out["log"][-1] == "inner:ok"
    # The command line lists the thread's checkpoints, every namespace, newest first.
    shown = subprocess.run(
        [turnsafe_bin(), "show", "--home", str(home), "--thread", "sub", "--json"],
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(x) for x in shown.stdout.splitlines()]
    # Exactly the records the graph stored: each checkpoint (its bytes,
    # metadata and parent) with its pending writes, and the count.
    expected = stored.thread("sub")
    assert {r["checkpoint_ns"] for r in expected} == namespaces, namespaces
    assert [x["type"] for x in lines] == ["checkpoint"] * len(expected) + ["end"], lines
    assert lines[-1]["data"] == {"thread_id": "sub", "checkpoints": len(expected)}
    rows = [{k: v for k, v in x["data"].items() if k != "created_ms"} for x in lines[:-1]]
    assert rows == expected


def run_through_a_failure(home: Path, thread: str, fail: Callable[[], None], lift: Callable[[], None], *, db=None, replay_db=None):
    """Run a -> b -> c with `fail` applied inside b; the run raises
    TurnNotPersisted with a receipt; `lift` ends the failure; replay brings
    the diverted checkpoint back; the graph resumes with c only."""
    ran: list = []
    with TurnsafeSaver(home, db=db) as saver:
        graph = three_steps(ran, between=fail).compile(checkpointer=saver)
        with pytest.raises(TurnNotPersisted) as e:
            graph.invoke({"log": []}, cfg(thread), durability="sync")
        out = e.value.outcome
        assert not out.persisted and out.receipt is not None, out.to_dict()
        assert out.diverted >= 1 and out.handed_back == 0
        receipt = Path(out.receipt["path"])
        assert receipt.parent == (home / "sessions").resolve()
        kinds = {json.loads(x)["kind"] for x in receipt.read_text().splitlines()}
        assert kinds <= {"checkpoint", "write"} and kinds
    lift()
    pending = turnsafe_store.doctor(home, db=db)["facts"]["pending_divert_lines"]
    assert pending["checkpoint"] + pending["write"] >= 1 and pending["message"] == 0, pending
    report = turnsafe_store.replay(home, db=replay_db)
    assert report["replayed"] >= 1 and report["quarantined"] == 0, report
    again = turnsafe_store.replay(home, db=replay_db)
    assert again["lines"] == 0
    with TurnsafeSaver(home, db=db) as saver:
        graph = three_steps(ran).compile(checkpointer=saver)
        # What ran is stored: the state holds every node that ran (b
        # included, whose checkpoint was diverted), and nothing else.
        stored = graph.get_state(cfg(thread)).values["log"]
        assert stored == ran and stored[:2] == ["a", "b"], (stored, ran)
        final = graph.invoke(None, cfg(thread), durability="sync")
        # Resumed where it stopped: every node ran exactly once in all.
        assert final["log"] == ["a", "b", "c"] and ran == ["a", "b", "c"], (final, ran)
    return out


def test_an_immutable_state_db_diverts_the_step_and_replay_resumes_the_graph(home: Path) -> None:
    turnsafe_store.Store(home).close()
    held = []

    def fail():
        cm = immutable(home / "state.db", home / "state.db-wal")
        cm.__enter__()
        held.append(cm)

    def lift():
        held.pop().__exit__(None, None, None)

    out = run_through_a_failure(home, "ro", fail, lift)
    assert out.cause == "disk"


def hold_lock(db: Path, seconds: float) -> subprocess.Popen:
    script = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('ready', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "c.execute('COMMIT')\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_lock_held_past_the_patience_diverts_the_step(home: Path) -> None:
    turnsafe_store.Store(home).close()
    lockers = []

    def fail():
        lockers.append(hold_lock(home / "state.db", 8.0))

    def lift():
        lockers.pop().wait()

    out = run_through_a_failure(home, "locked", fail, lift)
    assert (out.cause, out.action) == ("locked", "divert") and out.attempts > 2


def test_a_postgres_outage_diverts_the_step_and_replay_brings_it_to_the_server(tmp_path: Path, pg) -> None:
    home = tmp_path / "home"
    url = pg.url()

    out = run_through_a_failure(home, "pg-thread", pg.stop_immediate, pg.start_again, db=url, replay_db=url)
    assert out.cause in ("unavailable", "outcome_unknown"), out.to_dict()
    facts = turnsafe_store.doctor(home, db=url)["facts"]
    assert facts["langgraph"]["checkpoints"] >= 4 and facts["langgraph"]["deleted_checkpoints"] == 0, facts
    assert facts["pending_divert_lines"] == {"message": 0, "checkpoint": 0, "write": 0}, facts


def wal_commits(wal: Path) -> tuple:
    """Read from outside the store: the WAL's salts, its checkpoint
    sequence (how often it restarted) and how many transactions its valid
    frames commit (frames whose salts and running checksum hold, a commit
    frame being one that gives the database's size), as SQLite's
    documented WAL format defines them. `(None, None, 0)` without a WAL."""
    data = wal.read_bytes() if wal.exists() else b""
    if len(data) < 32:
        return None, None, 0
    magic, _, page_size, restarts, salt1, salt2, c1, c2 = struct.unpack(">8I", data[:32])
    assert magic in (0x377F0682, 0x377F0683), hex(magic)
    words = (">" if magic & 1 else "<") + "2I"

    def checksum(s0: int, s1: int, chunk: bytes) -> tuple:
        for x0, x1 in struct.iter_unpack(words, chunk):
            s0 = (s0 + x0 + s1) & 0xFFFFFFFF
            s1 = (s1 + x1 + s0) & 0xFFFFFFFF
        return s0, s1

    s = checksum(0, 0, data[:24])
    assert s == (c1, c2), "the WAL header's checksum"
    commits, off = 0, 32
    while off + 24 + page_size <= len(data):
        _, db_size, f1, f2, fc1, fc2 = struct.unpack(">6I", data[off : off + 24])
        if (f1, f2) != (salt1, salt2):
            break
        s = checksum(*checksum(*s, data[off : off + 8]), data[off + 24 : off + 24 + page_size])
        if s != (fc1, fc2):
            break
        commits += db_size != 0
        off += 24 + page_size
    return (salt1, salt2), restarts, commits


def hold_lock_until_told(db: Path) -> subprocess.Popen:
    """Another process holds the write lock of `db` until a line reaches
    its stdin."""
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "c.execute('ROLLBACK')\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", script, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "ready"
    return p


def gated_steps(arrived: dict, gates: dict):
    """a -> b -> c, each adding its name; a and b are async and wait for
    their gate once they have counted their arrival."""

    def node(name):
        async def run(state: State):
            arrived[name] += 1
            if name in gates:
                await gates[name].wait()
            return {"log": [name]}

        return run

    g = StateGraph(State)
    for n in "abc":
        g.add_node(n, node(n))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def test_async_saver_runs_a_graph_and_groups_its_threads(home: Path) -> None:
    """Eight graphs at once on one async saver: what their tasks send
    while the store is busy is committed together. Batches are counted as
    the saver hands them to the store, transactions from the WAL's commit
    frames.

    All eight graphs wait in node a. Another process then holds the write
    lock (well within the policy's patience) while a is let go: each
    graph sends its writes of a and its checkpoint after a, 16 batches,
    and they wait: the first for the lock, the other fifteen queued behind
    it. Once the lock is free they take at most two transactions (the
    first, then everything queued behind it), where one transaction per
    batch would be 16."""
    import asyncio
    import concurrent.futures

    turnsafe_store.Store(home).close()
    wal = home / "state.db-wal"

    async def until(done: Callable[[], bool], what: str) -> None:
        for _ in range(6000):
            if done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never: {what}")

    async def main():
        # The loop's default executor with one worker: the saver must not
        # use it (its calls would reach the store one at a time, and each
        # take a transaction of its own), but the package's own workers.
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        async with AsyncTurnsafeSaver(home) as saver:
            sent = Recorder.around(saver)
            arrived = {"a": 0, "b": 0, "c": 0}
            gates = {"a": asyncio.Event(), "b": asyncio.Event()}
            graph = gated_steps(arrived, gates).compile(checkpointer=saver)
            runs = [
                asyncio.ensure_future(graph.ainvoke({"log": []}, cfg(f"t{k}"), durability="sync")) for k in range(8)
            ]
            await until(lambda: arrived["a"] == 8, "every graph waits in a")
            salts, restarts, commits_in_a = wal_commits(wal)
            sent_in_a = sent.batches
            assert sent.entered == sent_in_a, "nothing in flight while every graph waits in a"
            holder = hold_lock_until_told(home / "state.db")
            try:
                gates["a"].set()
                # Each graph's writes of a and its checkpoint after a are
                # sent together; none can be answered while the lock is held.
                await until(lambda: sent.entered == sent_in_a + 16, "16 batches wait together")
                assert sent.batches == sent_in_a, "nothing answered while the lock is held"
                # The native call queues its batch at once; give it a moment.
                await asyncio.sleep(0.05)
            finally:
                holder.stdin.write("\n")
                holder.stdin.flush()
                holder.wait()
            await until(lambda: arrived["b"] == 8, "every graph waits in b")
            # A graph may reach b while its writes of a are still being
            # answered (LangGraph does not wait on them before the next
            # step): wait for the sixteen answers, never on timing.
            await until(lambda: sent.batches == sent_in_a + 16, "the 16 batches answered")
            assert sent.entered == sent.batches, "nothing else sent while every graph waits in b"
            salts_in_b, restarts_in_b, commits_in_b = wal_commits(wal)
            sent_in_b = sent.batches
            gates["b"].set()
            outs = await asyncio.gather(*runs)
            # Read while the saver is open: its close checkpoints the WAL away.
            _, restarts_at_end, commits_at_end = wal_commits(wal)
            assert all(o["log"] == ["a", "b", "c"] for o in outs)
            for k in range(8):
                state = await graph.aget_state(cfg(f"t{k}"))
                assert state.values["log"] == ["a", "b", "c"]
                assert len(sent.thread(f"t{k}")) == 5
            # The WAL never restarted, so its frames hold every commit.
            assert salts is not None and salts_in_b == salts and restarts == restarts_in_b == restarts_at_end == 0
            return (sent_in_b - sent_in_a, commits_in_b - commits_in_a, sent.batches, commits_at_end)

    window_batches, window_commits, batches, commits = asyncio.run(main())
    assert window_batches == 16, window_batches
    assert 1 <= window_commits <= 2, f"16 batches that waited together took {window_commits} transactions"
    # Per graph: five checkpoints, and the writes of the input and of a, b
    # and c: nine batches.
    assert batches == 8 * 9, batches
    assert commits < batches, f"{batches} batches took {commits} transactions"
    facts = turnsafe_store.doctor(home)["facts"]
    assert facts["langgraph"]["checkpoints"] == 8 * 5, facts["langgraph"]


def test_deletes_leave_every_read_and_turnsafe_prune_removes_them(home: Path) -> None:
    ran: list = []
    with TurnsafeSaver(home) as saver:
        graph = three_steps(ran).compile(checkpointer=saver)
        graph.invoke({"log": []}, cfg("gone"))
        graph.invoke({"log": []}, cfg("kept"))
        saver.delete_thread("gone")
        assert saver.get_tuple(cfg("gone")) is None
        assert list(saver.list(cfg("gone"))) == []
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"kept"}
    facts = turnsafe_store.doctor(home)["facts"]["langgraph"]
    assert facts["deleted_checkpoints"] == 5 and facts["checkpoints"] == 5, facts
    pruned = subprocess.run(
        [turnsafe_bin(), "prune", "--home", str(home), "--keep-last", "1000", "--json"], capture_output=True, text=True
    )
    assert pruned.returncode == 0, pruned.stderr
    end = json.loads(pruned.stdout.splitlines()[-1])
    assert end["type"] == "end" and end["data"]["checkpoints_purged"] == 5, end
    assert end["data"]["writes_purged"] > 0 and end["data"]["deleted"] == 0, end
    facts = turnsafe_store.doctor(home)["facts"]["langgraph"]
    assert facts["deleted_checkpoints"] == 0 and facts["deleted_writes"] == 0 and facts["checkpoints"] == 5, facts


def test_encrypted_serializer_passes_through(home: Path) -> None:
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef0123456789abcdef")
    ran: list = []
    with TurnsafeSaver(home, serde=serde) as saver:
        graph = three_steps(ran).compile(checkpointer=saver)
        graph.invoke({"log": ["secret-value"]}, cfg("enc"))
        assert graph.get_state(cfg("enc")).values["log"] == ["secret-value", "a", "b", "c"]
    raw = (home / "state.db").read_bytes() + b"".join(
        p.read_bytes() for p in home.glob("state.db-wal")
    )
    assert b"secret-value" not in raw


FD_CHILD = r'''
import json, operator, sys
from typing import Annotated
from typing_extensions import TypedDict
from langgraph.graph import END, START, StateGraph
import turnsafe_store
from turnsafe_store.langgraph import TurnsafeSaver

from fd_exhaust import exhaust

home, mode = sys.argv[1], sys.argv[2]


class State(TypedDict):
    log: Annotated[list, operator.add]


errno = []
def node(name):
    def run(state):
        if name == "b" and mode == "mid":
            errno.append(exhaust())
        return {"log": [name]}
    return run

g = StateGraph(State)
for n in "abc":
    g.add_node(n, node(n))
g.add_edge(START, "a"); g.add_edge("a", "b"); g.add_edge("b", "c"); g.add_edge("c", END)
config = {"configurable": {"thread_id": "fd"}}
if mode == "before":
    # Everything LangGraph imports lazily is imported by a run without a
    # saver first; the saver then meets the exhaustion alone.
    g.compile().invoke({"log": []}, config)
    errno.append(exhaust())
try:
    saver = TurnsafeSaver(home)
    out = g.compile(checkpointer=saver).invoke({"log": []}, config, durability="sync")
    print(json.dumps({"ran": out["log"], "errno": errno}))
except turnsafe_store.Error as e:
    outcome = getattr(e, "outcome", None)
    print(json.dumps({"error": type(e).__name__, "cause": e.cause, "errno": errno,
                      "receipt": getattr(outcome, "receipt", None),
                      "handed_back": getattr(outcome, "handed_back", None)}))
'''


def run_fd_child(home: Path, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FD_CHILD, str(home), mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fd_exhaustion_mid_graph_costs_no_step(home: Path) -> None:
    """A node leaks every descriptor the child has left: the saver already
    holds its files, so every later checkpoint is committed; counted from
    disk by another process, with nothing diverted."""
    got = run_fd_child(home, "mid")
    assert got["errno"] == [24], got
    assert got["ran"] == ["a", "b", "c"], got
    with TurnsafeSaver(home) as saver:
        tup = saver.get_tuple(cfg("fd"))
        assert tup is not None and tup.checkpoint["channel_values"]["log"] == ["a", "b", "c"]
        assert len(list(saver.list(cfg("fd")))) == 5
    assert not (home / "sessions").exists(), "nothing was diverted"


def test_fd_exhaustion_before_the_saver_opens_stops_the_graph_and_claims_no_copy(home: Path) -> None:
    """No descriptor is left when the graph starts: the store cannot open
    and no divert file can be opened either, so no receipt can exist. The
    run stops at its first read, naming the cause, before any node ran;
    nothing is stored or claimed, and the same run then completes."""
    got = run_fd_child(home, "before")
    assert got["errno"] == [24], got
    assert "ran" not in got and got["cause"] == "disk", got
    assert got["receipt"] is None
    assert not (home / "sessions").exists()
    ran: list = []
    with TurnsafeSaver(home) as saver:
        graph = three_steps(ran).compile(checkpointer=saver)
        assert graph.get_state(cfg("fd")).values == {}
        assert graph.invoke({"log": []}, cfg("fd"))["log"] == ["a", "b", "c"]
