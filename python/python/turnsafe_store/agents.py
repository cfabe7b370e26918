"""A drop-in ``Session`` for the OpenAI Agents SDK, backed by turnsafe.

    from agents import Agent, Runner
    from turnsafe_store.agents import TurnsafeSession

    session = TurnsafeSession("user-42", "~/.myagent")
    result = await Runner.run(agent, "Hello", session=session)

    # PostgreSQL; the divert folder stays under the home:
    session = TurnsafeSession("user-42", "~/.myagent", db=os.environ["MY_DB_URL"])

It implements the SDK's ``Session`` protocol and nothing more. Every batch
``add_items`` writes ends committed, in a durable divert copy with a
receipt, or handed back; when it is not committed, ``add_items`` raises
:class:`turnsafe_store.TurnNotPersisted` carrying the outcome (cause,
action, receipt, capture, copy), and the run ends with that exception.

Adding the same items again after that failure reuses the uids of the
failed attempt, so a later ``turnsafe_store.replay`` and the resend store
each item once. Nothing blocks the event loop and no Python thread takes
part: every call is handed to the store's committer thread, which works
without the GIL, and its answer wakes the loop through a pipe; batches that
sessions send at the same time are committed together, one sync for all
of them, and a read runs after everything handed over before it.

Needs the SDK: ``pip install "turnsafe-store[agents]"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import defaultdict, deque
from typing import Any, Deque, Dict, List, Optional, Tuple, Union

from ._compaction import AtomicCompaction

try:
    from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
except ImportError as e:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        'turnsafe_store.agents needs the OpenAI Agents SDK: pip install "turnsafe-store[agents]"'
    ) from e

from . import _aio
from ._errors import TurnNotPersisted
from ._native import Store

__all__ = ["TurnsafeSession", "safe_session_id"]

_VALID = re.compile(r"^(?!\.)(?!.*\.\.)[A-Za-z0-9_.:-]{1,128}$")


def safe_session_id(session_id: str) -> str:
    """The turnsafe session id for an SDK session id.

    A valid turnsafe id (1 to 128 bytes of ASCII letters, digits, ``-``,
    ``_``, ``.``, ``:``; no leading ``.``, no ``..``) is used as it is. Any
    other string maps to a stable id: a readable prefix of its safe
    characters and a hash of the whole string, e.g. ``"user 42/ü"`` ->
    ``"user_42_-h3b1c…"``.
    """
    if _VALID.match(session_id):
        return session_id
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    prefix = re.sub(r"[^A-Za-z0-9_-]", "_", session_id)[:48].lstrip(".")
    return f"{prefix}-h{digest}" if prefix else f"h{digest}"


_stores: Dict[Tuple[str, Optional[str]], Store] = {}
_stores_lock = threading.Lock()


def _store_for(home: Union[str, "os.PathLike[str]"], db: Optional[str] = None) -> Store:
    """One store per home and database in a process, shared by every
    session on them: one connection, one turn-lease holder. With ``db``
    None, ``TURNSAFE_DB`` (read now) picks the database, as ``Store`` does."""
    path = os.path.realpath(os.path.expanduser(os.fspath(home)))
    target = db if db is not None else (os.environ.get("TURNSAFE_DB") or None)
    key = (path, target)
    with _stores_lock:
        store = _stores.get(key)
        if store is None or store.closed:
            store = _stores[key] = Store(path) if target is None else Store(path, db=target)
        return store


def _fingerprint(item: Any) -> Optional[str]:
    try:
        return json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


class TurnsafeSession(AtomicCompaction):
    """The SDK's ``Session`` protocol on a turnsafe home.

    ``session_id`` is the SDK's id as given (any string, kept for display);
    ``turnsafe_id`` is the id it is stored under (see :func:`safe_session_id`).
    Sessions on one home (and one ``db``) share one
    :class:`turnsafe_store.Store` unless ``store`` is given.

    ``db`` is a PostgreSQL URL (``postgres://user@host:port/db?sslmode=require``;
    several ``host:port`` with ``target_session_attrs=read-write`` for
    failover): the items go to that server, and the divert folder stays
    under ``home`` (``home/sessions/``), so a server that cannot be reached
    costs no turn. With ``db`` None, ``TURNSAFE_DB`` is used when set and
    not empty, else SQLite at ``home/state.db``.
    """

    session_settings: Optional[SessionSettings] = None

    def __init__(
        self,
        session_id: str,
        home: Union[str, "os.PathLike[str]"],
        *,
        db: Optional[str] = None,
        session_settings: Optional[Union[SessionSettings, Dict[str, Any]]] = None,
        store: Optional[Store] = None,
    ) -> None:
        if store is not None and db is not None:
            raise ValueError("give `db` or `store`, not both: a given store already has its database")
        self.session_id = session_id
        self.turnsafe_id = safe_session_id(session_id)
        self.session_settings = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        self.store = store if store is not None else _store_for(home, db)
        # Uids of items whose batch was not persisted, by content, oldest first.
        self._unsettled: Dict[str, Deque[str]] = defaultdict(deque)
        self._lock = threading.Lock()

    async def get_items(self, limit: Optional[int] = None) -> List[Any]:
        """The newest ``limit`` items (all with None; ``session_settings.limit``
        when not given) in chronological order, exactly as they were added."""
        n = resolve_session_limit(limit, self.session_settings)
        if n is not None and n < 0:
            n = None  # as SQLite's LIMIT -1: no limit
        return await _aio.show(self.store, self.turnsafe_id, limit=n)

    async def add_items(self, items: List[Any]) -> None:
        """Append one batch. Raises ``TurnNotPersisted`` (with ``.outcome``)
        unless every item was committed."""
        if not items:
            return
        items = list(items)
        prints: Optional[List[Optional[str]]] = None
        uids: Optional[List[Optional[str]]] = None
        with self._lock:
            # Only a resend after a failure can reuse uids: with nothing
            # unsettled, no item needs its fingerprint.
            if self._unsettled:
                prints = [_fingerprint(i) for i in items]
                uids = [self._take_unsettled(p) for p in prints]
        outcome = await _aio.append(self.store, self.turnsafe_id, items, uids=uids)
        if outcome.persisted:
            return
        if prints is None:
            prints = [_fingerprint(i) for i in items]
        with self._lock:
            for p, uid in zip(prints, outcome.uids):
                if p is not None:
                    self._unsettled[p].append(uid)
        raise TurnNotPersisted(outcome)

    def _take_unsettled(self, fingerprint: Optional[str]) -> Optional[str]:
        if fingerprint is None:
            return None
        q = self._unsettled.get(fingerprint)
        if not q:
            return None
        uid = q.popleft()
        if not q:
            del self._unsettled[fingerprint]
        return uid

    async def pop_item(self) -> Optional[Any]:
        """Remove and return the newest item (None when there is none).
        Raises ``turnsafe_store.Error`` with the policy's ``cause`` on failure."""
        return await _aio.pop(self.store, self.turnsafe_id)

    async def clear_session(self) -> None:
        """Remove every item; pending divert lines of the session are settled
        as ``cleared``. Raises ``turnsafe_store.Error`` with the cause on failure."""
        await _aio.clear(self.store, self.turnsafe_id)
        with self._lock:
            self._unsettled.clear()

    def close(self) -> None:
        """Give back this session's turn lease (the shared store stays open)."""
        self.store.release(self.turnsafe_id)

    def __repr__(self) -> str:
        return f"TurnsafeSession({self.session_id!r}, turnsafe_id={self.turnsafe_id!r})"
