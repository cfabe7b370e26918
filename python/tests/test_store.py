"""The binding itself: round-trips, the outcome's shape, uids, ids, reports."""

from __future__ import annotations

import json
import subprocess

import pytest

import turnsafe_store
from turnsafe_store import InvalidSessionId, Outcome, Store

from conftest import turnsafe_bin

OUTCOME_KEYS = {
    "persisted", "operation", "cause", "action", "attempts", "committed", "diverted", "handed_back",
    "receipt", "divert_error", "divert_residue", "capture", "copy", "error", "uids", "minted_uids",
    "pending_capture", "durable",
}

SHAPES = [
    {"role": "user", "content": "plain text"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "parts", "annotations": []}]},
    {"role": "system", "content": "", "name": "boot"},
    {"role": "user", "content": "unicode: żółć ✓ 🦀 \u0000 nul", "lang": "pl"},
    {"role": "user", "content": "'); DROP TABLE messages; --", "meta": {"sql": "SELECT * FROM sessions"}},
    {"role": "tool", "content": {"nested": {"deep": [1, -2, 3.25, 1e300, None, True, False]}}},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "arguments": "{\"a\": 1}"}]},
    {"role": "user", "content": 42, "big": 2**63 - 1, "neg": -(2**63), "u64": 2**64 - 1},
    # Items of the Agents SDK without role or content.
    {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\": \"Kraków\"}", "id": "fc_1"},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}], "encrypted_content": None},
    {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
     "content": [{"type": "output_text", "text": "done", "annotations": [], "logprobs": []}]},
    {},
    {"role": 7, "content": "a role that is not a string is just data"},
    {"uid": "its-own-field", "note": "a uid field stays in the message"},
    {"deep": [[[[[[[[[[{"x": "y"}]]]]]]]]]]},
    # The key serde_json reserves for numbers is a key like any other.
    {"role": "tool", "content": {"$serde_json::private::Number": "12"}},
]


def test_every_shape_round_trips_exactly(store: Store):
    out = store.append("s1", SHAPES)
    assert out.persisted, out.to_dict()
    assert out.committed == len(SHAPES)
    assert store.show("s1") == SHAPES
    rows = store.rows("s1")
    assert [r["message"] for r in rows] == SHAPES
    assert [r["uid"] for r in rows] == out.uids
    assert [r["seq"] for r in rows] == list(range(1, len(SHAPES) + 1))


def test_a_message_with_its_own_uid_keeps_it_and_uses_it(store: Store):
    item = {"uid": "mine", "role": "user", "content": "x"}
    out = store.append("s1", [item])
    assert out.uids == ["mine"] and out.minted_uids == []
    assert store.show("s1") == [item]
    assert store.rows("s1") == [{"uid": "mine", "seq": 1, "message": item}]
    # Given uids win; the field stays data.
    out = store.append("s1", [{"uid": "field", "k": 1}], uids=["given"])
    assert out.uids == ["given"] and store.show("s1")[-1] == {"uid": "field", "k": 1}


def test_show_limit_is_the_newest_in_order(store: Store):
    for i in range(7):
        assert store.append("s1", [{"role": "user", "content": f"m{i}"}]).persisted
    assert [m["content"] for m in store.show("s1", limit=3)] == ["m4", "m5", "m6"]
    assert [m["content"] for m in store.show("s1", limit=100)] == [f"m{i}" for i in range(7)]
    assert store.show("s1", limit=0) == []
    assert store.show("nobody") == []
    with pytest.raises(ValueError):
        store.show("s1", limit=-1)


def test_outcome_attributes_and_to_dict(store: Store):
    out = store.append("s1", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert isinstance(out, Outcome)
    d = out.to_dict()
    assert set(d) == OUTCOME_KEYS
    for k in OUTCOME_KEYS:
        assert getattr(out, k) == d[k], k
    assert json.loads(out.to_json()) == d
    assert out.persisted and out.committed == 2 and out.attempts == 1
    assert out.cause is None and out.receipt is None and out.copy is None
    assert out.uids == out.minted_uids and len(set(out.uids)) == 2
    assert out.raise_for_status() is out
    assert "persisted=True" in repr(out)


def test_to_dict_equals_what_turnsafe_append_prints(tmp_path):
    batch = [{"role": "user", "content": "same", "k": [1, 2]}, {"role": "assistant", "content": "batch"}]
    uids = ["u-1", "u-2"]
    cli_line = json.dumps([dict(m, uid=u) for m, u in zip(batch, uids)])
    proc = subprocess.run(
        [turnsafe_bin(), "append", "--home", str(tmp_path / "cli"), "--session", "s1"],
        input=cli_line + "\n", capture_output=True, text=True, check=True,
    )
    printed = json.loads(proc.stdout.splitlines()[0])
    with Store(tmp_path / "py") as s:
        out = s.append("s1", batch, uids=uids)
    assert out.to_dict() == printed


def test_uids_given_are_kept_and_a_resend_stores_nothing_twice(store: Store):
    batch = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    first = store.append("s1", batch)
    again = store.append("s1", batch, uids=first.uids)
    assert again.persisted and again.uids == first.uids and again.minted_uids == []
    assert store.show("s1") == batch
    mixed = store.append("s1", batch, uids=[first.uids[0], None])
    assert mixed.uids[0] == first.uids[0] and mixed.minted_uids == [mixed.uids[1]]
    assert len(store.show("s1")) == 3


def test_a_uid_conflict_is_not_persisted(store: Store):
    assert store.append("s1", [{"role": "user", "content": "x"}], uids=["u1"]).persisted
    out = store.append("s1", [{"role": "user", "content": "DIFFERENT"}], uids=["u1"])
    assert not out.persisted
    with pytest.raises(turnsafe_store.TurnNotPersisted) as e:
        out.raise_for_status()
    assert e.value.outcome is out and e.value.cause == out.cause
    assert store.show("s1") == [{"role": "user", "content": "x"}]


def test_the_number_token_key_is_not_the_number(store: Store):
    # An object keyed `$serde_json::private::Number` is not the number its
    # value spells: a resend is a duplicate, the number is a conflict.
    item = {"role": "tool", "content": {"$serde_json::private::Number": "12"}}
    assert store.append("s1", [item], uids=["u1"]).persisted
    assert store.append("s1", [item], uids=["u1"]).persisted
    out = store.append("s1", [{"role": "tool", "content": 12}], uids=["u1"])
    assert not out.persisted and out.cause == "uid_conflict", out.to_dict()
    assert store.show("s1") == [item]


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "x" * 129, "sp ace", "é"])
def test_a_bad_session_id_is_refused_everywhere(store: Store, home, bad):
    with pytest.raises(InvalidSessionId) as e:
        store.append(bad, [{"role": "user", "content": "x"}])
    assert isinstance(e.value, ValueError) and isinstance(e.value, turnsafe_store.Error)
    for call in (lambda: store.show(bad), lambda: store.rows(bad), lambda: turnsafe_store.replay(home, session=bad)):
        with pytest.raises(InvalidSessionId):
            call()
    assert not (home / "sessions").exists()


def test_bad_arguments_are_type_and_value_errors(store: Store):
    with pytest.raises(TypeError):
        store.append("s1", {"role": "user", "content": "not a list"})
    with pytest.raises(TypeError):
        store.append("s1", ["not a dict"])
    with pytest.raises(TypeError):
        store.append("s1", [{"role": "user", "content": object()}])
    with pytest.raises(TypeError):
        store.append("s1", [{"role": "user", "content": "x", 1: "int key"}])
    with pytest.raises(ValueError):
        store.append("s1", [{"role": "user", "content": float("nan")}])
    with pytest.raises(ValueError):
        store.append("s1", [{"role": "user", "content": 2**64}])
    with pytest.raises(ValueError):
        store.append("s1", [{"role": "user", "content": "x"}], uids=["a", "b"])
    with pytest.raises(ValueError):
        Store(store.home, synchronous="sometimes")
    with pytest.raises(ValueError):
        Store(store.home, lease_ttl=0)
    assert store.show("s1") == []


def test_options_and_close(home):
    with Store(home, synchronous="normal", holder="worker-1", lease_ttl=0.5) as s:
        out = s.append("s1", [{"role": "user", "content": "x"}])
        # Committed without a sync: stored, but not safe from a power cut.
        assert out.persisted and out.durable is False and out.to_dict()["durable"] is False
    with Store(home) as s:
        out = s.append("s1", [{"role": "user", "content": "y"}])
        assert out.persisted and out.durable is True
    with pytest.raises(turnsafe_store.Error):
        s.append("s1", [{"role": "user", "content": "x"}])
    import sqlite3
    row = sqlite3.connect(home / "state.db").execute("SELECT lease_holder FROM sessions").fetchone()
    assert row == (None,), "close gave the lease back"


def test_home_with_a_tilde_is_the_users_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with Store("~/.myagent") as s:
        assert s.append("s1", [{"role": "user", "content": "x"}]).persisted
    assert (tmp_path / ".myagent" / "state.db").is_file()


def test_replay_and_doctor_reports(store: Store, home):
    assert store.append("s1", [{"role": "user", "content": "x"}]).persisted
    r = turnsafe_store.replay(home)
    assert {k: r[k] for k in ("files", "lines", "replayed", "duplicate", "quarantined")} == {
        "files": 0, "lines": 0, "replayed": 0, "duplicate": 0, "quarantined": 0}
    assert r["file_reports"] == [] and r["dry_run"] is False
    d = turnsafe_store.doctor(home)
    assert d["ok"] is True and d["facts"]["pending_divert_files"] == 0
    assert {f["kind"] for f in d["findings"]} >= {"holders"}


def test_the_wheel_carries_no_wasm_engine():
    import pathlib
    so = pathlib.Path(turnsafe_store._native.__file__).read_bytes()
    assert b"wasmtime" not in so and b"cranelift" not in so


def test_search_finds_every_committed_message(store: Store, home):
    store.append("s1", [{"role": "user", "content": "the harbour lighthouse"}, {"type": "function_call", "name": "f"}])
    store.append("s2", [{"role": "assistant", "content": [{"type": "output_text", "text": "a lighthouse keeper"}]}])
    hits = turnsafe_store.search(home, "lighthouse")
    assert sorted((h["session"], h["seq"], h["role"]) for h in hits) == [("s1", 1, "user"), ("s2", 1, "assistant")]
    assert all("[lighthouse]" in h["snippet"] and set(h) == {"session", "uid", "seq", "role", "snippet"} for h in hits)
    assert [h["session"] for h in turnsafe_store.search(home, "lighthouse", session="s2")] == ["s2"]
    assert len(turnsafe_store.search(home, "lighthouse", limit=1)) == 1
    assert turnsafe_store.search(home, "function_call") == []
    with pytest.raises(InvalidSessionId):
        turnsafe_store.search(home, "x", session="../no")
    with pytest.raises(turnsafe_store.Error):
        turnsafe_store.search(home, "   ")
    # Deleted messages leave the index.
    assert store.pop("s2")["content"][0]["text"] == "a lighthouse keeper"
    assert [h["session"] for h in turnsafe_store.search(home, "lighthouse")] == ["s1"]
    assert store.clear("s1") == 2
    assert turnsafe_store.search(home, "lighthouse") == []
    # What the edits took out is still found in the archive, marked so.
    archived = turnsafe_store.search(home, "lighthouse", archived=True)
    assert sorted((h["session"], h["reason"], h["archived"]) for h in archived) == [
        ("s1", "clear", True),
        ("s2", "pop", True),
    ]
    assert all(h["archived_at"].endswith("Z") for h in archived)


def wal_commits(db: str) -> int:
    """Commit frames in the WAL, read from the file itself: a frame whose
    header carries the database size after commit (nonzero), with the
    WAL header's salts. Nothing here asks the store."""
    import struct

    with open(db + "-wal", "rb") as f:
        data = f.read()
    if len(data) < 32:
        return 0
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    commits, off = 0, 32
    while off + 24 + page_size <= len(data):
        header = data[off:off + 24]
        if header[8:16] != salts:
            break
        if struct.unpack(">I", header[4:8])[0] != 0:
            commits += 1
        off += 24 + page_size
    return commits


def test_threads_on_one_store_share_commits(home):
    """Batches that queue while a commit waits go together in the next one."""
    import threading

    store = Store(home)
    assert store.append("warm", [{"role": "user", "content": "first"}]).persisted
    db = str(home / "state.db")
    before = wal_commits(db)
    assert before >= 1

    # Another process's write lock (POSIX locks do not conflict within one
    # process): the first batch waits in its retry loop, well within the
    # policy's patience, while the others queue behind it.
    from test_gil import hold_write_lock

    ready = threading.Event()
    holder = hold_write_lock(db, 0.3, ready)
    assert ready.wait(10)
    outcomes = {}

    def send(i: int) -> None:
        outcomes[i] = store.append(f"t{i}", [{"role": "user", "content": f"thread {i} says {j}"} for j in range(3)])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    holder.join()
    for t in threads:
        t.join()
    assert all(o.persisted for o in outcomes.values()), [o.to_dict() for o in outcomes.values()]
    commits = wal_commits(db) - before
    assert 1 <= commits <= 3, f"8 batches took {commits} commits"
    for i in range(8):
        assert len(store.show(f"t{i}")) == 3
    store.close()
