"""Store calls awaited on an asyncio event loop.

Appends, reads and edits are handed to the store's own committer thread,
and each answer comes back through a pipe the loop watches
(``Completions``): the loop converts the batch, queues it and goes on; the
work runs without the GIL; the answer wakes the loop. No Python thread
takes part, so a call costs the loop two wake-ups and no GIL hand-offs;
batches from every task in flight share group commits, and a read runs
after everything handed over before it. Work handed over is done even if
its waiter is cancelled, and the interpreter's exit waits for it.

On a loop that cannot watch a descriptor, or when no descriptor is left
for the pipe, calls run on the package's own worker threads, never on the loop's default executor (which the
application's own ``asyncio.to_thread`` calls share).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence

from ._native import Completions, Outcome, Store

# Workers for blocking calls. A worker mostly waits for a group commit, so
# there are many: every call in flight reaches the store.
_WORKERS = 64
_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="turnsafe-store")
        return _executor


async def off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking store call on the package's workers."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(), lambda: fn(*args, **kwargs))


class _LoopCompletions:
    """The outcomes due to one event loop, and the futures waiting for them."""

    __slots__ = ("completions", "pending", "next_ticket", "pid", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.completions = Completions()
        self.pending: Dict[int, "asyncio.Future[Outcome]"] = {}
        self.next_ticket = 0
        self.pid = os.getpid()
        loop.add_reader(self.completions.fileno(), self._ready)

    def _ready(self) -> None:
        pending = self.pending
        for ticket, ok, value in self.completions.drain():
            fut = pending.pop(ticket, None)
            # A cancelled waiter gave up on the answer; the work itself was
            # done all the same (a batch committed, diverted or handed back).
            if fut is None or fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)


_loops: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopCompletions]" = weakref.WeakKeyDictionary()
# Loops that cannot watch a descriptor (add_reader): appends go to the workers.
_unwatchable: "weakref.WeakSet[asyncio.AbstractEventLoop]" = weakref.WeakSet()


# Stores with batches handed over: nobody waits for those batches, so the
# interpreter's exit waits for them (as it waits for worker threads).
_handed_over: "weakref.WeakSet[Store]" = weakref.WeakSet()


@atexit.register
def _settle_at_exit() -> None:
    for store in list(_handed_over):
        store._settle()


def _forget_after_fork() -> None:
    # A forked child has none of the parent's threads, and must not read the
    # parent's pipes: it makes its own.
    global _executor
    _executor = None
    _loops.clear()
    _handed_over.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _submit(store: Store, name: str, fallback: Any, *args: Any, **kwargs: Any) -> "asyncio.Future[Any]":
    """Hand ``store.<name>`` over under a new ticket of the running loop;
    ``fallback`` (the blocking call) runs on the workers where the loop
    cannot watch a descriptor. Bad input raises here, before anything is
    queued."""
    loop = asyncio.get_running_loop()
    lane = _loops.get(loop)
    if lane is None or lane.pid != os.getpid():
        if loop in _unwatchable:
            return asyncio.ensure_future(off_loop(fallback, *args, **kwargs))
        try:
            lane = _loops[loop] = _LoopCompletions(loop)
        except NotImplementedError:
            _unwatchable.add(loop)
            return asyncio.ensure_future(off_loop(fallback, *args, **kwargs))
        except OSError:
            # No descriptor for the pipe (the process at its limit): this
            # call goes to the workers, where the store's policy meets the
            # same limit and answers it (a divert, or an error naming the
            # cause); a later call tries the pipe again.
            return asyncio.ensure_future(off_loop(fallback, *args, **kwargs))
    ticket = lane.next_ticket
    lane.next_ticket = ticket + 1
    getattr(store, name)(lane.completions, ticket, *args, **kwargs)
    _handed_over.add(store)
    fut: "asyncio.Future[Any]" = loop.create_future()
    lane.pending[ticket] = fut
    return fut


def append(
    store: Store,
    session_id: str,
    messages: Sequence[Dict[str, Any]],
    *,
    uids: Optional[Sequence[Optional[str]]] = None,
) -> "asyncio.Future[Outcome]":
    """``store.append`` as a future of the running loop."""
    return _submit(store, "_append_then", store.append, session_id, messages, uids=uids)


def show(store: Store, session_id: str, *, limit: Optional[int] = None) -> "asyncio.Future[List[Dict[str, Any]]]":
    """``store.show`` as a future of the running loop."""
    return _submit(store, "_show_then", store.show, session_id, limit=limit)


def pop(store: Store, session_id: str) -> "asyncio.Future[Optional[Dict[str, Any]]]":
    """``store.pop`` as a future of the running loop."""
    return _submit(store, "_pop_then", store.pop, session_id)


def clear(store: Store, session_id: str) -> "asyncio.Future[int]":
    """``store.clear`` as a future of the running loop."""
    return _submit(store, "_clear_then", store.clear, session_id)
