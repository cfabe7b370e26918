"""ADK's session-service contract, stated again for TurnsafeSessionService.

ADK's repository holds a contract suite every BaseSessionService owes its
callers. CI cannot reach it, so each test here states one of its
behaviours in this project's words, on SQLite and on PostgreSQL; the table
in docs/ADK.md names the ADK test each one stands for.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import pytest
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from turnsafe_store.adk import TurnsafeSessionService

from conftest import need

_dbs = itertools.count()


@pytest.fixture(scope="module")
def pg_module():
    """One PostgreSQL server for the module; each test gets a database."""
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
def make(request, tmp_path: Path):
    """A factory of services on one home (and one database)."""
    url = None
    if request.param == "postgres":
        pg = request.getfixturevalue("pg_module")
        url = pg.url(pg.create_db(f"adk{os.getpid()}_{next(_dbs)}"))
    return lambda: TurnsafeSessionService(tmp_path / "home", db=url)


def run(make, body):
    """Run ``body(service)`` on a fresh event loop, closing the service after."""

    async def main():
        service = make()
        try:
            return await body(service)
        finally:
            await service.close()

    return asyncio.run(main())


def delta(**state) -> EventActions:
    return EventActions(state_delta=state)


def test_reading_a_session_never_created_gives_none(make):
    async def body(s):
        assert await s.get_session(app_name="shop", user_id="ann", session_id="nope") is None

    run(make, body)


def test_a_created_session_reads_back_equal_and_is_gone_once_deleted(make):
    async def body(s):
        made = await s.create_session(app_name="shop", user_id="ann", state={"cart": ["tea"]})
        assert made.id and made.app_name == "shop" and made.user_id == "ann"
        assert made.state == {"cart": ["tea"]} and made.last_update_time <= time.time()
        got = await s.get_session(app_name="shop", user_id="ann", session_id=made.id)
        assert got == made
        await s.delete_session(app_name="shop", user_id="ann", session_id=made.id)
        assert await s.get_session(app_name="shop", user_id="ann", session_id=made.id) is None

    run(make, body)


def test_every_created_session_is_listed_with_its_own_state(make):
    async def body(s):
        ids = [f"visit-{i}" for i in range(4)]
        for sid in ids:
            await s.create_session(app_name="shop", user_id="ann", session_id=sid, state={"n": sid})
        listed = (await s.list_sessions(app_name="shop", user_id="ann")).sessions
        assert sorted(x.id for x in listed) == ids
        assert all(x.state == {"n": x.id} and x.events == [] for x in listed)

    run(make, body)


def test_listing_puts_the_most_recently_active_session_last(make):
    async def body(s):
        for sid in ("x", "y", "z"):
            await s.create_session(app_name="shop", user_id="ann", session_id=sid)
        first = await s.get_session(app_name="shop", user_id="ann", session_id="x")
        await s.append_event(first, Event(invocation_id="i", author="user", timestamp=time.time() + 5))
        listed = (await s.list_sessions(app_name="shop", user_id="ann")).sessions
        assert [x.id for x in listed] == ["y", "z", "x"]

    run(make, body)


def test_listing_without_a_user_lists_every_user_of_the_app(make):
    async def body(s):
        await s.create_session(app_name="shop", user_id="ann", session_id="a1", state={"k": "a1"})
        await s.create_session(app_name="shop", user_id="ann", session_id="a2", state={"k": "a2"})
        await s.create_session(app_name="shop", user_id="bob", session_id="b1", state={"k": "b1"})
        await s.create_session(app_name="other", user_id="bob", session_id="o1", state={"k": "o1"})
        ann = (await s.list_sessions(app_name="shop", user_id="ann")).sessions
        assert {x.id: x.state for x in ann} == {"a1": {"k": "a1"}, "a2": {"k": "a2"}}
        bob = (await s.list_sessions(app_name="shop", user_id="bob")).sessions
        assert [(x.id, x.state) for x in bob] == [("b1", {"k": "b1"})]
        every = (await s.list_sessions(app_name="shop")).sessions
        assert {(x.user_id, x.id): x.state["k"] for x in every} == {
            ("ann", "a1"): "a1",
            ("ann", "a2"): "a2",
            ("bob", "b1"): "b1",
        }

    run(make, body)


def test_app_keys_reach_every_session_of_the_app(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"app:motd": "hi"})
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(**{"app:sale": True})))
        two = await s.create_session(app_name="shop", user_id="bob", session_id="s2")
        assert two.state == {"app:motd": "hi", "app:sale": True}
        again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
        assert again.state["app:motd"] == "hi" and again.state["app:sale"] is True
        elsewhere = await s.create_session(app_name="other", user_id="ann", session_id="s3")
        assert elsewhere.state == {}

    run(make, body)


def test_user_keys_reach_only_that_users_sessions(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"user:lang": "fr"})
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(**{"user:size": 38})))
        mine = await s.create_session(app_name="shop", user_id="ann", session_id="s2")
        assert mine.state == {"user:lang": "fr", "user:size": 38}
        theirs = await s.create_session(app_name="shop", user_id="bob", session_id="s3")
        assert theirs.state == {}

    run(make, body)


def test_plain_keys_stay_in_their_session(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"step": 1})
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(page="cart")))
        again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
        assert again.state == {"step": 1, "page": "cart"}
        other = await s.create_session(app_name="shop", user_id="ann", session_id="s2")
        assert other.state == {}

    run(make, body)


def test_a_dict_written_to_a_key_replaces_the_old_dict(make):
    async def body(s):
        one = await s.create_session(
            app_name="shop", user_id="ann", session_id="s1", state={"addr": {"city": "Lyon", "zip": "69001"}}
        )
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(addr={"city": "Nice"})))
        again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
        assert again.state["addr"] == {"city": "Nice"} and one.state["addr"] == {"city": "Nice"}

    run(make, body)


def test_none_written_to_a_key_is_kept_as_none(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"coupon": "X1"})
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(coupon=None)))
        again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
        assert "coupon" in again.state and again.state["coupon"] is None
        assert "coupon" in one.state and one.state["coupon"] is None

    run(make, body)


def test_a_false_value_stays_false_beside_other_writes(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"paid": False})
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(shipped=True)))
        again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
        assert again.state["paid"] is False and again.state["shipped"] is True
        assert one.state["paid"] is False and one.state["shipped"] is True

    run(make, body)


def test_a_dict_written_to_an_app_key_replaces_the_old_dict(make):
    async def body(s):
        one = await s.create_session(
            app_name="shop", user_id="ann", session_id="s1", state={"app:rates": {"eur": 1, "usd": 2}}
        )
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(**{"app:rates": {"gbp": 3}})))
        two = await s.create_session(app_name="shop", user_id="bob", session_id="s2")
        assert two.state["app:rates"] == {"gbp": 3} and one.state["app:rates"] == {"gbp": 3}

    run(make, body)


def test_none_written_to_a_user_key_is_kept_as_none(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"user:theme": "dark"})
        await s.append_event(one, Event(invocation_id="i", author="user", actions=delta(**{"user:theme": None})))
        two = await s.create_session(app_name="shop", user_id="ann", session_id="s2")
        assert "user:theme" in two.state and two.state["user:theme"] is None
        assert "user:theme" in one.state and one.state["user:theme"] is None

    run(make, body)


def test_temp_keys_live_in_memory_and_are_never_stored(make, tmp_path: Path):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1", state={"temp:seed": 7})
        ev = Event(invocation_id="i", author="user", actions=delta(**{"temp:scratch": "x", "kept": "y"}))
        await s.append_event(one, ev)
        assert one.state["temp:scratch"] == "x" and one.state["kept"] == "y"
        assert "temp:scratch" not in ev.actions.state_delta and ev.actions.state_delta["kept"] == "y"
        again = await s.get_session(app_name="shop", user_id="ann", session_id="s1")
        assert again.state == {"kept": "y"}
        assert "temp:scratch" not in again.events[0].actions.state_delta

    run(make, body)


def test_a_temp_key_is_seen_by_the_next_event_of_the_run(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann", session_id="s1")
        ev = Event(invocation_id="i", author="planner", actions=delta(**{"temp:plan": "three steps"}))
        await s.append_event(one, ev)
        assert one.state["temp:plan"] == "three steps"
        assert "temp:plan" not in ev.actions.state_delta

    run(make, body)


def test_one_session_id_under_two_users_is_two_sessions(make):
    async def body(s):
        ann = await s.create_session(app_name="shop", user_id="ann", session_id="same")
        await s.append_event(ann, Event(invocation_id="i", author="user"))
        await s.create_session(app_name="shop", user_id="bob", session_id="same")
        bob = await s.get_session(app_name="shop", user_id="bob", session_id="same")
        assert bob.user_id == "bob" and bob.events == []
        assert len((await s.get_session(app_name="shop", user_id="ann", session_id="same")).events) == 1

    run(make, body)


def test_creating_an_existing_session_raises_already_exists(make):
    async def body(s):
        await s.create_session(app_name="shop", user_id="ann", session_id="dup", state={"v": 1})
        with pytest.raises(AlreadyExistsError):
            await s.create_session(app_name="shop", user_id="ann", session_id="dup", state={"v": 2})
        assert (await s.get_session(app_name="shop", user_id="ann", session_id="dup")).state == {"v": 1}

    run(make, body)


def test_a_padded_id_reaches_the_stripped_session_on_every_call(make):
    async def body(s):
        made = await s.create_session(app_name="shop", user_id="ann", session_id="  order-7\t", state={"n": 7})
        assert made.id == "order-7"
        got = await s.get_session(app_name="shop", user_id="ann", session_id="\norder-7 ")
        assert got is not None and got.id == "order-7" and got.state == {"n": 7}
        await s.delete_session(app_name="shop", user_id="ann", session_id="order-7 ")
        assert await s.get_session(app_name="shop", user_id="ann", session_id="order-7") is None

    run(make, body)


def test_binary_parts_round_trip_as_bytes(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        content = types.Content(role="user", parts=[types.Part.from_bytes(data=b"\x89PNG\x00\xff", mime_type="image/png")])
        grounding = types.GroundingMetadata(search_entry_point=types.SearchEntryPoint(sdk_blob=b"\x00blob"))
        await s.append_event(one, Event(invocation_id="i", author="user", content=content, grounding_metadata=grounding))
        assert one.events[0].content == content
        got = await s.get_session(app_name="shop", user_id="ann", session_id=one.id)
        assert len(got.events) == 1
        assert got.events[0].content == content and got.events[0].grounding_metadata == grounding

    run(make, body)


def test_every_event_field_round_trips(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        ev = Event(
            invocation_id="inv",
            author="clerk",
            content=types.Content(role="model", parts=[types.Part(text="your order ships today")]),
            turn_complete=True,
            partial=False,
            actions=EventActions(artifact_delta={"invoice.pdf": 2}, transfer_to_agent="billing", escalate=True),
            long_running_tool_ids={"lookup"},
            error_code="E42",
            error_message="partly failed",
            interrupted=True,
            grounding_metadata=types.GroundingMetadata(web_search_queries=["ship date"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=3, candidates_token_count=4, total_token_count=7
            ),
            citation_metadata=types.CitationMetadata(),
            custom_metadata={"trace": "t-1"},
            timestamp=1_650_000_000.25,
            input_transcription=types.Transcription(text="in", finished=True),
            output_transcription=types.Transcription(text="out", finished=False),
        )
        await s.append_event(one, ev)
        assert await s.get_session(app_name="shop", user_id="ann", session_id=one.id) == one

    run(make, body)


def test_tool_confirmations_round_trip(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        ask = ToolConfirmation(hint="refund 20 EUR?", confirmed=False, payload={"order": "o-9", "amount": 20})
        await s.append_event(
            one, Event(invocation_id="i", author="clerk", actions=EventActions(requested_tool_confirmations={"call-1": ask}))
        )
        got = await s.get_session(app_name="shop", user_id="ann", session_id=one.id)
        back = got.events[0].actions.requested_tool_confirmations["call-1"]
        assert (back.hint, back.payload, back.confirmed) == ("refund 20 EUR?", {"order": "o-9", "amount": 20}, False)

    run(make, body)


def test_last_update_time_is_the_events_timestamp(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        created = one.last_update_time
        at = created + 30.5
        await s.append_event(one, Event(invocation_id="i", author="user", timestamp=at))
        assert one.last_update_time == at
        got = await s.get_session(app_name="shop", user_id="ann", session_id=one.id)
        assert got.last_update_time == at and got.last_update_time > created

    run(make, body)


def test_recent_events_and_inclusive_after_timestamp_filter_events(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        base = float(int(time.time()))
        for i in range(1, 7):
            await s.append_event(one, Event(author="user", timestamp=base + i))

        async def times(config=None):
            got = await s.get_session(app_name="shop", user_id="ann", session_id=one.id, config=config)
            return [e.timestamp - base for e in got.events]

        assert await times() == [1, 2, 3, 4, 5, 6]
        assert await times(GetSessionConfig(num_recent_events=0)) == []
        assert await times(GetSessionConfig(num_recent_events=2)) == [5, 6]
        assert await times(GetSessionConfig(after_timestamp=base + 5)) == [5, 6]
        assert await times(GetSessionConfig(after_timestamp=base + 100)) == []
        assert await times(GetSessionConfig(after_timestamp=base + 3, num_recent_events=5)) == [3, 4, 5, 6]
        assert await times(GetSessionConfig(after_timestamp=base + 3, num_recent_events=2)) == [5, 6]

    run(make, body)


def test_partial_events_are_never_stored(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        await s.append_event(one, Event(author="clerk", partial=True, actions=delta(half="yes")))
        assert one.events == [] and "half" not in one.state
        got = await s.get_session(app_name="shop", user_id="ann", session_id=one.id)
        assert got.events == [] and got.state == {}

    run(make, body)


def test_user_state_of_an_unknown_user_is_empty(make):
    async def body(s):
        assert await s.get_user_state(app_name="shop", user_id="nobody") == {}

    run(make, body)


def test_user_state_holds_user_keys_without_their_prefix(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        await s.append_event(
            one, Event(author="system", actions=delta(**{"user:card": {"last4": "4242"}, "page": 2, "app:x": 1}))
        )
        assert await s.get_user_state(app_name="shop", user_id="ann") == {"card": {"last4": "4242"}}

    run(make, body)


def test_user_state_is_per_user(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        await s.append_event(one, Event(author="system", actions=delta(**{"user:pin": "1234"})))
        assert await s.get_user_state(app_name="shop", user_id="bob") == {}

    run(make, body)


def test_user_state_is_per_app(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        await s.append_event(one, Event(author="system", actions=delta(**{"user:pin": "1234"})))
        assert await s.get_user_state(app_name="bank", user_id="ann") == {}

    run(make, body)


def test_user_state_reads_without_a_session_id(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        await s.append_event(one, Event(author="system", actions=delta(**{"user:seen": {"tour": True}})))
        fresh = make()
        try:
            assert await fresh.get_user_state(app_name="shop", user_id="ann") == {"seen": {"tour": True}}
        finally:
            await fresh.close()

    run(make, body)


def test_user_state_holds_the_latest_write(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        for n in (1, 2, 3):
            await s.append_event(one, Event(author="system", actions=delta(**{"user:visits": n})))
        assert (await s.get_user_state(app_name="shop", user_id="ann"))["visits"] == 3

    run(make, body)


def test_event_timestamps_come_back_to_the_exact_float(make):
    async def body(s):
        one = await s.create_session(app_name="shop", user_id="ann")
        # Inside the hour New York lived twice on 2024-11-03, and a float
        # no decimal print of fewer than 17 digits gives back.
        stamps = [1730613600.0, 1730615400.1234567, 0.1 + 0.2 + 1730615401]
        for at in stamps:
            await s.append_event(one, Event(author="user", timestamp=at))
        got = await s.get_session(app_name="shop", user_id="ann", session_id=one.id)
        assert [e.timestamp for e in got.events] == stamps

    run(make, body)
