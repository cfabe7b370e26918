"""Store calls awaited on an asyncio event loop.

An append is handed to the store's own committer thread and its outcome
comes back through a pipe the loop watches (``Completions``): the loop
converts the batch, queues it and goes on; the commit runs without the GIL;
the outcome wakes the loop. No Python thread takes part, so a batch costs
the loop two wake-ups and no GIL hand-offs, and batches from every task in
flight share group commits. A batch handed over settles even if its waiter
is cancelled, and the interpreter's exit waits for it to settle.

Other blocking calls (reads, edits), and appends on a loop that cannot
watch a descriptor, run on the package's own worker threads, never on the
loop's default executor (which the application's own ``asyncio.to_thread``
calls share).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Optional, Sequence

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
        for ticket, outcome in self.completions.drain():
            fut = pending.pop(ticket, None)
            # A cancelled waiter gave up on the outcome; the batch itself
            # settled all the same (committed, diverted, or handed back).
            if fut is not None and not fut.done():
                fut.set_result(outcome)


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


def append(
    store: Store,
    session_id: str,
    messages: Sequence[Dict[str, Any]],
    *,
    uids: Optional[Sequence[Optional[str]]] = None,
) -> "asyncio.Future[Outcome]":
    """``store.append`` as a future of the running loop. Bad input raises
    here, before anything is queued."""
    loop = asyncio.get_running_loop()
    lane = _loops.get(loop)
    if lane is None or lane.pid != os.getpid():
        if loop in _unwatchable:
            return asyncio.ensure_future(off_loop(store.append, session_id, messages, uids=uids))
        try:
            lane = _loops[loop] = _LoopCompletions(loop)
        except NotImplementedError:
            _unwatchable.add(loop)
            return asyncio.ensure_future(off_loop(store.append, session_id, messages, uids=uids))
    ticket = lane.next_ticket
    lane.next_ticket = ticket + 1
    store._append_then(lane.completions, ticket, session_id, messages, uids=uids)
    _handed_over.add(store)
    fut: "asyncio.Future[Outcome]" = loop.create_future()
    lane.pending[ticket] = fut
    return fut
