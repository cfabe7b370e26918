"""A Pydantic AI ``ConversationStore`` over turnsafe's store.

    >>> from pydantic_ai import Agent
    >>> from pydantic_ai.conversation import Conversation
    >>> from turnsafe_store.pydantic_ai import TurnsafeConversationStore
    >>> store = TurnsafeConversationStore("~/.myagent")
    >>> conversation = await store.load("c-1") or Conversation(conversation_id="c-1")
    >>> result = await agent.run("Hello", conversation=conversation)
    >>> await store.save(result)

:class:`TurnsafeConversationStore` implements the five primitives of
``pydantic_ai.conversation_store.ConversationStore`` (``read_record``,
``read_records``, ``write_record``, ``delete_record``, ``read_entry``, and
``read_history`` in one read per session a history spans), so Pydantic AI's
own ``load``, ``save``, ``branch``, ``fork``, ``list_conversations`` and
``delete`` work on it unchanged.

Each conversation is a turnsafe session (see :func:`conversation_session_id`):
its entries and its record are rows of that session's transcript, and a
``write_record`` is one batch through the flush machine, so its entries and
its record are committed together, diverted together with a receipt, or
handed back together. A write that is not committed raises
:class:`turnsafe_store.TurnNotPersisted` with the outcome; ``turnsafe
replay`` brings a diverted one in later, once. The revision check is the
database's unique key on ``(session, uid)``: every write claims the uid
``pai-after:<the revision it replaces>``, so of two writers that loaded the
same revision exactly one is stored and the other gets
``ConversationConflict``, across processes, with nothing stored for it.

``delete`` leaves a tombstone row: the conversation no longer loads or
lists, and its entries stay stored (forks may share them, and a copy loaded
before the delete can never be saved over a new conversation with the same
id). ``turnsafe`` erases a session for good (``Store.delete_session``).

Messages are kept as ``ModelMessagesTypeAdapter`` JSON, one message per
row, so every part kind comes back as Pydantic AI's own adapter brings it
back. The data model is in ``docs/PYDANTIC_AI.md``.

Install with ``pip install "turnsafe-store[pydantic-ai]"``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Dict, List, Optional, Tuple, Union

try:
    from pydantic import TypeAdapter
    from pydantic_ai.conversation_store import (
        ConversationConflict,
        ConversationEntry,
        ConversationRecord,
        ConversationStore,
    )
    from pydantic_ai.messages import ModelMessagesTypeAdapter
except ImportError as e:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        'turnsafe_store.pydantic_ai needs Pydantic AI 2.68: pip install "turnsafe-store[pydantic-ai]"'
    ) from e

from . import _aio
from ._errors import TurnNotPersisted
from ._native import Store

__all__ = ["TurnsafeConversationStore", "conversation_session_id"]

# The key every row of this adapter carries its own fields under.
_KEY = "pydantic_ai"
# The LangGraph thread and namespace of the directory of conversations
# (one checkpoint per conversation and scope), which `read_records` lists.
DIRECTORY_THREAD = "pydantic-ai-conversations"
DIRECTORY_NS = "pydantic_ai:conversation"
# How many of a session's newest rows `read_record` reads when the newest
# row is not a record (a write's record is its batch's last row, so the
# newest row nearly always is), before it reads them all.
_TAIL = 16
# Conversations whose last seen record this store remembers.
_SEEN_MAX = 4096
# Entry locations remembered (entry id -> session), for `read_history`.
_WHERE_MAX = 1 << 16

_records = TypeAdapter(ConversationRecord)
_TOKEN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def conversation_session_id(conversation_id: str) -> str:
    """The turnsafe session a conversation is stored under:
    ``pai-<readable prefix>-h<32 hex digits of sha256(conversation_id)>``.
    The same id gives the same session in every process; the prefix (at
    most 40 of its characters, any other than letters, digits, ``_`` and
    ``-`` as ``_``) is for a person reading ``turnsafe show``."""
    digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    prefix = re.sub(r"[^A-Za-z0-9_-]", "_", conversation_id)[:40]
    return f"pai-{prefix}-h{digest}" if prefix else f"pai-h{digest}"


def _token(value: Optional[str]) -> str:
    """A revision (or ``None``) as it appears in a uid: itself when it is
    short and plain, else a hash of it."""
    if value is None:
        return "none"
    if _TOKEN.match(value):
        return value
    return "h" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _text_of(message: Any) -> Optional[str]:
    """The text of a message's parts, for `turnsafe search` and `show`."""
    texts: List[str] = []
    for part in getattr(message, "parts", ()):
        content = getattr(part, "content", None)
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(c for c in content if isinstance(c, str))
        elif getattr(part, "part_kind", None) == "tool-call":
            texts.append(f"{part.tool_name}({part.args_as_json_str()})")
    return "\n".join(texts) if texts else None


class _Tail:
    """What a conversation's newest record row says: its record (``None``
    when the conversation has none or was deleted), and the revision a new
    write replaces (``after``: the record's, a tombstone's, or ``None``)."""

    __slots__ = ("record", "after", "payload")

    def __init__(self, record: Optional[ConversationRecord], after: Optional[str], payload: Optional[Dict[str, Any]]):
        self.record = record
        self.after = after
        self.payload = payload


class TurnsafeConversationStore(ConversationStore):
    """Pydantic AI's ``ConversationStore`` on a turnsafe home.

    ``TurnsafeConversationStore(home, *, db=None, synchronous="full",
    lease_ttl=0.001, store=None)``: ``home`` holds ``state.db`` and the
    divert folder; ``db`` (or ``TURNSAFE_DB``) names a PostgreSQL server
    instead of ``state.db``. ``lease_ttl`` is the store's turn lease on a
    conversation: the revision check (the uid every write claims) is what
    fences writers here, so the lease is kept to a millisecond and a
    conversation moves freely between processes from one save to the next
    (a write refused by another writer's live lease is a
    ``ConversationConflict``: load again and retry). ``store`` shares an
    open :class:`turnsafe_store.Store` instead.

    Writes that several tasks make at once are committed together, one
    sync for all of them.
    """

    def __init__(
        self,
        home: Union[str, "os.PathLike[str]"],
        *,
        db: Optional[str] = None,
        synchronous: str = "full",
        lease_ttl: float = 0.001,
        store: Optional[Store] = None,
    ) -> None:
        if store is not None and db is not None:
            raise ValueError("give `db` or `store`, not both: a given store already has its database")
        self._owns_store = store is None
        self.store = (
            store
            if store is not None
            else Store(
                os.path.expanduser(os.fspath(home)),
                db=db,
                synchronous=synchronous,  # type: ignore[arg-type]
                lease_ttl=lease_ttl,
            )
        )
        # Where entries live (entry id -> session), learnt from every read
        # and write: a history is then read one session at a time.
        self._where: "OrderedDict[str, str]" = OrderedDict()
        # The newest record (or tombstone) this store read or wrote for each
        # session. A revision seen as current once is a real revision of the
        # conversation, and the uid a write after it claims is free only
        # while it is still current, so a write after the revision seen
        # needs no read first (see `write_record`).
        self._seen: "OrderedDict[str, _Tail]" = OrderedDict()

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Close the store this one opened (what was handed over is stored
        first); a store given as ``store`` stays open for its owner."""
        if self._owns_store:
            self.store.close()

    async def __aenter__(self) -> "TurnsafeConversationStore":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await _aio.off_loop(self.close)

    # -- the five primitives ------------------------------------------------

    async def read_record(self, conversation_id: str) -> Optional[ConversationRecord]:
        return (await self._tail(conversation_session_id(conversation_id))).record

    async def read_records(
        self, *, scope: Optional[str] = None, limit: Optional[int] = None
    ) -> Sequence[ConversationRecord]:
        listed = await _aio.off_loop(
            self.store._lg_read,
            thread_id=DIRECTORY_THREAD,
            checkpoint_ns=DIRECTORY_NS,
            filter=json.dumps({"scope": scope}) if scope is not None else None,
        )
        sessions = sorted({json.loads(bytes(row[5]))["session"] for row in listed})
        tails = await asyncio.gather(*(self._tail(s) for s in sessions))
        records = [
            t.record
            for t in tails
            if t.record is not None and (scope is None or t.record.scope == scope)
        ]
        records.sort(key=lambda r: r.updated_at, reverse=True)
        return records if limit is None else records[:limit]

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: Optional[str],
    ) -> None:
        conversation_id = record.conversation_id
        session = conversation_session_id(conversation_id)
        new_entries = list(new_entries)
        tail = await self._current(session, expected_revision)
        current = tail.record.revision if tail.record is not None else None
        if current != expected_revision:
            raise ConversationConflict(conversation_id)
        new_ids = {e.id for e in new_entries}
        head_at = session
        if record.head_id is not None and record.head_id not in new_ids:
            found = await self._locate(record.head_id, record)
            if found is None:
                raise ConversationConflict(conversation_id)
            head_at = found
        away = {tip: self._where[tip] for tip in record.branches if self._where.get(tip, session) != session}
        rows = self._rows(session, record, new_entries, tail.after, head_at, away)
        if tail.record is None:
            await self._list(session, record)
        uids = [f"pai-e:{_token(tail.after)}:{i}" for i in range(len(new_entries))]
        uids.append(f"pai-after:{_token(tail.after)}")
        await self._append(session, conversation_id, rows, uids, expected_revision)
        self._remember(session, _Tail(record, record.revision, None))
        for e in new_entries:
            self._learn(e.id, session)
        self._learn_record(session, record, head_at, away)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        session = conversation_session_id(conversation_id)
        tail = await self._current(session, expected_revision)
        if tail.record is None or tail.record.revision != expected_revision:
            raise ConversationConflict(conversation_id)
        revision = _new_revision()
        tombstone = {
            _KEY: {
                "kind": "deleted",
                "conversation_id": conversation_id,
                "after": expected_revision,
                "revision": revision,
            }
        }
        await self._append(
            session, conversation_id, [tombstone], [f"pai-after:{_token(expected_revision)}"], expected_revision
        )
        self._remember(session, _Tail(None, revision, None))

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        session = self._where.get(entry_id)
        if session is not None:
            index = await self._index(session)
            if entry_id in index:
                return _entries([index[entry_id]])[0]
        found = await self._search(entry_id)
        if found is None:
            raise KeyError(entry_id)
        return _entries([found[1][entry_id]])[0]

    async def read_history(self, head_id: Optional[str], *, limit: Optional[int] = None) -> List[ConversationEntry]:
        """The entries up to ``head_id``, oldest first (the last ``limit``):
        one read for each session the history spans (a fork's history
        reaches into the conversation it was forked from)."""
        if head_id is None or limit == 0:
            return []
        session = self._where.get(head_id)
        if session is None:
            found = await self._search(head_id)
            if found is None:
                raise KeyError(head_id)
            session = found[0]
        indexes: Dict[str, Dict[str, Dict[str, Any]]] = {}
        chain: List[Dict[str, Any]] = []
        entry_id: Optional[str] = head_id
        while entry_id is not None and (limit is None or len(chain) < limit):
            index = indexes.get(session)
            if index is None:
                index = indexes[session] = await self._index(session)
            payload = index.get(entry_id)
            if payload is None:
                raise KeyError(entry_id)
            chain.append(payload)
            session = payload.get("parent_at") or session
            entry_id = payload.get("parent_id")
            if entry_id is not None:
                self._learn(entry_id, session)
        chain.reverse()
        return _entries(chain)

    # -- rows ---------------------------------------------------------------

    def _rows(
        self,
        session: str,
        record: ConversationRecord,
        new_entries: List[ConversationEntry],
        after: Optional[str],
        head_at: str,
        away: Dict[str, str],
    ) -> List[Dict[str, Any]]:
        batch_ids = {e.id for e in new_entries}
        rows: List[Dict[str, Any]] = []
        for entry in new_entries:
            # The adapter's own JSON text, kept as text: the bytes it wrote
            # are the bytes it reads back (key order and numbers included).
            text = ModelMessagesTypeAdapter.dump_json([entry.message])[1:-1].decode()
            payload: Dict[str, Any] = {
                "kind": "entry",
                "id": entry.id,
                "parent_id": entry.parent_id,
                "entry_kind": entry.kind,
                "message": text,
            }
            if entry.parent_id is not None and entry.parent_id not in batch_ids:
                parent_at = self._where.get(entry.parent_id, session)
                if parent_at != session:
                    payload["parent_at"] = parent_at
            row: Dict[str, Any] = {"role": entry.message.kind, _KEY: payload}
            shown = _text_of(entry.message)
            if shown is not None:
                row["content"] = shown
            rows.append(row)
        state: Dict[str, Any] = {
            "kind": "record",
            "after": after,
            "record": _records.dump_python(record, mode="json"),
        }
        if head_at != session:
            state["head_at"] = head_at
        if away:
            state["branches_at"] = away
        rows.append({_KEY: state})
        return rows

    async def _append(
        self,
        session: str,
        conversation_id: str,
        rows: List[Dict[str, Any]],
        uids: List[str],
        expected_revision: Optional[str],
    ) -> None:
        """One batch through the flush machine: committed, or an error that
        says what happened (``ConversationConflict`` when the position it
        claims is taken, ``TurnNotPersisted`` with the outcome otherwise)."""
        for attempt in (0, 1):
            outcome = await _aio.append(self.store, session, rows, uids=uids)
            if outcome.persisted:
                return
            if outcome.cause == "uid_conflict":
                # Another write took the position after the revision this
                # one replaces: nothing of this batch was stored.
                self._seen.pop(session, None)
                raise ConversationConflict(conversation_id)
            if outcome.cause != "turn_lease":
                raise TurnNotPersisted(outcome)
            # Another writer holds (or took over) the conversation's lease.
            # Give back whatever this store held, and try once more if the
            # conversation is still at the revision this write replaces.
            await _aio.off_loop(self.store.release, session)
            tail = await self._tail(session)
            current = tail.record.revision if tail.record is not None else None
            if attempt or current != expected_revision:
                raise ConversationConflict(conversation_id)

    async def _list(self, session: str, record: ConversationRecord) -> None:
        """Put the conversation in the directory `read_records` lists, before
        its first record is written (so a stored record is always listed).
        One key per conversation and scope; what a key names is checked
        against the record when it is listed."""
        body = json.dumps(
            {"session": session, "conversation_id": record.conversation_id, "scope": record.scope},
            ensure_ascii=False,
            sort_keys=True,
        ).encode()
        outcome = await _aio.off_loop(
            self.store._lg_put_checkpoint,
            DIRECTORY_THREAD,
            DIRECTORY_NS,
            f"{session}:{_token(record.scope)}",
            None,
            "json",
            body,
            json.dumps({"scope": record.scope}, ensure_ascii=False),
        )
        if not outcome.persisted:
            raise TurnNotPersisted(outcome)

    # -- reads --------------------------------------------------------------

    async def _current(self, session: str, expected_revision: Optional[str]) -> _Tail:
        """The session's current record as a write after
        ``expected_revision`` needs it: the one this store last saw when that
        is the expected one (the uid the write claims settles the rest),
        else read now."""
        seen = self._seen.get(session)
        # A creation (`None`) always reads: the revision it is written after
        # is whatever tombstone is newest now.
        if expected_revision is not None and seen is not None and seen.record is not None:
            if seen.record.revision == expected_revision:
                return seen
        return await self._tail(session)

    async def _tail(self, session: str) -> _Tail:
        """The session's newest record or tombstone, read now."""
        rows = await _aio.show(self.store, session, limit=1)
        state = _last_state(rows)
        if state is None and rows:
            rows = await _aio.show(self.store, session, limit=_TAIL)
            state = _last_state(rows)
            if state is None and len(rows) >= _TAIL:
                state = _last_state(await _aio.show(self.store, session))
        if state is None:
            tail = _Tail(None, None, None)
        elif state.get("kind") == "deleted":
            tail = _Tail(None, state.get("revision"), state)
        else:
            record = _records.validate_python(state["record"])
            self._learn_record(session, record, state.get("head_at") or session, state.get("branches_at"))
            tail = _Tail(record, record.revision, state)
        self._remember(session, tail)
        return tail

    def _remember(self, session: str, tail: _Tail) -> None:
        seen = self._seen
        seen[session] = tail
        seen.move_to_end(session)
        if len(seen) > _SEEN_MAX:
            seen.popitem(last=False)

    async def _index(self, session: str) -> Dict[str, Dict[str, Any]]:
        """Every entry stored in ``session``, by id."""
        rows = await _aio.show(self.store, session)
        index: Dict[str, Dict[str, Any]] = {}
        for row in rows:
            payload = row.get(_KEY) if isinstance(row, dict) else None
            if isinstance(payload, dict) and payload.get("kind") == "entry":
                index[payload["id"]] = payload
        return index

    async def _locate(self, entry_id: str, record: ConversationRecord) -> Optional[str]:
        """The session that holds ``entry_id``: known (an entry, once stored,
        stays where it is), this conversation's, the one it was forked from,
        or (last) any listed conversation's."""
        known = self._where.get(entry_id)
        if known is not None:
            return known
        for cid in (record.conversation_id, record.forked_from):
            if cid is None:
                continue
            session = conversation_session_id(cid)
            if entry_id in await self._index(session):
                self._learn(entry_id, session)
                return session
        found = await self._search(entry_id)
        return found[0] if found is not None else None

    async def _search(self, entry_id: str) -> Optional[Tuple[str, Dict[str, Dict[str, Any]]]]:
        """Look for an entry in every listed conversation (an id this store
        has not met in a read or a write)."""
        listed = await _aio.off_loop(self.store._lg_read, thread_id=DIRECTORY_THREAD, checkpoint_ns=DIRECTORY_NS)
        for session in sorted({json.loads(bytes(row[5]))["session"] for row in listed}):
            index = await self._index(session)
            if entry_id in index:
                self._learn(entry_id, session)
                return session, index
        return None

    def _learn(self, entry_id: str, session: str) -> None:
        where = self._where
        where[entry_id] = session
        where.move_to_end(entry_id)
        if len(where) > _WHERE_MAX:
            where.popitem(last=False)

    def _learn_record(
        self,
        session: str,
        record: ConversationRecord,
        head_at: str,
        branches_at: Optional[Dict[str, str]] = None,
    ) -> None:
        if record.head_id is not None:
            self._learn(record.head_id, head_at)
        for tip in record.branches:
            self._learn(tip, (branches_at or {}).get(tip, session))


def _last_state(rows: List[Any]) -> Optional[Dict[str, Any]]:
    """The newest record or tombstone among ``rows`` (oldest first)."""
    for row in reversed(rows):
        payload = row.get(_KEY) if isinstance(row, dict) else None
        if isinstance(payload, dict) and payload.get("kind") in ("record", "deleted"):
            return payload
    return None


def _entries(payloads: List[Dict[str, Any]]) -> List[ConversationEntry]:
    if not payloads:
        return []
    messages = ModelMessagesTypeAdapter.validate_json("[" + ",".join(p["message"] for p in payloads) + "]")
    return [
        ConversationEntry(id=p["id"], parent_id=p.get("parent_id"), message=m, kind=p.get("entry_kind", "message"))
        for p, m in zip(payloads, messages)
    ]


def _new_revision() -> str:
    # A tombstone's revision: what a conversation created again under the
    # same id is written after. Any unique token will do.
    return os.urandom(16).hex()
