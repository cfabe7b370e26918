"""The Agents SDK's atomic compaction hooks for :class:`TurnsafeSession`.

Without them, ``OpenAIResponsesCompactionSession`` compacts by clearing the
session and adding the compacted items: two transactions, with a window in
which the history is empty and a failure in between that loses it. With
them, each replacement is one transaction of the store, and nothing is
deleted: the replaced items go to the archive (reason ``compaction``),
where ``Store.show(session, archived=True)`` lists them and
``Store.restore(session, reason="compaction")`` brings them back.

- ``_get_compaction_snapshot(limit, *, prune_prefix=None)`` returns the
  SDK's ``_CompactionSnapshot(items, complete, replace_suffix)``, as
  ``SQLiteSession`` does. ``replace_suffix(start, output)`` archives the
  stored items from ``start`` on and inserts ``output`` in one
  transaction; it returns ``False`` (and changes nothing) when the stored
  suffix is no longer the one read, and raises ``turnsafe_store.Error``
  when storage fails. With ``prune_prefix`` (``EncryptedSession`` passes
  one), the expired items before the suffix are archived in the same
  transaction; which items have expired is decided from a read made just
  before it.
- ``_atomic_replace_items(items)`` replaces the whole history in one
  transaction, for manual ``run_compaction()``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List, Optional


class AtomicCompaction:
    """Mixed into ``TurnsafeSession``: needs ``self.store`` and ``self.turnsafe_id``."""

    store: Any
    turnsafe_id: str

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Optional[Callable[[Any], bool]] = None,
    ) -> Any:
        try:
            from agents.memory.session import _CompactionSnapshot
        except ImportError:  # an SDK without snapshots: the SDK then never asks
            return None
        if limit <= 0:
            return None
        store, session = self.store, self.turnsafe_id
        # One row more than asked says whether older history exists.
        rows = await asyncio.to_thread(store.rows, session, limit=limit + 1)
        complete = len(rows) <= limit
        rows = rows[-limit:]
        items = [r["message"] for r in rows]

        async def replace_suffix(start: int, output: List[Any]) -> bool:
            expected = rows[start:]
            if not expected:
                return False
            start_seq = expected[0]["seq"]
            expected_uids = [r["uid"] for r in expected]
            prune_before = None
            if prune_prefix is not None:
                prune_before = await asyncio.to_thread(_expired_until, store, session, start_seq, prune_prefix)
            return await asyncio.to_thread(
                store.replace_suffix,
                session,
                start_seq,
                list(output),
                expected_uids=expected_uids,
                prune_before=prune_before,
            )

        return _CompactionSnapshot(items, complete, replace_suffix)

    async def _atomic_replace_items(self, items: List[Any]) -> bool:
        store, session = self.store, self.turnsafe_id

        def replace() -> bool:
            first = store.rows(session, limit=None)
            start_seq = first[0]["seq"] if first else 1
            return store.replace_suffix(session, start_seq, list(items))

        return await asyncio.to_thread(replace)


def _expired_until(store: Any, session: str, before_seq: int, expired: Callable[[Any], bool]) -> Optional[int]:
    """The seq before which every stored item has expired (oldest first,
    up to the first that has not), or None when the oldest has not."""
    rows = [r for r in store.rows(session, limit=None) if r["seq"] < before_seq]
    until = None
    for r in rows:
        if not expired(r["message"]):
            break
        until = r["seq"] + 1
    return until
