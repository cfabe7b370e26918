"""Real failures, as root: `chattr +i` refuses writes that chmod would not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import turnsafe_store
from turnsafe_store import Store, TurnNotPersisted

from conftest import immutable

BATCH = [{"role": "user", "content": "keep me"}, {"role": "assistant", "content": [{"type": "text", "text": "me too"}]}]


def test_an_immutable_db_diverts_with_a_receipt_and_replay_brings_it_back(home: Path):
    Store(home).close()
    with immutable(home / "state.db"):
        store = Store(home)
        out = store.append("s1", BATCH)
        with pytest.raises(TurnNotPersisted) as e:
            out.raise_for_status()
        err = e.value
        assert isinstance(err, turnsafe_store.Error)
        assert err.outcome is out and err.cause == "disk"
        assert "session_persistence_failed:disk" in str(err)
        assert (out.persisted, out.operation, out.cause, out.action) == (False, "append_batch", "disk", "divert")
        assert (out.committed, out.diverted, out.handed_back) == (0, 2, 0)
        assert out.error == "session_persistence_failed:disk"
        r = out.receipt
        assert r["count"] == 2 and Path(r["path"]) == (home / "sessions" / "s1.jsonl").resolve()
        assert out.copy["code"] == "disk.diverted" and r["path"] in json.dumps(out.copy)
        lines = [json.loads(x) for x in Path(r["path"]).read_text().splitlines()]
        assert [x["uid"] for x in lines] == out.uids
        assert out.to_dict()["receipt"] == r
        store.close()
    report = turnsafe_store.replay(home)
    assert (report["replayed"], report["quarantined"]) == (2, 0)
    with Store(home) as s:
        assert s.show("s1") == BATCH
        # Resending the handed-back batch with its uids stores nothing twice.
        again = s.append("s1", BATCH, uids=out.uids)
        assert again.persisted and s.show("s1") == BATCH


def test_an_immutable_home_hands_the_batch_back_and_claims_no_copy(home: Path):
    Store(home).close()
    (home / "sessions").mkdir()
    with immutable(home / "sessions", home / "state.db"):
        store = Store(home)
        out = store.append("s1", BATCH)
        assert not out.persisted and out.cause == "disk"
        assert (out.diverted, out.handed_back) == (0, 2)
        assert out.receipt is None
        assert out.divert_error["operation"] == "open"
        assert out.copy["code"] == "disk.divert_failed"
        assert "a copy was kept" not in json.dumps(out.copy).lower()
        with pytest.raises(TurnNotPersisted) as e:
            out.raise_for_status()
        assert e.value.outcome.handed_back == 2
        store.close()
    assert Store(home).show("s1") == []


def test_a_live_lease_makes_replay_refuse(home: Path):
    Store(home).close()
    with immutable(home / "state.db"):
        s = Store(home)
        assert s.append("s1", BATCH).diverted == 2
        s.close()
    holder = Store(home, holder="other", lease_ttl=60)
    assert holder.append("s1", [{"role": "user", "content": "live"}]).persisted
    with pytest.raises(turnsafe_store.Refused):
        turnsafe_store.replay(home)
    assert turnsafe_store.replay(home, force=True)["replayed"] == 2
    holder.close()
