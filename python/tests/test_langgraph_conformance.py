"""LangGraph's own conformance suite for third-party checkpointers
(langgraph-checkpoint-conformance), every capability: the base five (put,
put_writes, get_tuple, list, delete_thread) and the three optional ones
(delete_for_runs, copy_thread, prune).

It runs on AsyncTurnsafeSaver over SQLite and over a real PostgreSQL
server, and on the sync TurnsafeSaver through a thin async adapter (the
suite only calls async methods). Each capability must be detected and
pass every one of its tests; the report is printed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from turnsafe_store.langgraph import AsyncTurnsafeSaver, TurnsafeSaver

EVERY = sorted(c.value for c in ALL_CAPABILITIES)


def run_suite(name: str, factory) -> dict:
    registered = checkpointer_test(name=name)(factory)
    report = asyncio.run(validate(registered))
    report.print_report()
    results = report.to_dict()
    print(json.dumps(results, indent=1, default=str))
    caps = {name: r for name, r in report.results.items()}
    assert sorted(caps) == EVERY, caps
    for cap, r in caps.items():
        assert r.detected, f"{name}: {cap} not detected"
        assert r.passed is True, f"{name}: {cap} failed: {r.failures}"
        assert r.tests_failed == 0 and r.tests_passed > 0, (cap, r)
    assert report.passed_all()
    return results


def test_async_saver_passes_every_capability_over_sqlite(tmp_path: Path) -> None:
    async def factory():
        async with AsyncTurnsafeSaver(tmp_path / "home") as saver:
            yield saver

    run_suite("AsyncTurnsafeSaver-sqlite", factory)


def test_async_saver_passes_every_capability_over_postgres(tmp_path: Path, pg) -> None:
    url = pg.url()

    async def factory():
        async with AsyncTurnsafeSaver(tmp_path / "home", db=url) as saver:
            yield saver

    run_suite("AsyncTurnsafeSaver-postgres", factory)


class SyncAdapter(BaseCheckpointSaver):
    """The sync saver's own methods, awaited in place: what the suite
    checks is then TurnsafeSaver's behaviour, not its executor wrappers."""

    def __init__(self, inner: TurnsafeSaver) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    async def aget_tuple(self, config):
        return self.inner.get_tuple(config)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        for t in self.inner.list(config, filter=filter, before=before, limit=limit):
            yield t

    async def aput(self, config, checkpoint, metadata, new_versions):
        return self.inner.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path=""):
        return self.inner.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id):
        return self.inner.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids):
        return self.inner.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id, target_thread_id):
        return self.inner.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids, *, strategy: str = "keep_latest"):
        return self.inner.prune(thread_ids, strategy=strategy)

    def get_next_version(self, current: Any, channel: Any = None) -> Any:
        return self.inner.get_next_version(current, channel)


def test_sync_saver_passes_every_capability_through_a_thin_adapter(tmp_path: Path) -> None:
    async def factory():
        with TurnsafeSaver(tmp_path / "home") as saver:
            yield SyncAdapter(saver)

    run_suite("TurnsafeSaver-sqlite", factory)


def test_sync_saver_passes_every_capability_over_postgres(tmp_path: Path, pg) -> None:
    url = pg.url()

    async def factory():
        with TurnsafeSaver(tmp_path / "home", db=url) as saver:
            yield SyncAdapter(saver)

    run_suite("TurnsafeSaver-postgres", factory)
