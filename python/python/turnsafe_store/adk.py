"""A Google ADK session service over turnsafe's store.

    from google.adk.runners import Runner
    from turnsafe_store.adk import TurnsafeSessionService

    sessions = TurnsafeSessionService("~/.myagent")            # SQLite
    sessions = TurnsafeSessionService("~/.myagent", db=url)    # PostgreSQL
    runner = Runner(app_name="app", agent=agent, session_service=sessions)

It implements ADK's ``BaseSessionService`` (``create_session``,
``get_session``, ``list_sessions``, ``delete_session``, ``append_event``,
``get_user_state``) with ADK's errors and state rules. An event and its
state delta are one row, written in one transaction through the flush
machine: an ``append_event`` that cannot be stored raises
:class:`turnsafe_store.TurnNotPersisted`, whose ``outcome`` holds the
receipt of the durable copy under ``<home>/sessions/`` or says the batch
was handed back, and ``turnsafe replay`` brings the event in later, once.
Two writers of one session: the one that loaded an older state gets ADK's
``StaleSessionError`` and stores nothing.

The data model (names to turnsafe ids, where ``app:`` and ``user:`` state
live, replay) is in ``docs/ADK.md``. Needs ADK: ``pip install
"turnsafe-store[adk]"``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from pydantic_core import to_jsonable_python
except ImportError as e:  # pragma: no cover - exercised without the extra only
    raise ImportError('turnsafe_store.adk needs Google ADK: pip install "turnsafe-store[adk]"') from e

from . import _aio
from ._errors import Error, TurnNotPersisted
from ._native import Store

__all__ = ["TurnsafeSessionService", "adk_session_id"]

# ADK's own words for a stale writer (its DatabaseSessionService's).
_STALE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
_HEAD_UID = "adk-session"
_AFTER = "adk-after:"
# Record namespaces in the app's record thread (docs/ADK.md).
_NS_SESSION = "adk:session"
_NS_SCOPED = "adk:scoped"
_NS_CARRY = "adk:carry"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# An event id longer than this is stored under a hash of itself, so that
# `adk-after:<uid>` stays within the store's 256-byte uids.
_MAX_EVENT_UID = 200

Order = Tuple[float, int, str]


def _digest(*names: str) -> str:
    text = json.dumps(list(names), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _readable(name: str) -> str:
    return _UNSAFE.sub("_", name)[:40]


def adk_session_id(app_name: str, user_id: str, session_id: str) -> str:
    """The turnsafe session id of ADK's session ``(app_name, user_id,
    session_id)``: ``adk-<readable prefix>-h<hash of all three>``. The way
    back is stored in the session's first row and the app's directory."""
    return f"adk-{_readable(session_id)}-h{_digest(app_name, user_id, session_id)}"


def _app_thread(app_name: str) -> str:
    """The record thread of an app: its directory of sessions, the sessions
    that wrote shared state, and what deleted sessions left of it."""
    return f"adk-app-{_readable(app_name)}-h{_digest(app_name)}"


def _event_uid(event_id: str) -> str:
    if 0 < len(event_id.encode("utf-8", "surrogatepass")) <= _MAX_EVENT_UID:
        return event_id
    return "adk-event-h" + hashlib.sha256(event_id.encode("utf-8", "surrogatepass")).hexdigest()


def _json_safe(state: Dict[str, Any]) -> Dict[str, Any]:
    """State as JSON data; a value JSON cannot hold becomes its text, as
    ADK's own services store it."""
    out: Dict[str, Any] = {}
    for key, value in state.items():
        try:
            out[key] = to_jsonable_python(value)
        except Exception:  # noqa: BLE001 - any serializer failure: keep the rest
            out[key] = str(value)
    return out


def _split(state: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """ADK's three stored scopes of a state dict (``temp:`` is dropped)."""
    out: Dict[str, Dict[str, Any]] = {"session": {}, "app": {}, "user": {}}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            out["app"][key[len(State.APP_PREFIX) :]] = value
        elif key.startswith(State.USER_PREFIX):
            out["user"][key[len(State.USER_PREFIX) :]] = value
        elif not key.startswith(State.TEMP_PREFIX):
            out["session"][key] = value
    return out


@dataclass
class _Stored:
    """One session as its rows hold it."""

    head: Dict[str, Any]
    # (seq, the event's JSON), in append order.
    events: List[Tuple[int, Dict[str, Any]]] = field(default_factory=list)
    # The previous uids the session's order rows claim.
    claimed: set = field(default_factory=set)
    marker: str = _HEAD_UID

    @property
    def created(self) -> float:
        return float(self.head["created"])

    @property
    def update_time(self) -> float:
        times = [float(ev.get("timestamp", 0.0)) for _, ev in self.events]
        return max([self.created, *times])

    def contributions(self) -> Iterable[Tuple[Order, str, str, Any]]:
        """Every stored write of a key: ``(order, scope, key, value)``."""
        at: Order = (self.created, -1, _HEAD_UID)
        for scope, name in (("session", "state"), ("app", "app_state"), ("user", "user_state")):
            for key, value in (self.head.get(name) or {}).items():
                yield at, scope, key, value
        for seq, ev in self.events:
            delta = (ev.get("actions") or {}).get("state_delta") or {}
            order: Order = (float(ev.get("timestamp", 0.0)), seq, _event_uid(str(ev.get("id", ""))))
            for scope, keys in _split(delta).items():
                for key, value in keys.items():
                    yield order, scope, key, value


def _parse(rows: List[Dict[str, Any]]) -> Optional[_Stored]:
    """The session its rows hold, or None when it has no first row (never
    created, deleted, or rows left by a delete that stopped half way)."""
    stored: Optional[_Stored] = None
    for seq, row in enumerate(rows):
        adk = row.get("adk") if isinstance(row, dict) else None
        if not isinstance(adk, dict):
            continue
        kind = adk.get("kind")
        if kind == "session":
            stored = _Stored(head=adk)
        elif stored is None:
            continue
        elif kind == "event" and isinstance(adk.get("event"), dict):
            stored.events.append((seq, adk["event"]))
            stored.marker = _event_uid(str(adk["event"].get("id", "")))
        elif kind == "after":
            stored.claimed.add(str(adk.get("after")))
    return stored


def _fold(contributions: Iterable[Tuple[Order, str, str, Any]]) -> Dict[Tuple[str, str], Tuple[Order, Any]]:
    """For each (scope, key), the contribution with the greatest order."""
    won: Dict[Tuple[str, str], Tuple[Order, Any]] = {}
    for order, scope, key, value in contributions:
        prev = won.get((scope, key))
        if prev is None or order > prev[0]:
            won[(scope, key)] = (order, value)
    return won


def _text(event: Event) -> Optional[str]:
    content = event.content
    if content is None or not content.parts:
        return None
    texts = [p.text for p in content.parts if p.text]
    return "\n".join(texts) if texts else None


class TurnsafeSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on a turnsafe home.

    ``home`` holds ``state.db`` and the divert folder ``sessions/``; ``db``
    (or ``TURNSAFE_DB`` when ``db`` is None) a PostgreSQL URL that takes the
    rows instead of ``state.db`` (the divert folder stays under ``home``).
    ``lease_ttl`` is the store's turn lease: ADK's own stale check (the
    order row every event claims) is what fences writers here, so the lease
    is kept to a millisecond by default and a session moves freely between
    processes (the workers of a server) from one event to the next. A longer
    lease refuses other processes for that long after each write (as
    ``StaleSessionError``).
    ``store`` shares an open :class:`turnsafe_store.Store` instead.
    """

    def __init__(
        self,
        home: Union[str, "os.PathLike[str]"],
        *,
        db: Optional[str] = None,
        lease_ttl: float = 0.001,
        synchronous: str = "full",
        store: Optional[Store] = None,
    ) -> None:
        if store is not None and db is not None:
            raise ValueError("give `db` or `store`, not both: a given store already has its database")
        self._owns_store = store is None
        self.store = store if store is not None else Store(home, db=db, synchronous=synchronous, lease_ttl=lease_ttl)
        # Sessions known to have their `adk:scoped` record, and those whose
        # record could not be stored yet.
        self._scoped: set = set()
        self._unmarked: Dict[str, Tuple[str, str]] = {}

    # -- lifetime ---------------------------------------------------------

    async def close(self) -> None:
        """Close the store (what was handed over is stored first)."""
        if self._owns_store:
            await _aio.off_loop(self.store.close)

    async def __aenter__(self) -> "TurnsafeSessionService":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- ADK's API ----------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: Optional[Dict[str, Any]] = None,
        session_id: Optional[str] = None,
    ) -> Session:
        if session_id:
            session_id = await self._resolve(app_name, user_id, session_id)
        if not session_id:
            session_id = str(uuid.uuid4())
        tid = adk_session_id(app_name, user_id, session_id)
        rows = await _aio.show(self.store, tid)
        if _parse(rows) is not None:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        if rows:
            # Rows a delete left behind when it stopped half way.
            await _aio.off_loop(self.store.delete_session, tid)
        scopes = _split(_json_safe(dict(state or {})))
        await self._put_record(
            _app_thread(app_name),
            _NS_SESSION,
            tid,
            {"app": app_name, "user": user_id, "id": session_id},
            {"user": user_id},
        )
        if scopes["app"] or scopes["user"]:
            await self._mark_scoped(app_name, user_id, tid)
        head = {
            "kind": "session",
            "app": app_name,
            "user": user_id,
            "id": session_id,
            "created": time.time(),
            "state": scopes["session"],
            "app_state": scopes["app"],
            "user_state": scopes["user"],
        }
        outcome = await _aio.append(self.store, tid, [{"adk": head}], uids=[_HEAD_UID])
        if not outcome.persisted:
            if outcome.cause == "uid_conflict":
                # Another writer created it between the read and the write.
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            raise TurnNotPersisted(outcome)
        stored = _Stored(head=head)
        return await self._session(app_name, user_id, session_id, tid, stored, stored_events=[])

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: Optional[GetSessionConfig] = None,
    ) -> Optional[Session]:
        session_id = await self._resolve(app_name, user_id, session_id)
        tid = adk_session_id(app_name, user_id, session_id)
        stored = _parse(await _aio.show(self.store, tid))
        if stored is None:
            return None
        # In time order; append order breaks ties (a replayed event sits
        # where it happened, not where it arrived).
        events = sorted(stored.events, key=lambda se: (float(se[1].get("timestamp", 0.0)), se[0]))
        if config is not None and config.after_timestamp is not None:
            events = [se for se in events if float(se[1].get("timestamp", 0.0)) >= config.after_timestamp]
        if config is not None and config.num_recent_events is not None:
            n = config.num_recent_events
            events = events[-n:] if n > 0 else []
        return await self._session(app_name, user_id, session_id, tid, stored, stored_events=events)

    async def list_sessions(self, *, app_name: str, user_id: Optional[str] = None) -> ListSessionsResponse:
        records = await self._records(_app_thread(app_name), _NS_SESSION, None if user_id is None else {"user": user_id})
        names = []
        for _tid, blob, _meta in records:
            if blob.get("app") == app_name and (user_id is None or blob.get("user") == user_id):
                names.append((str(blob["user"]), str(blob["id"])))
        tids = [adk_session_id(app_name, u, s) for u, s in names]
        rows = await asyncio.gather(*(_aio.show(self.store, t) for t in tids))
        known = {t: _parse(r) for t, r in zip(tids, rows)}
        shared = await self._shared(app_name, None, known)
        sessions = []
        for (user, sid), tid in zip(names, tids):
            stored = known[tid]
            if stored is None:
                continue
            sessions.append(
                Session(
                    app_name=app_name,
                    user_id=user,
                    id=sid,
                    state=self._merge(stored, shared, user),
                    events=[],
                    last_update_time=stored.update_time,
                )
            )
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        session_id = await self._resolve(app_name, user_id, session_id)
        tid = adk_session_id(app_name, user_id, session_id)
        rows = await _aio.show(self.store, tid)
        if not rows:
            return
        stored = _parse(rows)
        if stored is not None:
            # ADK keeps app: and user: state when a session goes: what this
            # session wrote of it stays, as a carry record, before its rows go.
            kept = [
                [list(order), scope, key, value]
                for (scope, key), (order, value) in _fold(stored.contributions()).items()
                if scope in ("app", "user")
            ]
            if kept:
                record = {"user": user_id, "from": tid, "contributions": kept}
                name = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:32]
                await self._put_record(_app_thread(app_name), _NS_CARRY, name, record, {"user": user_id})
        await _aio.off_loop(self.store.delete_session, tid)
        self._scoped.discard(tid)

    async def get_user_state(self, *, app_name: str, user_id: str) -> Dict[str, Any]:
        shared = await self._shared(app_name, user_id, {})
        return {key: value for (scope, key), (_o, value) in shared.items() if scope == ("user", user_id)}

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        tid = adk_session_id(session.app_name, session.user_id, session.id)
        try:
            exists = bool(await _aio.show(self.store, tid, limit=1))
        except Error:
            # The database cannot be read: the write below meets the same
            # fault, and the flush machine keeps the event (divert) or says
            # it was handed back.
            exists = True
        if not exists:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        data = json.loads(event.model_dump_json(exclude_none=True))
        delta = (data.get("actions") or {}).get("state_delta") or {}
        scopes = _split(delta)
        if scopes["app"] or scopes["user"]:
            # Before the event: no stored app:/user: delta is ever unknown to
            # readers. A record that cannot be stored now is tried again by
            # the next call (and a diverted one comes back with replay); the
            # event still gets its own outcome.
            self._unmarked[tid] = (session.app_name, session.user_id)
            await self._mark_pending()
        uid = _event_uid(event.id)
        marker = session._storage_update_marker or self._marker_of(session)
        row: Dict[str, Any] = {"role": event.author}
        text = _text(event)
        if text is not None:
            row["content"] = text
        row["adk"] = {"kind": "event", "event": data}
        batch = [{"adk": {"kind": "after", "after": marker, "event": event.id}}, row]
        for attempt in (1, 2):
            outcome = await _aio.append(self.store, tid, batch, uids=[_AFTER + marker, uid])
            if outcome.persisted:
                session._storage_update_marker = uid
                session.last_update_time = max(session.last_update_time, event.timestamp)
                return self._commit_event_to_session(session, event)
            if outcome.cause not in ("uid_conflict", "turn_lease"):
                raise TurnNotPersisted(outcome)
            stored = _parse(await _aio.show(self.store, tid))
            if stored is None:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            if marker in stored.claimed or stored.marker != marker:
                raise _stale(outcome)
            if outcome.cause == "uid_conflict":
                # The order row is free: the event id is stored with other bytes.
                raise AlreadyExistsError(
                    f"Event {event.id} is already stored in session {session.id} with other content."
                )
            # Our lease was taken over while the session stayed as we
            # loaded it: give the old lease back and write once more.
            await _aio.off_loop(self.store.release, tid)
        raise _stale(outcome)

    # -- reading ------------------------------------------------------------

    async def _session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        tid: str,
        stored: _Stored,
        *,
        stored_events: List[Tuple[int, Dict[str, Any]]],
    ) -> Session:
        shared = await self._shared(app_name, user_id, {tid: stored})
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=self._merge(stored, shared, user_id),
            events=[Event.model_validate(ev) for _, ev in stored_events],
            last_update_time=stored.update_time,
        )
        session._storage_update_marker = stored.marker
        return session

    @staticmethod
    def _merge(stored: _Stored, shared: Dict[Tuple[Any, str], Tuple[Order, Any]], user_id: str) -> Dict[str, Any]:
        """The session's own keys, then app: and its user's user: keys."""
        state = {key: value for (scope, key), (_o, value) in _fold(stored.contributions()).items() if scope == "session"}
        for (scope, key), (_o, value) in shared.items():
            if scope == "app":
                state[State.APP_PREFIX + key] = value
            elif scope == ("user", user_id):
                state[State.USER_PREFIX + key] = value
        return state

    async def _shared(
        self, app_name: str, user_id: Optional[str], known: Dict[str, Optional[_Stored]]
    ) -> Dict[Tuple[Any, str], Tuple[Order, Any]]:
        """The app's ``app:`` state and its users' ``user:`` state: for each
        key, the newest write among the sessions that wrote such keys, the
        carry records, and the sessions in ``known`` (read already). Scopes
        are ``"app"`` and ``("user", user_id)``."""
        if self._unmarked:
            await self._mark_pending()
        thread = _app_thread(app_name)
        scoped, carries = await asyncio.gather(
            self._records(thread, _NS_SCOPED, None), self._records(thread, _NS_CARRY, None)
        )
        wanted: Dict[str, str] = {}
        for tid, blob, _meta in scoped:
            self._scoped.add(tid)
            wanted[tid] = str(blob.get("user"))
        missing = [t for t in wanted if t not in known]
        for t, rows in zip(missing, await asyncio.gather(*(_aio.show(self.store, t) for t in missing))):
            known[t] = _parse(rows)
        found: List[Tuple[Order, Any, str, Any]] = []
        for tid, stored in known.items():
            if stored is None:
                continue
            user = str(stored.head.get("user"))
            for order, scope, key, value in stored.contributions():
                if scope == "app":
                    found.append((order, "app", key, value))
                elif scope == "user":
                    found.append((order, ("user", user), key, value))
        for _name, blob, _meta in carries:
            user = str(blob.get("user"))
            for order, scope, key, value in blob.get("contributions") or []:
                at = (float(order[0]), int(order[1]), str(order[2]))
                found.append((at, "app" if scope == "app" else ("user", user), key, value))
        if user_id is not None:
            found = [f for f in found if f[1] == "app" or f[1] == ("user", user_id)]
        return _fold(found)

    async def _records(
        self, thread: str, ns: str, filter: Optional[Dict[str, Any]]
    ) -> List[Tuple[str, Dict[str, Any], Dict[str, Any]]]:
        """The records of one namespace of a thread: ``(name, blob, metadata)``."""
        rows = await _aio.off_loop(
            self.store._lg_read,
            thread_id=thread,
            checkpoint_ns=ns,
            filter=json.dumps(filter) if filter else None,
        )
        out = []
        for row in rows:
            _thread, _ns, name, _parent, _type, blob, metadata, _writes = row
            out.append((name, json.loads(bytes(blob)), json.loads(metadata)))
        return out

    async def _resolve(self, app_name: str, user_id: str, session_id: str) -> str:
        """ADK's padded ids: a padded id names the session stored under it
        when there is one, else its stripped form."""
        if session_id == session_id.strip():
            return session_id
        rows = await _aio.show(self.store, adk_session_id(app_name, user_id, session_id))
        return session_id if _parse(rows) is not None else session_id.strip()

    @staticmethod
    def _marker_of(session: Session) -> str:
        """The marker of a session this service did not load: its newest
        event, as the caller holds it."""
        return _event_uid(session.events[-1].id) if session.events else _HEAD_UID

    # -- writing records ----------------------------------------------------

    async def _put_record(
        self, thread: str, ns: str, name: str, blob: Dict[str, Any], metadata: Dict[str, Any]
    ) -> None:
        """One record through the flush machine; the same record again is
        already stored (same bytes)."""
        data = json.dumps(blob, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
        meta = json.dumps(metadata, sort_keys=True, ensure_ascii=False)
        outcome = await _aio.off_loop(self.store._lg_put_checkpoint, thread, ns, name, None, "json", data, meta)
        if not outcome.persisted:
            raise TurnNotPersisted(outcome)

    async def _mark_scoped(self, app_name: str, user_id: str, tid: str) -> None:
        if tid in self._scoped:
            return
        await self._put_record(_app_thread(app_name), _NS_SCOPED, tid, {"user": user_id}, {"user": user_id})
        self._scoped.add(tid)

    async def _mark_pending(self) -> None:
        """Store the ``adk:scoped`` records still owed; one that cannot be
        stored stays owed."""
        for tid, (app_name, user_id) in list(self._unmarked.items()):
            try:
                await self._mark_scoped(app_name, user_id, tid)
            except Error:
                continue
            self._unmarked.pop(tid, None)


def _stale(outcome: Any) -> StaleSessionError:
    """ADK's stale-writer error; ``outcome`` says the batch was handed back."""
    err = StaleSessionError(_STALE)
    err.outcome = outcome  # type: ignore[attr-defined]
    return err
