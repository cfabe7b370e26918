"""Appends awaited on an event loop: handed to the store's committer thread,
the outcome back through a pipe the loop watches, no Python thread between.

Commits are counted from the WAL file itself and threads from the
interpreter, never from the package's own counters."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import turnsafe_store
from turnsafe_store import Store, _aio
from turnsafe_store.agents import TurnsafeSession

from test_agents import hold_lock
from test_store import wal_commits


def batch(tag: str, n: int = 3) -> list:
    return [{"role": "user", "content": f"{tag} says {j}"} for j in range(n)]


def test_sessions_in_flight_share_commits(home):
    """16 sessions' batches sent while a commit waits go together."""

    async def main():
        store = Store(home)
        sessions = [TurnsafeSession(f"s{k}", home, store=store) for k in range(16)]
        await sessions[0].add_items(batch("warm", 1))
        db = str(home / "state.db")
        before = wal_commits(db)
        locker = hold_lock(home / "state.db", 0.3)
        try:
            await asyncio.gather(*(s.add_items(batch(f"s{k}")) for k, s in enumerate(sessions)))
        finally:
            locker.wait()
        commits = wal_commits(db) - before
        assert 1 <= commits <= 3, f"16 batches took {commits} commits"
        for k, s in enumerate(sessions):
            expected = batch(f"s{k}") if k else batch("warm", 1) + batch("s0")
            assert await s.get_items() == expected
        store.close()

    asyncio.run(main())


CHILD = r"""
import asyncio, json, sys, threading
import turnsafe_store
from turnsafe_store import Store, _aio
from turnsafe_store.agents import TurnsafeSession

async def main():
    store = Store(sys.argv[1])
    sessions = [TurnsafeSession(f"s{k}", sys.argv[1], store=store) for k in range(4)]
    for b in range(25):
        await asyncio.gather(*(s.add_items([{"role": "user", "content": f"{k} {b}"}]) for k, s in enumerate(sessions)))
    got = await asyncio.gather(*(s.get_items(limit=2) for s in sessions))
    assert got == [[{"role": "user", "content": f"{k} {b}"} for b in (23, 24)] for k in range(4)], got
    assert await sessions[0].pop_item() == {"role": "user", "content": "0 24"}
    await sessions[1].add_items([{"role": "user", "content": "extra"}])
    await sessions[1].clear_session()
    assert await sessions[1].get_items() == []
    assert await sessions[1].pop_item() is None
    names = sorted(t.name for t in threading.enumerate())
    print(json.dumps({"threads": names, "executor": _aio._executor is not None}))
    store.close()

asyncio.run(main())
"""


def test_appends_reads_and_edits_take_no_python_thread(home):
    """Only the interpreter's main thread and the store's native committer
    exist after appends, reads, pops and a clear: no worker pool was
    started for them."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(home)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {"threads": ["MainThread"], "executor": False}, seen
    store = Store(home)
    assert [len(store.show(f"s{k}")) for k in range(4)] == [24, 0, 25, 25]


def test_a_cancelled_append_still_settles_and_the_loop_goes_on(home):
    async def main():
        store = Store(home)
        s = TurnsafeSession("c", home, store=store)
        await s.add_items(batch("first", 1))
        locker = hold_lock(home / "state.db", 0.5)
        task = asyncio.create_task(s.add_items(batch("cancelled")))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        locker.wait()
        # The batch was handed over before the cancel: it is committed once
        # the lock is free, and the next one lands after it.
        await s.add_items(batch("next", 1))
        assert await s.get_items() == batch("first", 1) + batch("cancelled") + batch("next", 1)
        store.close()

    asyncio.run(main())


def test_loops_on_several_threads_share_one_store(home):
    store = Store(home)
    errors = []

    def run(t: int) -> None:
        async def main():
            s = TurnsafeSession(f"t{t}", home, store=store)
            for b in range(20):
                await s.add_items(batch(f"t{t} b{b}", 2))

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for t in range(4):
        assert len(store.show(f"t{t}")) == 40
    store.close()


def test_closing_the_store_settles_what_was_handed_over(home):
    """close() returns only after every batch handed over is committed; the
    futures of those batches are resolved, none is left waiting."""

    async def main():
        store = Store(home)
        s = [TurnsafeSession(f"k{k}", home, store=store) for k in range(5)]
        await s[0].add_items(batch("warm", 1))
        locker = hold_lock(home / "state.db", 0.4)
        pending = [asyncio.ensure_future(x.add_items(batch(f"k{k}"))) for k, x in enumerate(s)]
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, store.close)
        assert store.closed
        results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 10)
        locker.wait()
        return results

    results = asyncio.run(main())
    assert results == [None] * 5, results
    store = Store(home)
    assert [len(store.show(f"k{k}")) for k in range(5)] == [4, 3, 3, 3, 3]
    store.close()


def test_a_read_sees_every_batch_handed_over_before_it(home):
    """Reads queue behind the batches sent before them, so a read started
    right after appends (not awaited yet) sees them stored."""

    async def main():
        store = Store(home)
        locker = hold_lock(home / "state.db", 0.3)
        try:
            sent = [_aio.append(store, "r", batch(f"b{b}", 2)) for b in range(5)]
            seen = _aio.show(store, "r")
            rows = await seen
            outs = await asyncio.gather(*sent)
        finally:
            locker.wait()
        assert all(o.persisted for o in outs)
        assert rows == [m for b in range(5) for m in batch(f"b{b}", 2)]
        store.close()

    asyncio.run(main())


def test_read_and_edit_failures_raise_error_with_the_cause(home):
    """The store's own errors arrive as exceptions of the awaiting task."""

    async def main():
        store = Store(home, holder="me", lease_ttl=60)
        assert (await _aio.append(store, "e", batch("x", 1))).persisted
        with pytest.raises(ValueError):
            await _aio.show(store, "e", limit=-1)
        # Another holder's live lease: this store's edit is fenced.
        other = Store(home, holder="other", lease_ttl=60)
        with pytest.raises(turnsafe_store.Error) as e:
            await _aio.pop(other, "e")
        assert e.value.cause == "turn_lease", e.value
        with pytest.raises(turnsafe_store.Error) as e:
            await _aio.clear(other, "e")
        assert e.value.cause == "turn_lease", e.value
        assert await _aio.show(other, "e") == batch("x", 1)
        other.close()
        store.close()

    asyncio.run(main())


def test_bad_input_raises_at_the_call_and_queues_nothing(home):
    async def main():
        store = Store(home)
        with pytest.raises(TypeError):
            await _aio.append(store, "s", [{"role": "user", "content": object()}])
        with pytest.raises(TypeError):
            await _aio.append(store, "s", "not a list")
        with pytest.raises(turnsafe_store.InvalidSessionId):
            await _aio.append(store, "bad id", batch("x", 1))
        out = await _aio.append(store, "s", batch("good", 1))
        assert out.persisted
        assert store.show("s") == batch("good", 1)
        store.close()
        with pytest.raises(turnsafe_store.Error, match="closed"):
            await _aio.append(store, "s", batch("after close", 1))

    asyncio.run(main())


def test_a_loop_that_cannot_watch_descriptors_uses_the_workers(home, monkeypatch):
    """Every call runs on the package's worker threads, watched through a
    counter this test puts around `ThreadPoolExecutor.submit` (the
    standard library's, not the package's code): each call the loop awaits
    ran on a `turnsafe-store` worker, never on the loop's thread, and what
    the loop got is exactly what that worker returned or raised. An edit
    fenced by another holder's turn lease fails there with `turn_lease`."""
    ran = []  # (thread name, what the call returned or raised)
    submit = ThreadPoolExecutor.submit

    def counted(self, fn, /, *args, **kwargs):
        def run():
            name = threading.current_thread().name
            try:
                value = fn(*args, **kwargs)
            except BaseException as e:
                ran.append((name, e))
                raise
            ran.append((name, value))
            return value

        return submit(self, run)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", counted)

    class NoReaders(asyncio.SelectorEventLoop):
        def add_reader(self, *a, **k):
            raise NotImplementedError

    async def main():
        store = Store(home, holder="me", lease_ttl=60)
        other = Store(home, holder="other", lease_ttl=60)
        try:
            got = [await _aio.append(store, "s", batch(f"b{b}", 1)) for b in range(3)]
            assert all(o.persisted for o in got)
            with pytest.raises(turnsafe_store.Error) as fenced:
                await _aio.pop(other, "s")
            got.append(fenced.value)
            assert len(store.show("s")) == 3
            return got
        finally:
            other.close()
            store.close()

    loop = NoReaders()
    try:
        got = loop.run_until_complete(main())
    finally:
        loop.close()
    assert got[3].cause == "turn_lease", got[3]
    assert len(ran) == 4, ran
    names = [name for name, _ in ran]
    assert all(n.startswith("turnsafe-store") for n in names), names
    assert threading.main_thread().name not in names
    assert all(value is mine for (_, value), mine in zip(ran, got)), (ran, got)


def test_a_forked_child_gets_its_own_completions(home):
    """A parent whose store has a committer thread and a pipe on its loop
    forks: the child's appends go through a store and a pipe of its own
    (its loop is new), the parent's go on, and every row is there once."""
    store = Store(home)

    async def parent(tag):
        s = TurnsafeSession("parent", home, store=store)
        await s.add_items(batch(tag, 2))

    asyncio.run(parent("before"))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:

            async def child():
                s = TurnsafeSession("child", home, store=store)
                for b in range(5):
                    await s.add_items(batch(f"child {b}", 2))

            asyncio.run(child())
            code = 0
        finally:
            os._exit(code)
    asyncio.run(parent("meanwhile"))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    asyncio.run(parent("after"))
    assert len(store.show("parent")) == 6
    assert len(store.show("child")) == 10
    store.close()


EXIT_CHILD = r"""
import asyncio, ctypes, sys
from turnsafe_store import Store
from turnsafe_store.agents import TurnsafeSession

home = sys.argv[1]

async def main():
    store = Store(home)
    s = TurnsafeSession("exit", home, store=store)
    # A reference nothing gives back (as a C extension or a daemon
    # thread's frame may hold one): the store is never freed, so only the
    # exit itself can wait for the batch.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(store))
    task = asyncio.ensure_future(s.add_items([{"role": "user", "content": f"m{i}"} for i in range(3)]))
    await asyncio.sleep(0.05)
    task.cancel()
    print("cancelled", flush=True)

asyncio.run(main())
"""


def test_the_interpreter_exit_waits_for_batches_handed_over(home):
    """A batch whose waiter was cancelled while a lock held it is stored
    before the process ends, though the program exits at once."""
    Store(home).close()
    locker = hold_lock(home / "state.db", 2.5)
    out = subprocess.run([sys.executable, "-c", EXIT_CHILD, str(home)], capture_output=True, text=True, timeout=60)
    locker.wait()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cancelled"
    store = Store(home)
    assert store.show("exit") == [{"role": "user", "content": f"m{i}"} for i in range(3)]
    store.close()
