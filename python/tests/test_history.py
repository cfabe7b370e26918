"""History rewrites from Python: what pop and clear take out is archived
and restorable, fork keeps its lineage and is idempotent, replace_suffix
refuses a changed suffix, and delete_session removes a session for good."""

from __future__ import annotations

import pytest

import turnsafe_store
from turnsafe_store import Store


def msgs(tag: str, n: int) -> list:
    return [{"role": "user", "content": f"{tag} {i}", "uid": f"{tag}-{i}"} for i in range(n)]


def test_pop_clear_show_archived_and_restore(store: Store):
    assert store.append("s1", msgs("a", 3)).persisted
    assert store.pop("s1")["content"] == "a 2"
    assert store.clear("s1") == 2
    assert store.show("s1") == []
    archived = store.show("s1", archived=True)
    # Newest archived first: the clear's two rows (the later seq first),
    # then the pop's.
    assert [(a["uid"], a["seq"], a["reason"]) for a in archived] == [
        ("a-1", 2, "clear"),
        ("a-0", 1, "clear"),
        ("a-2", 3, "pop"),
    ]
    assert [a["message"]["content"] for a in archived] == ["a 1", "a 0", "a 2"]
    assert set(archived[0]) == {"uid", "seq", "message", "archived_at", "reason"}
    report = store.restore("s1", reason="clear")
    assert [r["uid"] for r in report["restored"]] == ["a-0", "a-1"]
    report = store.restore("s1", uids=["a-2", "nope"])
    assert report["not_archived"] == ["nope"]
    assert [m["content"] for m in store.show("s1")] == ["a 0", "a 1", "a 2"]
    with pytest.raises(ValueError):
        store.restore("s1")
    with pytest.raises(ValueError):
        store.restore("s1", reason="vanished")


def test_fork_and_lineage(store: Store):
    assert store.append("s1", msgs("a", 4)).persisted
    assert store.fork("s1", 2, "s2") == {"source": "s1", "at_seq": 2, "session": "s2", "copied": 2, "already": 0}
    assert store.fork("s1", 2, "s2")["already"] == 2
    assert [m["content"] for m in store.show("s2")] == ["a 0", "a 1"]
    assert store.lineage("s2") == {"session": "s1", "seq": 2}
    assert store.lineage("s1") is None
    with pytest.raises(turnsafe_store.Refused):
        store.fork("s1", 3, "s2")


def test_replace_suffix_is_one_transaction_and_refuses_a_changed_suffix(store: Store):
    assert store.append("s1", msgs("a", 4)).persisted
    summary = [{"role": "user", "content": "summary"}]
    assert store.replace_suffix("s1", 3, summary, expected_uids=["a-3"]) is False
    assert len(store.show("s1")) == 4
    assert store.replace_suffix("s1", 3, summary, expected_uids=["a-2", "a-3"]) is True
    assert [m["content"] for m in store.show("s1")] == ["a 0", "a 1", "summary"]
    assert {a["reason"] for a in store.show("s1", archived=True)} == {"compaction"}


def test_delete_session_removes_it_for_good(store: Store):
    assert store.append("s1", msgs("a", 3)).persisted
    store.pop("s1")
    assert store.delete_session("s1") == {"deleted": 2, "archived_deleted": 1}
    assert store.show("s1") == [] and store.show("s1", archived=True) == []
    assert store.append("s1", msgs("b", 1)).persisted, "the id can be used again"
