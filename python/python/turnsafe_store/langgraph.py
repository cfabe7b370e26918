"""LangGraph checkpointers over turnsafe's store.

    >>> from langgraph.graph import StateGraph
    >>> from turnsafe_store.langgraph import TurnsafeSaver
    >>> with TurnsafeSaver("~/.myagent") as saver:
    ...     graph = builder.compile(checkpointer=saver)
    ...     graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

:class:`TurnsafeSaver` (sync) and :class:`AsyncTurnsafeSaver` (async) keep
checkpoints and pending writes in ``<home>/state.db`` (or PostgreSQL with
``db=``), written through the same flush machine as a turn's messages: a
checkpoint or a task's writes that cannot be stored is diverted to
``<home>/sessions/<thread's safe id>.jsonl`` with a receipt, and
``put``/``put_writes`` raise :class:`turnsafe_store.TurnNotPersisted`,
whose ``outcome`` says where it went. ``turnsafe replay`` brings it back
(idempotently), after which the graph resumes where it stopped.

They follow LangGraph's conventions: ``list`` newest first with ``filter``,
``before`` and ``limit``; pending writes in ``(task_path, task_id, idx)``
order; special writes (errors, interrupts) under their negative indices;
``checkpoint_ns``; string channel versions; the serializer passed through
(``EncryptedSerializer`` works). ``delete_thread``, ``delete_for_runs``,
``copy_thread`` and ``prune`` are implemented; deletes mark rows, every
read leaves them out, and ``turnsafe prune`` removes them for good.

Install with ``pip install "turnsafe-store[langgraph]"``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Optional

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from ._aio import off_loop
from ._errors import TurnNotPersisted
from ._native import Store

__all__ = ["AsyncTurnsafeSaver", "TurnsafeSaver"]


def _thread(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


class _Saver(BaseCheckpointSaver[str]):
    """What the sync and async savers share: the store and the mapping
    between LangGraph's values and the store's records."""

    def __init__(
        self,
        home: Any,
        *,
        db: Optional[str] = None,
        serde: Optional[SerializerProtocol] = None,
        synchronous: str = "full",
        holder: Optional[str] = None,
        lease_ttl: float = 30.0,
    ) -> None:
        super().__init__(serde=serde)
        self.store = Store(home, db=db, synchronous=synchronous, holder=holder, lease_ttl=lease_ttl)

    # -- lifetime -------------------------------------------------------

    def close(self) -> None:
        """Close the store (what was handed over is stored first)."""
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the sync API ---------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        thread_id = _thread(config)
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        rows = self.store._lg_read(
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=get_checkpoint_id(config),
            limit=1,
        )
        return self._tuple(rows[0]) if rows else None

    def list(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        configurable = config.get("configurable", {}) if config else {}
        thread_id = configurable.get("thread_id")
        rows = self.store._lg_read(
            thread_id=None if thread_id is None else str(thread_id),
            checkpoint_ns=configurable.get("checkpoint_ns"),
            checkpoint_id=configurable.get("checkpoint_id"),
            before=get_checkpoint_id(before) if before is not None else None,
            filter=json.dumps(filter) if filter else None,
            limit=limit,
        )
        for row in rows:
            yield self._tuple(row)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id = _thread(config)
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        type_, blob = self.serde.dumps_typed(checkpoint)
        meta = json.dumps(get_checkpoint_metadata(config, metadata), ensure_ascii=False, default=str)
        outcome = self.store._lg_put_checkpoint(
            thread_id,
            checkpoint_ns,
            checkpoint["id"],
            config["configurable"].get("checkpoint_id"),
            type_,
            blob,
            meta,
        )
        if not outcome.persisted:
            raise TurnNotPersisted(outcome)
        return {
            "configurable": {
                "thread_id": config["configurable"]["thread_id"],
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        records = []
        for idx, (channel, value) in enumerate(writes):
            type_, blob = self.serde.dumps_typed(value)
            records.append((WRITES_IDX_MAP.get(channel, idx), channel, type_, blob))
        outcome = self.store._lg_put_writes(
            _thread(config),
            str(config["configurable"].get("checkpoint_ns", "")),
            str(config["configurable"]["checkpoint_id"]),
            task_id,
            task_path,
            records,
        )
        if not outcome.persisted:
            raise TurnNotPersisted(outcome)

    def delete_thread(self, thread_id: str) -> None:
        self.store._lg_edit("delete_thread", [str(thread_id)])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(r) for r in run_ids]
        if runs:
            self.store._lg_edit("delete_for_runs", [], runs)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.store._lg_edit("copy_thread", [str(source_thread_id), str(target_thread_id)])

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f'strategy must be "keep_latest" or "delete", not {strategy!r}')
        threads = [str(t) for t in thread_ids]
        if threads:
            kind = "prune_keep_latest" if strategy == "keep_latest" else "prune_delete"
            self.store._lg_edit(kind, threads)

    def get_next_version(self, current: Optional[str], channel: None = None) -> str:
        """String versions, increasing: ``<counter, 32 digits>.<random>``,
        as LangGraph's own savers make them."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- the async API: the same calls, off the event loop ----------------

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # The package's own workers, never the loop's default executor: that
        # one is sized for the application's own `to_thread` calls (6
        # threads on 2 cores), which left most of 16 tasks' checkpoints
        # waiting outside the store instead of sharing its group commits.
        return await off_loop(fn, *args, **kwargs)

    async def aget_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        return await self._run(self.get_tuple, config)

    async def alist(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await self._run(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._run(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._run(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._run(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._run(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._run(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._run(self.prune, thread_ids, strategy=strategy)

    # -- rows to LangGraph's tuples --------------------------------------

    def _tuple(self, row: tuple) -> CheckpointTuple:
        thread_id, checkpoint_ns, checkpoint_id, parent_id, type_, blob, metadata, writes = row
        pending = [(task_id, channel, self.serde.loads_typed((wtype, value))) for task_id, channel, wtype, value, _, _ in writes]
        return CheckpointTuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}},
            self.serde.loads_typed((type_, blob)),
            json.loads(metadata),
            (
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": parent_id}}
                if parent_id
                else None
            ),
            pending,
        )


class TurnsafeSaver(_Saver):
    """A sync LangGraph checkpointer over turnsafe's store.

    ``TurnsafeSaver(home, *, db=None, serde=None, synchronous="full",
    holder=None, lease_ttl=30.0)``: ``home`` holds ``state.db`` and the
    divert folder; ``db`` (or ``TURNSAFE_DB``) a PostgreSQL URL instead of
    ``state.db``. Safe to share between threads: their checkpoints are
    committed together. The async methods run the same calls on the
    package's own worker threads (never the event loop's default executor).
    """


class AsyncTurnsafeSaver(_Saver):
    """The async twin of :class:`TurnsafeSaver` (same arguments): ``aput``,
    ``aget_tuple``, ``alist`` and the rest run off the event loop, and what
    several tasks send at once is committed together. Use it with
    ``async with`` or call :meth:`aclose`."""

    async def aclose(self) -> None:
        await self._run(self.close)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
