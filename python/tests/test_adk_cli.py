"""The command line sees ADK sessions: `turnsafe show` prints a session's
events under its hashed id, `turnsafe search` finds their text, and
`turnsafe doctor` counts an event diverted while state.db was immutable
until `turnsafe replay` brings it in."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types

from conftest import immutable, turnsafe_bin
from turnsafe_store import TurnNotPersisted
from turnsafe_store.adk import TurnsafeSessionService, adk_session_id


def cli(*args: str, ok=(0,)) -> list:
    out = subprocess.run([turnsafe_bin(), *args, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode in ok, (out.returncode, out.stderr)
    return [json.loads(x) for x in out.stdout.splitlines() if x.strip()]


def said(author: str, text: str, **state) -> Event:
    return Event(
        invocation_id="i",
        author=author,
        content=types.Content(role="user" if author == "user" else "model", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=state),
    )


def test_show_search_and_doctor_see_adk_sessions(home: Path) -> None:
    async def write():
        async with TurnsafeSessionService(home) as s:
            made = await s.create_session(app_name="shop", user_id="ann", session_id="order 42/ü")
            one = said("user", "where is my parcel from Lyon?")
            two = said("clerk", "the parcel left Lyon this morning", step=1)
            await s.append_event(made, one)
            await s.append_event(made, two)
            with immutable(home / "state.db", home / "state.db-wal"):
                with pytest.raises(TurnNotPersisted) as e:
                    await s.append_event(made, said("clerk", "it reaches Nantes tomorrow", step=2))
            return [one.id, two.id], e.value.outcome

    ids, outcome = asyncio.run(write())
    tid = adk_session_id("shop", "ann", "order 42/ü")
    assert Path(outcome.receipt["path"]).name == f"{tid}.jsonl"

    shown = cli("show", "--home", str(home), "--session", tid)
    rows = [x["data"] for x in shown if x["type"] == "message"]
    events = [r for r in rows if r["message"]["adk"]["kind"] == "event"]
    assert [r["uid"] for r in events] == ids
    assert events[1]["message"]["adk"]["event"]["actions"]["state_delta"] == {"step": 1}
    head = rows[0]["message"]["adk"]
    assert (rows[0]["uid"], head["app"], head["user"], head["id"]) == ("adk-session", "shop", "ann", "order 42/ü")

    hits = [x["data"] for x in cli("search", "--home", str(home), "parcel") if x["type"] == "hit"]
    assert sorted((h["session"], h["uid"], h["role"]) for h in hits) == sorted(
        [(tid, ids[0], "user"), (tid, ids[1], "clerk")]
    )

    def pending() -> int:
        facts = [x["data"] for x in cli("doctor", "--home", str(home), ok=(0, 6)) if x["type"] == "facts"]
        return facts[0]["pending_divert_lines"]["message"]

    assert pending() == 2
    cli("replay", "--home", str(home))
    assert pending() == 0
    hits = [x["data"] for x in cli("search", "--home", str(home), "Nantes") if x["type"] == "hit"]
    assert [(h["session"], h["role"]) for h in hits] == [(tid, "clerk")]

    async def read():
        async with TurnsafeSessionService(home) as s:
            return await s.get_session(app_name="shop", user_id="ann", session_id="order 42/ü")

    got = asyncio.run(read())
    assert [e.id for e in got.events][:2] == ids and len(got.events) == 3 and got.state == {"step": 2}
