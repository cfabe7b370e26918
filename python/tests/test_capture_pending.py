"""A pending capture stops the history of the sessions it holds, in Python
too: a store made after the capture diverts their batches, and its reads
raise HistoryIncomplete with the rows and the captures."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from turnsafe_store import Error, HistoryIncomplete, Store
from turnsafe_store.agents import TurnsafeSession


def retire_under(home: Path) -> Path:
    """s1's first turn committed, then its WAL and shm deleted under the
    live store; its next batch captures the retired generation."""
    live = Store(home)
    assert live.append("s1", [{"role": "user", "content": "one", "uid": "m1"},
                              {"role": "assistant", "content": "two", "uid": "m2"}]).persisted
    (home / "state.db-wal").unlink()
    (home / "state.db-shm").unlink()
    out = live.append("s1", [{"role": "user", "content": "three", "uid": "m3"}]).to_dict()
    assert out["cause"] == "deleted_wal", out
    capture = Path(out["capture"]["path"])
    manifest = json.loads((capture / "manifest.json").read_text())
    assert manifest["missing_rows"] == {"s1": 2}, manifest
    live.close()
    return capture


def test_a_new_store_diverts_the_held_session_and_reads_say_incomplete(home: Path):
    capture = retire_under(home)
    store = Store(home)
    out = store.append("s1", [{"role": "user", "content": "four", "uid": "m4"}]).to_dict()
    assert (out["persisted"], out["cause"], out["diverted"]) == (False, "deleted_wal", 1), out
    assert out["pending_capture"] == {"path": str(capture), "cause": "deleted_wal"}
    assert out["receipt"] is not None
    # Another session goes on as usual.
    assert store.append("s2", [{"role": "user", "content": "other"}]).persisted
    assert [m["content"] for m in store.show("s2")] == ["other"]

    for read in (store.show, store.rows):
        with pytest.raises(HistoryIncomplete) as e:
            read("s1")
        assert isinstance(e.value, Error)
        assert e.value.cause == "deleted_wal"
        assert e.value.captures == [{"path": str(capture), "cause": "deleted_wal", "rows": 2}]
        assert e.value.rows == []
    store.close()


def test_turnsafe_session_get_items_raises_history_incomplete(home: Path):
    capture = retire_under(home)

    async def go():
        session = TurnsafeSession("s1", home)
        try:
            with pytest.raises(HistoryIncomplete) as e:
                await session.get_items()
            assert e.value.captures[0]["path"] == str(capture)
        finally:
            session.close()

    asyncio.run(go())
