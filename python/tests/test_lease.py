"""A writer that died does not fence its sessions: its turn lease ends on
evidence that its holder is gone (same boot and pid namespace, and its pid
runs no process or another one; on PostgreSQL also its backend), with the
default 30 s lease. Writers are child Python processes SIGKILLed for real."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from turnsafe_store import Store
from turnsafe_store.agents import TurnsafeSession

# A writer in its own process: it stores one batch, says so, and then waits
# on stdin (alive, holding the lease) until it is killed or told to end.
WRITER = textwrap.dedent(
    """
    import json, sys
    from turnsafe_store import Store
    from turnsafe_store.agents import TurnsafeSession
    import asyncio

    home, db, kind = sys.argv[1], sys.argv[2] or None, sys.argv[3]
    if kind == "session":
        session = TurnsafeSession("chat", home, db=db)
        asyncio.run(session.add_items([{"role": "user", "content": "first"}]))
        out = {"persisted": True}
    else:
        store = Store(home, db=db)
        out = store.append("s1", [{"role": "user", "content": "a"}], uids=["a1"]).to_dict()
    print(json.dumps({"pid": __import__("os").getpid(), "persisted": out["persisted"]}), flush=True)
    sys.stdin.readline()
    """
)


def start_writer(home: Path, db: str | None = None, kind: str = "store") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(home), db or "", kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the writer died before it stored its batch"
    ready = json.loads(line)
    assert ready == {"pid": proc.pid, "persisted": True}
    return proc


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_store_killed_mid_stream_and_restarted_at_once_commits_its_next_batch(home):
    kill9(start_writer(home))
    with Store(home) as store:
        out = store.append("s1", [{"role": "user", "content": "b"}], uids=["b1"])
        assert out.persisted, out.to_dict()
        assert [m["content"] for m in store.show("s1")] == ["a", "b"]


def test_a_live_holder_still_fences_and_the_copy_names_it(home):
    holder = start_writer(home)
    try:
        with Store(home) as store:
            out = store.append("s1", [{"role": "user", "content": "b"}], uids=["b1"]).to_dict()
        assert not out["persisted"] and out["cause"] == "turn_lease", out
        assert out["handed_back"] == 1 and out["receipt"] is None, out
        details = out["copy"]["details"]
        assert details["lease_pid"] == str(holder.pid) and details["lease_place"] == "this_machine", details
        assert f"pid {holder.pid} on this machine" in out["copy"]["body"], out["copy"]
        assert "finish" not in json.dumps(out["copy"])
    finally:
        kill9(holder)


def test_an_agents_session_killed_and_restarted_at_once_adds_its_next_items(home):
    kill9(start_writer(home, kind="session"))
    session = TurnsafeSession("chat", home)
    asyncio.run(session.add_items([{"role": "user", "content": "second"}]))
    items = asyncio.run(session.get_items())
    assert [i["content"] for i in items] == ["first", "second"]


def test_postgres_a_store_killed_and_restarted_at_once_commits_its_next_batch(home, pg):
    url = pg.url(pg.create_db("lease"))
    kill9(start_writer(home, db=url))
    with Store(home, db=url) as store:
        out = store.append("s1", [{"role": "user", "content": "b"}], uids=["b1"])
        assert out.persisted, out.to_dict()
        assert [m["content"] for m in store.show("s1")] == ["a", "b"]
