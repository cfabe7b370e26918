"""TurnsafeSessionService beyond ADK's contract suite: stale writers,
deleted sessions, shared state that outlives a session, and the rule a
replayed event's state delta follows (docs/ADK.md)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from pathlib import Path

import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions

import turnsafe_store
from conftest import immutable, need
from turnsafe_store import Store, TurnNotPersisted
from turnsafe_store.adk import TurnsafeSessionService, adk_session_id

_dbs = itertools.count()


@pytest.fixture(scope="module")
def pg_module():
    import pg_server

    try:
        server = pg_server.PgServer.start()
    except pg_server.Unavailable as e:
        need(False, str(e))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request):
    if request.param == "sqlite":
        return None
    pg = request.getfixturevalue("pg_module")
    return pg.url(pg.create_db(f"adkstate{os.getpid()}_{next(_dbs)}"))


def ev(at: float, **state) -> Event:
    return Event(invocation_id="i", author="user", timestamp=at, actions=EventActions(state_delta=state))


def test_a_writer_that_loaded_an_older_session_gets_stale_session_error_and_stores_nothing(home: Path, db) -> None:
    """Two services sharing one store (one turn lease, so only the order
    row can tell them apart): the one behind is refused, whole."""

    async def body():
        store = Store(home, db=db)
        one, two = TurnsafeSessionService(home, store=store), TurnsafeSessionService(home, store=store)
        try:
            await one.create_session(app_name="shop", user_id="ann", session_id="s1")
            a = await one.get_session(app_name="shop", user_id="ann", session_id="s1")
            b = await two.get_session(app_name="shop", user_id="ann", session_id="s1")
            await one.append_event(a, ev(100.0, step="a"))
            with pytest.raises(StaleSessionError, match="modified in storage") as e:
                await two.append_event(b, ev(101.0, step="b", **{"app:seen": "b"}))
            assert e.value.outcome.handed_back == 2 and e.value.outcome.cause == "uid_conflict"
            assert b.events == [] and "step" not in b.state
            got = await one.get_session(app_name="shop", user_id="ann", session_id="s1")
            assert [x.actions.state_delta for x in got.events] == [{"step": "a"}]
            assert got.state == {"step": "a"}
            # Reloaded, the second writer goes on.
            b = await two.get_session(app_name="shop", user_id="ann", session_id="s1")
            await two.append_event(b, ev(102.0, step="b"))
            got = await one.get_session(app_name="shop", user_id="ann", session_id="s1")
            assert got.state == {"step": "b"} and len(got.events) == 2
        finally:
            store.close()

    asyncio.run(body())


def test_appending_to_a_deleted_session_raises_session_not_found(home: Path, db) -> None:
    async def body():
        async with TurnsafeSessionService(home, db=db) as s:
            made = await s.create_session(app_name="shop", user_id="ann", session_id="gone")
            await s.delete_session(app_name="shop", user_id="ann", session_id="gone")
            with pytest.raises(SessionNotFoundError):
                await s.append_event(made, ev(5.0, k=1))
            assert await s.get_session(app_name="shop", user_id="ann", session_id="gone") is None
            # Deleting what is not there is no error.
            await s.delete_session(app_name="shop", user_id="ann", session_id="gone")

    asyncio.run(body())


def test_app_and_user_state_outlive_the_session_that_wrote_them(home: Path, db) -> None:
    async def body():
        async with TurnsafeSessionService(home, db=db) as s:
            one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"app:a": 1})
            await s.append_event(one, Event(author="user", actions=EventActions(state_delta={"user:u": 2, "k": 3})))
            await s.delete_session(app_name="shop", user_id="ann", session_id="s1")
            again = await s.create_session(app_name="shop", user_id="ann", session_id="s1")
            assert again.state == {"app:a": 1, "user:u": 2} and again.events == []
            assert await s.get_user_state(app_name="shop", user_id="ann") == {"u": 2}

    asyncio.run(body())


def test_an_event_id_stored_with_other_content_is_refused(home: Path, db) -> None:
    async def body():
        async with TurnsafeSessionService(home, db=db) as s:
            one = await s.create_session(app_name="shop", user_id="ann", session_id="s1")
            await s.append_event(one, Event(id="e-1", author="user", timestamp=1.0))
            other = await s.create_session(app_name="shop", user_id="ann", session_id="s2")
            await s.append_event(other, Event(id="e-1", author="user", timestamp=1.0))
            again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
            with pytest.raises(AlreadyExistsError):
                await s.append_event(again, Event(id="e-1", author="clerk", timestamp=2.0))
            got = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
            assert [(x.id, x.author) for x in got.events] == [("e-1", "user")]

    asyncio.run(body())


def test_a_replayed_delta_never_overwrites_a_newer_write_and_wins_over_an_older_one(home: Path) -> None:
    """Two events are diverted while state.db is immutable: one older and
    one newer than what two other sessions write meanwhile. After replay each
    key holds the write with the latest timestamp, whatever arrived last."""

    async def body():
        async with TurnsafeSessionService(home) as s:
            a = await s.create_session(app_name="shop", user_id="ann", session_id="a")
            b = await s.create_session(app_name="shop", user_id="ann", session_id="b")
            c = await s.create_session(app_name="shop", user_id="ann", session_id="c")
            await s.append_event(b, ev(10.0, **{"app:k": "b@10"}))
            with immutable(home / "state.db", home / "state.db-wal"):
                with pytest.raises(TurnNotPersisted) as e1:
                    await s.append_event(a, ev(20.0, **{"app:k": "a@20", "user:u": "a@20", "mine": "a@20"}))
                assert e1.value.outcome.receipt is not None
            await s.append_event(c, ev(30.0, **{"app:k": "c@30", "user:u": "c@30"}))
            assert e1.value.outcome.diverted == 2
            return a.id

    a_id = asyncio.run(body())
    report = turnsafe_store.replay(home)
    assert report["replayed"] == 2 and report["quarantined"] == 0, report
    assert turnsafe_store.replay(home)["lines"] == 0

    async def after():
        async with TurnsafeSessionService(home) as s:
            got = await s.get_session(app_name="shop", user_id="ann", session_id=a_id)
            assert [x.timestamp for x in got.events] == [20.0]
            # The replayed event's own key is its; the shared keys were
            # written later (30) by c, and stay c's.
            assert got.state == {"mine": "a@20", "app:k": "c@30", "user:u": "c@30"}
            # Replaying never counts a delta twice: the same result again.
            turnsafe_store.replay(home)
            assert (await s.get_session(app_name="shop", user_id="ann", session_id=a_id)).state == got.state

    asyncio.run(after())

    # Now the other way: a diverted write newer than what is stored wins.
    async def newer():
        async with TurnsafeSessionService(home) as s:
            a = await s.get_session(app_name="shop", user_id="ann", session_id=a_id)
            with immutable(home / "state.db", home / "state.db-wal"):
                with pytest.raises(TurnNotPersisted):
                    await s.append_event(a, ev(40.0, **{"app:k": "a@40"}))
            c = await s.get_session(app_name="shop", user_id="ann", session_id="c")
            await s.append_event(c, ev(35.0, **{"app:k": "c@35"}))

    asyncio.run(newer())
    assert turnsafe_store.replay(home)["replayed"] == 2

    async def last():
        async with TurnsafeSessionService(home) as s:
            got = await s.get_session(app_name="shop", user_id="ann", session_id="b")
            assert got.state["app:k"] == "a@40"

    asyncio.run(last())


def test_names_map_to_a_hashed_turnsafe_id_and_back(home: Path) -> None:
    """Any three names (a newline, a slash, non-ASCII) give a valid turnsafe
    id, distinct per triple; the session's first row names them again."""
    tid = adk_session_id("my app", "ann/ü", "order-42\n")
    assert tid.startswith("adk-order-42_-h") and len(tid) <= 128
    assert adk_session_id("my app", "ann/ü", "order-42_") != tid
    assert adk_session_id("my app", "bob", "order-42\n") != tid

    async def body():
        async with TurnsafeSessionService(home) as s:
            made = await s.create_session(app_name="a/b", user_id="ü", session_id="x y", state={"k": 1})
            return adk_session_id("a/b", "ü", made.id)

    tid = asyncio.run(body())
    with Store(home) as store:
        head = store.show(tid)[0]["adk"]
    assert (head["app"], head["user"], head["id"]) == ("a/b", "ü", "x y")
    assert json.loads(json.dumps(head["state"])) == {"k": 1}


def test_a_diverted_event_replayed_after_the_session_moved_on_is_kept_and_its_claim_quarantined(home: Path) -> None:
    """An event is diverted; the session is reloaded (without it) and goes
    on. Replay stores the diverted event, once, and quarantines its order
    row, whose position the later event holds: no event lost, the fork
    said."""

    async def body():
        async with TurnsafeSessionService(home) as s:
            one = await s.create_session(app_name="shop", user_id="ann", session_id="s1")
            with immutable(home / "state.db", home / "state.db-wal"):
                with pytest.raises(TurnNotPersisted) as e:
                    await s.append_event(one, ev(10.0, k="diverted"))
            assert e.value.outcome.receipt is not None
            again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
            assert again.events == []
            await s.append_event(again, ev(20.0, k="went on"))

    asyncio.run(body())
    report = turnsafe_store.replay(home)
    assert (report["replayed"], report["quarantined"]) == (1, 1), report

    async def after():
        async with TurnsafeSessionService(home) as s:
            got = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
            assert [x.actions.state_delta["k"] for x in got.events] == ["diverted", "went on"]
            assert got.state == {"k": "went on"}
            # The session goes on from the replayed event too.
            await s.append_event(got, ev(30.0, k="after replay"))
            assert (await s.get_session(app_name="shop", user_id="ann", session_id="s1")).state == {"k": "after replay"}

    asyncio.run(after())
