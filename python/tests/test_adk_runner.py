"""A real ADK Runner on TurnsafeSessionService, with a scripted model
(adk_script.py): a new process resumes the session; a storage failure in
the middle of a run raises TurnNotPersisted with a receipt and, after
`turnsafe replay`, the session holds every event once; two Runners in two
processes on one session: the stale one gets ADK's StaleSessionError and
no event is lost."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import pytest

import adk_script
import turnsafe_store
from adk_script import APP, SESSION, USER
from conftest import immutable
from turnsafe_store import TurnNotPersisted
from turnsafe_store.adk import TurnsafeSessionService, adk_session_id

HERE = Path(__file__).parent


@pytest.fixture(params=["sqlite", "postgres"])
def db(request) -> Optional[str]:
    """None for SQLite under the home, else a PostgreSQL server's URL."""
    if request.param == "sqlite":
        return None
    pg = request.getfixturevalue("pg")
    return pg.url(pg.create_db("adkrunner"))


def start_child(mode: str, home: Path, *texts: str, db: Optional[str] = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "adk_script.py", mode, str(home), db or "", *texts],
        cwd=HERE,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def stored(home: Path, db: Optional[str] = None):
    async def read():
        sessions = TurnsafeSessionService(home, db=db)
        try:
            return await sessions.get_session(app_name=APP, user_id=USER, session_id=SESSION)
        finally:
            await sessions.close()

    return asyncio.run(read())


def agent_events(session) -> list:
    return [[e.id, adk_script.said(e)] for e in session.events if e.author != "user"]


def test_a_new_process_resumes_the_session_with_its_whole_history(home: Path, db) -> None:
    first = finish(start_child("create", home, "hello", "add 2 3", db=db))
    assert "error" not in first, first
    assert [s for _, s in first["seen"]] == ["heard 1 contents", "call add", "answer add", "sum is 5"]
    second = finish(start_child("resume", home, "and now?", db=db))
    assert "error" not in second, second
    # The model of the new process was given all seven earlier contents and
    # the new message: the history came back from the store.
    assert [s for _, s in second["seen"]] == ["heard 7 contents"]
    session = stored(home, db)
    assert agent_events(session) == first["seen"] + second["seen"]
    assert [adk_script.said(e) for e in session.events if e.author == "user"] == ["hello", "add 2 3", "and now?"]
    ids = [e.id for e in session.events]
    assert len(ids) == len(set(ids)) == 8


def run_through_a_failure(home: Path, fail: Callable[[], None], lift: Callable[[], None], *, db: Optional[str] = None):
    """A run whose tool call's answer cannot be stored (``fail`` runs in the
    tool): the Runner raises TurnNotPersisted with a receipt, no event is
    taken into the session in memory; ``lift`` ends the failure, replay
    brings the event in, once; the next run goes on from it."""
    seen: list = []

    async def failing_run():
        sessions = TurnsafeSessionService(home, db=db)
        r = adk_script.runner(sessions)
        try:
            await sessions.create_session(app_name=APP, user_id=USER, session_id=SESSION)
            await adk_script.turn(r, "hello", seen)
            adk_script.between = fail
            with pytest.raises(TurnNotPersisted) as e:
                await adk_script.turn(r, "add 2 3", seen)
            return e.value.outcome
        finally:
            adk_script.between = None
            await r.close()
            await sessions.close()

    outcome = asyncio.run(failing_run())
    assert [s for _, s in seen] == ["heard 1 contents", "call add"]
    assert not outcome.persisted and outcome.receipt is not None, outcome.to_dict()
    assert outcome.diverted == 2 and outcome.handed_back == 0, outcome.to_dict()
    receipt = Path(outcome.receipt["path"])
    assert receipt == (home / "sessions" / f"{adk_session_id(APP, USER, SESSION)}.jsonl").resolve()
    lines = [json.loads(x) for x in receipt.read_text().splitlines()]
    kept = [x["message"]["adk"]["event"] for x in lines if x["message"]["adk"]["kind"] == "event"]
    assert len(kept) == 1 and kept[0]["content"]["parts"][0]["function_response"]["name"] == "add"
    lift()
    pending = turnsafe_store.doctor(home, db=db)["facts"]["pending_divert_lines"]
    assert pending["message"] == 2, pending
    report = turnsafe_store.replay(home, db=db)
    assert report["replayed"] == 2 and report["quarantined"] == 0, report
    assert turnsafe_store.replay(home, db=db)["lines"] == 0
    session = stored(home, db)
    # Every event once: the two the Runner yielded, the diverted one, in order.
    assert agent_events(session) == seen + [[kept[0]["id"], "answer add"]]
    assert len({e.id for e in session.events}) == len(session.events) == 5

    async def next_run():
        sessions = TurnsafeSessionService(home, db=db)
        r = adk_script.runner(sessions)
        try:
            more: list = []
            await adk_script.turn(r, "still there?", more)
            return more
        finally:
            await r.close()
            await sessions.close()

    # The history the next run's model sees holds the replayed answer.
    assert [s for _, s in asyncio.run(next_run())] == ["heard 6 contents"]
    return outcome


def test_an_immutable_state_db_diverts_the_event_and_replay_brings_it_once(home: Path) -> None:
    held = []

    def fail():
        cm = immutable(home / "state.db", home / "state.db-wal")
        cm.__enter__()
        held.append(cm)

    def lift():
        held.pop().__exit__(None, None, None)

    out = run_through_a_failure(home, fail, lift)
    assert out.cause == "disk"


def hold_lock_until_told(db: Path) -> subprocess.Popen:
    """Another process holds the write lock of ``db`` until a line reaches
    its stdin."""
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "c.execute('ROLLBACK')\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_lock_held_past_the_patience_diverts_the_event(home: Path) -> None:
    lockers = []

    def fail():
        lockers.append(hold_lock_until_told(home / "state.db"))

    def lift():
        p = lockers.pop()
        p.communicate("go\n", timeout=30)
        assert p.returncode == 0

    out = run_through_a_failure(home, fail, lift)
    assert (out.cause, out.action) == ("locked", "divert") and out.attempts > 2


def test_a_postgres_outage_diverts_the_event_and_replay_brings_it_to_the_server(tmp_path: Path, pg) -> None:
    url = pg.url(pg.create_db("adkrun"))
    out = run_through_a_failure(tmp_path / "home", pg.stop_immediate, pg.start_again, db=url)
    assert out.cause in ("unavailable", "outcome_unknown"), out.to_dict()


def test_descriptor_exhaustion_mid_run_costs_no_event(home: Path) -> None:
    """The tool leaks every descriptor the child has left: the store holds
    its files already, so the tool's answer and the reply are committed,
    and nothing is diverted; counted from the store by another process."""
    got = finish(start_child("create", home, "hello"))
    assert "error" not in got, got
    mid = finish(start_child("emfile", home, "add 4 5"))
    assert mid["errno"] == [24], mid
    assert "error" not in mid and [s for _, s in mid["seen"]] == ["call add", "answer add", "sum is 9"], mid
    assert agent_events(stored(home)) == got["seen"] + mid["seen"]
    assert not (home / "sessions").exists(), "nothing was diverted"


def test_two_runners_in_two_processes_one_gets_stale_session_error_and_no_event_is_lost(home: Path, db) -> None:
    finish(start_child("create", home, "hello", db=db))
    # A's run stores its message and stops in its model call.
    a = start_child("gated", home, "from a", db=db)
    assert a.stdout.readline().strip() == "ready"
    # B loads the session after A's message, stores its own, and stops too.
    b = start_child("gated", home, "from b", db=db)
    assert b.stdout.readline().strip() == "ready"
    # A goes on from a session B has moved past: ADK's stale-writer error,
    # and A's reply is not stored.
    a.stdin.write("go\n")
    a.stdin.flush()
    got_a = finish(a)
    assert got_a["error"] == "StaleSessionError" and got_a["seen"] == [], got_a
    assert "modified in storage" in got_a["message"]
    b.stdin.write("go\n")
    b.stdin.flush()
    got_b = finish(b)
    assert "error" not in got_b and [s for _, s in got_b["seen"]] == ["heard 4 contents"], got_b
    session = stored(home, db)
    said = [(e.author, adk_script.said(e)) for e in session.events]
    assert said == [
        ("user", "hello"),
        ("clerk", "heard 1 contents"),
        ("user", "from a"),
        ("user", "from b"),
        ("clerk", "heard 4 contents"),
    ]
    # Every event a Runner was told is stored, is stored once.
    assert agent_events(session)[-1:] == got_b["seen"]
    assert len({e.id for e in session.events}) == 5


def test_no_descriptor_left_for_the_divert_hands_the_event_back_and_claims_no_copy(home: Path) -> None:
    """state.db turns immutable and the child then has no descriptor left:
    the event can be neither committed nor diverted, so the Runner gets
    TurnNotPersisted saying the batch was handed back, with no receipt, and
    nothing is claimed on disk; the session holds what was stored before."""
    before = finish(start_child("create", home, "hello"))
    child = start_child("held-emfile", home, "add 4 5")
    assert child.stdout.readline().strip() == "ready"
    with immutable(home / "state.db", home / "state.db-wal"):
        child.stdin.write("go\n")
        child.stdin.flush()
        got = finish(child)
    assert got["errno"] == [24], got
    assert got["error"] == "TurnNotPersisted" and got["receipt"] is None, got
    out = got["outcome"]
    assert (out["cause"], out["handed_back"], out["diverted"]) == ("disk", 2, 0), out
    assert out["divert_error"] is not None, out
    assert not (home / "sessions").exists() or not any((home / "sessions").glob("*.jsonl"))
    session = stored(home)
    assert agent_events(session) == before["seen"] + [got["seen"][0]], got


def test_two_runners_racing_on_one_session_lose_no_acknowledged_event(home: Path, db) -> None:
    """Two processes run turns on one session as fast as they can, with no
    coordination: whatever the interleaving, every event a Runner yielded
    is stored exactly once, no reply it was refused is stored, and each of
    the 24 runs either completed or was refused as stale."""
    first = finish(start_child("create", home, "hello", db=db))
    kids = [start_child("race", home, *[f"{who}{i}" for i in range(12)], db=db) for who in ("a", "b")]
    got = [finish(k) for k in kids]
    assert all("error" not in g for g in got), got
    session = stored(home, db)
    ids = [e.id for e in session.events]
    assert len(ids) == len(set(ids))
    acknowledged = {i for g in [first, *got] for i, _ in g["seen"]}
    assert {e.id for e in session.events if e.author != "user"} == acknowledged
    completed = sum(len(g["seen"]) for g in got)
    stale = sum(g["stale"] for g in got)
    assert completed + stale == 24, got
    # A run refused at its reply keeps its user message; one refused at
    # the message stores nothing.
    users = [adk_script.said(e) for e in session.events if e.author == "user"]
    assert users[0] == "hello" and completed <= len(users) - 1 <= 24, (users, completed, stale)
