"""TurnsafeSession on the real OpenAI Agents SDK, with ScriptedModel (no network)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agents import Agent, RunConfig, Runner, SessionSettings
from agents.memory import Session
from agents.testing import ScriptedModel, assistant_message, function_call

import turnsafe_store
from turnsafe_store import Store, TurnNotPersisted
from turnsafe_store.agents import TurnsafeSession, safe_session_id

from conftest import immutable

RUNNERS = ["run", "run_sync", "run_streamed"]


def _run_sync(agent, data, **kw):
    return Runner.run_sync(agent, data, **kw)


async def run_agent(method: str, agent, data, **kw):
    if method == "run":
        return await Runner.run(agent, data, **kw)
    if method == "run_sync":
        return await asyncio.to_thread(_run_sync, agent, data, **kw)
    result = Runner.run_streamed(agent, data, **kw)

    async def drain():
        async for _ in result.stream_events():
            pass

    # A streamed run must end, with its exception if any, never hang.
    await asyncio.wait_for(drain(), timeout=20)
    return result


def session(home, sid="user-42", **kw) -> TurnsafeSession:
    return TurnsafeSession(sid, home, store=Store(home), **kw)


def test_it_is_the_sdks_session_protocol(home):
    s = TurnsafeSession("s", home)
    assert isinstance(s, Session)
    assert s.session_settings == SessionSettings()
    # Sessions on one home share one store, reopened once closed.
    assert TurnsafeSession("t", home).store is s.store
    s.store.close()
    assert TurnsafeSession("t", home).store is not s.store


@pytest.mark.parametrize("method", RUNNERS)
def test_multi_turn_memory(home, method):
    async def main():
        s = session(home)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([assistant_message("San Francisco")])
        r1 = await run_agent(method, agent, "What city is the Golden Gate Bridge in?", session=s)
        assert r1.final_output == "San Francisco"
        model.enqueue([assistant_message("California")])
        r2 = await run_agent(method, agent, "What state is it in?", session=s)
        assert r2.final_output == "California"
        last_input = model.calls[-1].input
        assert len(last_input) == 3
        assert last_input[0]["content"] == "What city is the Golden Gate Bridge in?"
        items = await s.get_items()
        assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]
        # What is read back is what the SDK wrote: the same list a fresh session sees.
        assert await TurnsafeSession("user-42", home).get_items() == items

    asyncio.run(main())


@pytest.mark.parametrize("method", RUNNERS)
def test_tool_calls_and_outputs_round_trip(home, method):
    from agents import function_tool

    @function_tool
    def weather(city: str) -> str:
        """The weather."""
        return f"sunny in {city}"

    async def main():
        s = session(home)
        model = ScriptedModel()
        agent = Agent(name="test", model=model, tools=[weather])
        model.enqueue([function_call("weather", {"city": "Kraków"}, call_id="c1")])
        model.enqueue([assistant_message("It is sunny.")])
        r = await run_agent(method, agent, "Weather?", session=s)
        assert r.final_output == "It is sunny."
        items = await s.get_items()
        types = [i.get("type", "message") for i in items]
        assert types == ["message", "function_call", "function_call_output", "message"]
        call = items[1]
        assert "role" not in call and call["call_id"] == "c1" and json.loads(call["arguments"]) == {"city": "Kraków"}
        assert items[2]["output"] == "sunny in Kraków"
        # The next turn sees the whole history, tool items included.
        model.enqueue([assistant_message("Still sunny.")])
        await run_agent(method, agent, "And now?", session=s)
        assert len(model.calls[-1].input) == 5

    asyncio.run(main())


@pytest.mark.parametrize("method", RUNNERS)
def test_separate_sessions_do_not_mix(home, method):
    async def main():
        a, b = session(home, "a"), TurnsafeSession("b", home)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([assistant_message("for a")])
        await run_agent(method, agent, "hello a", session=a)
        model.enqueue([assistant_message("for b")])
        await run_agent(method, agent, "hello b", session=b)
        assert [i["content"] for i in await a.get_items() if i.get("role") == "user"] == ["hello a"]
        assert [i["content"] for i in await b.get_items() if i.get("role") == "user"] == ["hello b"]
        assert len(model.calls[-1].input) == 1

    asyncio.run(main())


def test_limit_settings_and_explicit_override(home):
    async def main():
        s = session(home, session_settings=SessionSettings(limit=3))
        await s.add_items([{"role": "user", "content": f"m{i}"} for i in range(6)])
        assert [i["content"] for i in await s.get_items()] == ["m3", "m4", "m5"]
        assert [i["content"] for i in await s.get_items(limit=2)] == ["m4", "m5"]
        assert [i["content"] for i in await s.get_items(limit=10)] == [f"m{i}" for i in range(6)]
        assert await s.get_items(limit=0) == []
        assert len(await s.get_items(limit=-1)) == 6
        d = TurnsafeSession("user-42", home, session_settings={"limit": 1})
        assert [i["content"] for i in await d.get_items()] == ["m5"]

    asyncio.run(main())


@pytest.mark.parametrize("method", RUNNERS)
def test_the_runner_honours_the_session_limit(home, method):
    async def main():
        s = session(home, session_settings=SessionSettings(limit=2))
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        for i in range(3):
            model.enqueue([assistant_message(f"reply {i}")])
            await run_agent(method, agent, f"turn {i}", session=s)
        assert len(model.calls[-1].input) == 3  # two from history, one new

    asyncio.run(main())


def test_pop_item_and_clear_session(home):
    async def main():
        s = session(home)
        assert await s.pop_item() is None
        await s.add_items([{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}])
        assert await s.pop_item() == {"role": "assistant", "content": "two"}
        assert await s.get_items() == [{"role": "user", "content": "one"}]
        await s.add_items([{"role": "user", "content": "three"}])
        assert [i["content"] for i in await s.get_items()] == ["one", "three"]
        await s.clear_session()
        assert await s.get_items() == []
        assert await s.pop_item() is None

    asyncio.run(main())


@pytest.mark.parametrize("method", RUNNERS)
def test_session_input_callback(home, method):
    async def main():
        s = session(home)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([assistant_message("first")])
        await run_agent(method, agent, "one", session=s)

        def keep_last_user(history, new_input):
            users = [i for i in history if i.get("role") == "user"]
            return users[-1:] + new_input

        model.enqueue([assistant_message("second")])
        await run_agent(method, agent, "two", session=s, run_config=RunConfig(session_input_callback=keep_last_user))
        assert [i.get("content") for i in model.calls[-1].input] == ["one", "two"]
        assert len(await s.get_items()) == 4

    asyncio.run(main())


def test_unicode_and_sql_looking_content(home):
    async def main():
        s = session(home)
        items = [
            {"role": "user", "content": "こんにちは 🦀 żółć"},
            {"role": "user", "content": "'; DROP TABLE messages; --"},
            {"role": "assistant", "content": "Robert'); DELETE FROM sessions WHERE ('1'='1"},
            {"role": "user", "content": 'quotes " and \\ backslashes %s ?1 :name'},
        ]
        await s.add_items(items)
        assert await s.get_items() == items

    asyncio.run(main())


def test_concurrent_writers_on_one_session(home):
    async def main():
        s = TurnsafeSession("shared", home)
        others = [TurnsafeSession("shared", home) for _ in range(3)]

        async def writer(sess, w):
            for b in range(5):
                await sess.add_items([{"role": "user", "content": f"w{w} b{b} m{i}"} for i in range(4)])

        await asyncio.gather(*(writer(x, w) for w, x in enumerate([s, *others])))
        items = await s.get_items()
        assert len(items) == 4 * 5 * 4
        for w in range(4):
            mine = [i["content"] for i in items if i["content"].startswith(f"w{w} ")]
            assert mine == [f"w{w} b{b} m{i}" for b in range(5) for i in range(4)], "each writer's order kept"

    asyncio.run(main())


def test_free_session_ids_map_to_stable_safe_ids(home):
    async def main():
        weird = "user 42/ü..\\x"
        s = TurnsafeSession(weird, home)
        assert s.session_id == weird
        assert s.turnsafe_id == safe_session_id(weird) == TurnsafeSession(weird, home).turnsafe_id
        assert s.turnsafe_id != safe_session_id(weird + "!")
        await s.add_items([{"role": "user", "content": "hi"}])
        assert await TurnsafeSession(weird, home).get_items() == [{"role": "user", "content": "hi"}]
        assert safe_session_id("plain-id") == "plain-id"
        assert safe_session_id("") != safe_session_id(" ")

    asyncio.run(main())


# ------------------------------------------------------------ real failures


@pytest.mark.parametrize("method", RUNNERS)
def test_a_read_only_home_ends_the_run_with_turn_not_persisted(home, method):
    async def main():
        s = session(home)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([assistant_message("before")])
        await run_agent(method, agent, "first turn", session=s)
        s.store.close()
        with immutable(home / "state.db"):
            s2 = TurnsafeSession("user-42", home, store=Store(home))
            model.enqueue([assistant_message("lost?")])
            with pytest.raises(TurnNotPersisted) as e:
                await run_agent(method, agent, "second turn", session=s2)
            out = e.value.outcome
            assert (out.cause, out.action, out.persisted) == ("disk", "divert", False)
            assert out.receipt and out.receipt["count"] == out.diverted > 0
            assert out.copy["code"] == "disk.diverted" and out.capture is None
            s2.store.close()
        # Replay brings the diverted items back, in place.
        assert turnsafe_store.replay(home)["replayed"] == out.diverted
        items = await TurnsafeSession("user-42", home, store=Store(home)).get_items()
        assert [i.get("content") for i in items if i.get("role") == "user"] == ["first turn", "second turn"]

    asyncio.run(main())


def test_a_resend_after_failure_keeps_its_uids_and_replay_plus_resend_store_once(home):
    async def main():
        Store(home).close()
        batch = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]
        with immutable(home / "state.db"):
            s = TurnsafeSession("s1", home, store=Store(home))
            with pytest.raises(TurnNotPersisted) as e1:
                await s.add_items(batch)
            with pytest.raises(TurnNotPersisted) as e2:
                await s.add_items(batch)
            assert e2.value.outcome.uids == e1.value.outcome.uids
            assert e2.value.outcome.minted_uids == []
            s.store.close()
        s.store = Store(home)
        report = turnsafe_store.replay(home)
        assert (report["replayed"], report["duplicate"]) == (2, 2)
        await s.add_items(batch)  # the resend, with the same uids
        assert await s.get_items() == batch
        assert len(s.store.rows("s1")) == 2

    asyncio.run(main())


def test_pop_and_clear_failures_raise_error_with_the_cause(home):
    async def main():
        s = TurnsafeSession("s1", home, store=Store(home))
        await s.add_items([{"role": "user", "content": "x"}])
        s.store.close()
        with immutable(home / "state.db"):
            s.store = Store(home)
            for call in (s.pop_item, s.clear_session):
                with pytest.raises(turnsafe_store.Error) as e:
                    await call()
                assert not isinstance(e.value, TurnNotPersisted)
                assert e.value.cause == "disk", e.value
            s.store.close()
        s.store = Store(home)
        assert await s.get_items() == [{"role": "user", "content": "x"}]

    asyncio.run(main())


def test_clear_session_settles_pending_divert_lines_as_cleared(home):
    async def main():
        s = TurnsafeSession("s1", home, store=Store(home))
        await s.add_items([{"role": "user", "content": "kept"}])
        s.store.close()
        with immutable(home / "state.db"):
            s.store = Store(home)
            with pytest.raises(TurnNotPersisted):
                await s.add_items([{"role": "user", "content": "diverted"}])
            s.store.close()
        s.store = Store(home)
        await s.clear_session()
        assert await s.get_items() == []
        ledger = [json.loads(x) for x in (home / "sessions" / "ledger.jsonl").read_text().splitlines()]
        assert [(x["state"], x["session"]) for x in ledger] == [("cleared", "s1")]
        assert not (home / "sessions" / "s1.jsonl").exists()
        assert turnsafe_store.replay(home)["lines"] == 0
        assert await s.get_items() == []
        assert turnsafe_store.doctor(home)["facts"]["pending_divert_files"] == 0

    asyncio.run(main())


def hold_lock(db: Path, seconds: float) -> subprocess.Popen:
    script = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('ready', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "c.execute('COMMIT')\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("seconds, persisted", [(1.0, True), (7.0, False)])
def test_a_lock_held_by_another_process(home, seconds, persisted):
    async def main():
        s = session(home)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([assistant_message("warm")])
        await Runner.run(agent, "warm", session=s)
        locker = hold_lock(home / "state.db", seconds)
        model.enqueue([assistant_message("after the lock")])
        t = time.monotonic()
        try:
            if persisted:
                r = await Runner.run(agent, "while locked", session=s)
                assert r.final_output == "after the lock"
                assert len(await s.get_items()) == 4
            else:
                with pytest.raises(TurnNotPersisted) as e:
                    await Runner.run(agent, "while locked", session=s)
                out = e.value.outcome
                assert (out.cause, out.action) == ("locked", "divert") and out.attempts > 2
                assert out.receipt is not None
                assert time.monotonic() - t < seconds, "gave up within the policy's patience"
        finally:
            locker.wait()

    asyncio.run(main())


def test_a_corrupt_state_db(home):
    async def main():
        Store(home).close()
        db = home / "state.db"
        with open(db, "r+b") as f:
            f.write(b"this is not a database at all" * 8)
        s = session(home)
        model = ScriptedModel()
        model.enqueue([assistant_message("hi")])
        # The run reads the history first: it fails, naming the cause, before
        # the model is called and before any input is taken.
        with pytest.raises(turnsafe_store.Error) as e:
            await Runner.run(Agent(name="t", model=model), "hello", session=s)
        assert e.value.cause == "corrupt" and not isinstance(e.value, TurnNotPersisted)
        assert model.calls == ()
        # A batch written anyway is diverted, never written into the file.
        before = db.read_bytes()
        with pytest.raises(TurnNotPersisted) as e:
            await s.add_items([{"role": "user", "content": "hello"}])
        out = e.value.outcome
        assert (out.cause, out.action, out.operation) == ("corrupt", "divert", "open")
        assert out.receipt is not None and out.diverted == 1
        assert db.read_bytes() == before

    asyncio.run(main())


def test_a_file_where_sessions_should_be(home):
    async def main():
        Store(home).close()
        (home / "sessions").write_text("not a folder")
        with immutable(home / "state.db"):
            s = session(home)
            model = ScriptedModel()
            model.enqueue([assistant_message("hi")])
            with pytest.raises(TurnNotPersisted) as e:
                await Runner.run(Agent(name="t", model=model), "hello", session=s)
            out = e.value.outcome
            assert out.cause == "disk" and out.diverted == 0 and out.handed_back > 0
            assert out.divert_error is not None and out.receipt is None
            assert "a copy was kept" not in json.dumps(out.copy).lower()
            s.store.close()
        assert (home / "sessions").read_text() == "not a folder"

    asyncio.run(main())


@pytest.mark.parametrize("method", RUNNERS)
def test_what_the_sdk_adds_is_exactly_what_it_gets_back(home, method):
    from agents import function_tool

    @function_tool
    def lookup(q: str) -> str:
        """Look up."""
        return "found " + q

    async def main():
        s = session(home)
        added = []
        real_add = s.add_items

        async def recording_add(items):
            added.extend(json.loads(json.dumps(items)))
            await real_add(items)

        s.add_items = recording_add
        model = ScriptedModel()
        agent = Agent(name="test", model=model, tools=[lookup])
        model.enqueue([function_call("lookup", {"q": "x"}, call_id="c9")])
        model.enqueue([assistant_message("answer")])
        await run_agent(method, agent, [{"role": "user", "content": [{"type": "input_text", "text": "q?"}]}], session=s)
        assert added and await s.get_items() == added

    asyncio.run(main())


def test_the_event_loop_keeps_running_while_a_write_waits(home):
    async def main():
        s = session(home)
        await s.add_items([{"role": "user", "content": "warm"}])
        locker = hold_lock(home / "state.db", 1.0)
        ticks = 0
        done = False

        async def ticker():
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        try:
            await s.add_items([{"role": "user", "content": "waits for the lock"}])
        finally:
            done = True
            await t
            locker.wait()
        assert ticks > 30, f"the loop ran {ticks} times while add_items waited about 1 s"

    asyncio.run(main())


FD_CHILD = r'''
import asyncio, json, os, sys
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
from agents import Agent, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
import turnsafe_store
from turnsafe_store.agents import TurnsafeSession

from fd_exhaust import exhaust

home, mode = sys.argv[1], sys.argv[2]


@function_tool
def leak() -> str:
    """A tool that leaks every descriptor the process has left."""
    return f"errno {exhaust()}"


async def main():
    model = ScriptedModel()
    agent = Agent(name="t", model=model, tools=[leak])
    # The thread pool the session runs its blocking calls on exists first.
    await asyncio.to_thread(lambda: None)
    if mode == "before":
        errno = exhaust()
        session = TurnsafeSession("fd-user", home)
        model.enqueue([assistant_message("never said")])
        try:
            await Runner.run(agent, "hello", session=session)
            print(json.dumps({"ran": True, "errno": errno}))
        except turnsafe_store.Error as e:
            print(json.dumps({"error": str(e), "cause": e.cause, "errno": errno,
                              "model_calls": len(model.calls), "type": type(e).__name__}))
        return
    session = TurnsafeSession("fd-user", home)
    model.enqueue([function_call("leak", {}, call_id="c1")])
    model.enqueue([assistant_message("done")])
    r = await Runner.run(agent, "leak please", session=session)
    print(json.dumps({"ran": True, "final": r.final_output, "items": await session.get_items()}))


asyncio.run(main())
'''


def run_fd_child(home, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FD_CHILD, str(home), mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fd_exhaustion_inside_a_run_costs_no_turn(home):
    """A tool leaks every descriptor mid-run (setrlimit in a child): the
    store already holds its files, so the turn is committed; recounted from
    disk by another process."""
    got = run_fd_child(home, "tool")
    assert got["ran"] and got["final"] == "done"
    items = got["items"]
    assert [i.get("type", "message") for i in items] == ["message", "function_call", "function_call_output", "message"]
    assert items[2]["output"] == "errno 24", "the tool really ran out of descriptors"
    stored = Store(home)
    try:
        assert stored.show(safe_session_id("fd-user")) == items
    finally:
        stored.close()
    assert not (home / "sessions").exists(), "nothing was diverted"


def test_fd_exhaustion_before_the_store_opens_fails_the_run_before_the_model(home):
    """No descriptor is left when the session is made: the run fails loudly,
    naming the cause, before the model is called or any input is taken, and
    nothing is stored or claimed anywhere."""
    got = run_fd_child(home, "before")
    assert got.get("errno") == 24, got
    assert "ran" not in got, got
    assert got["cause"] == "disk", got
    assert got["model_calls"] == 0
    assert not (home / "sessions").exists()
    stored = Store(home)
    try:
        assert stored.show(safe_session_id("fd-user")) == []
    finally:
        stored.close()
