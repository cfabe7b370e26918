"""Real failures caused in Python's own sqlite3. Each must get the cause and
action the Rust host gets for the same failure (its scenario tests assert
the same pairs), and the copy must match what actually happened."""

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from conftest import native
from session_writer import SessionWriter, observation


def same_as_rust_host(policy, obs: dict, cause: str, action: str):
    ours = policy.decide(obs)
    theirs = json.loads(native("classify", [json.dumps(obs)])[0])
    assert (ours["cause"], ours["action"]) == (cause, action), ours
    assert (theirs["cause"], theirs["action"]) == (cause, action), theirs


def test_missing_directory_is_disk_and_divert_fails_honestly(policy, tmp_path):
    home = tmp_path / "no" / "such" / "home"
    try:
        sqlite3.connect(str(home / "state.db")).execute("CREATE TABLE t(x)")
        raise AssertionError("expected CANTOPEN")
    except sqlite3.Error as e:
        assert e.sqlite_errorcode == 14
        same_as_rust_host(policy, observation("open", e, 1, 0, 1), "disk", "divert")
    out = SessionWriter(home, "s1", policy).append([{"role": "user", "content": "hi"}])
    assert out["persisted"] is False and out["cause"] == "disk"
    assert out["receipt"] is None and out["handed_back"] == 1
    assert out["copy"]["code"] == "disk.divert_failed"
    assert "a copy was kept" not in json.dumps(out["copy"]).lower()


def test_read_only_open_is_disk_and_diverted(policy, tmp_path):
    ok = SessionWriter(tmp_path, "s1", policy)
    assert ok.append([{"role": "user", "content": "first"}])["persisted"]
    ok.conn.close()
    ro = SessionWriter(tmp_path, "s1", policy, db_uri=f"file:{tmp_path / 'state.db'}?mode=ro")
    out = ro.append([{"role": "user", "content": "second", "uid": "u2"}])
    assert (out["cause"], out["action"], out["diverted"]) == ("disk", "divert", 1)
    receipt = out["receipt"]
    data = Path(receipt["path"]).read_bytes()[receipt["offset"]:receipt["offset"] + receipt["length"]]
    import hashlib
    assert hashlib.sha256(data).hexdigest() == receipt["sha256"]
    assert receipt["path"] in out["copy"]["body"]
    c = sqlite3.connect(f"file:{tmp_path / 'state.db'}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as raised:
        c.execute("INSERT INTO messages(session_id, uid, seq, role, content) VALUES ('s','u',1,'r','c')")
    assert raised.value.sqlite_errorcode == 8
    same_as_rust_host(policy, observation("append_batch", raised.value, 1, 0, 1), "disk", "divert")


def test_busy_from_a_second_connection_is_locked_and_retried(policy, tmp_path):
    w = SessionWriter(tmp_path, "s1", policy)
    assert w.append([{"role": "user", "content": "first"}])["persisted"]
    holder = sqlite3.connect(str(tmp_path / "state.db"), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        sqlite3.connect(str(tmp_path / "state.db"), timeout=0, isolation_level=None).execute("BEGIN IMMEDIATE")
        raise AssertionError("expected BUSY")
    except sqlite3.Error as e:
        assert e.sqlite_errorcode == 5
        same_as_rust_host(policy, observation("append_batch", e, 1, 0, 1), "locked", "retry")
    threading.Timer(0.5, lambda: holder.execute("COMMIT")).start()
    started = time.monotonic()
    out = w.append([{"role": "user", "content": "second"}])
    assert out["persisted"] is True and out["attempts"] > 1
    assert time.monotonic() - started >= 0.4


def test_divert_lines_follow_the_shared_format(policy, tmp_path):
    os.mkdir(tmp_path / "state.db")
    out = SessionWriter(tmp_path, "py-session", policy).append(
        [{"role": "user", "content": "hello", "uid": "py-1"}, {"role": "assistant", "content": "hi", "uid": "py-2"}])
    assert out["diverted"] == 2
    lines = [json.loads(line) for line in Path(out["receipt"]["path"]).read_text().splitlines()]
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "diverted.jsonl"
    reference = [json.loads(line) for line in fixture.read_text().splitlines()]
    assert [sorted(line) for line in lines] == [sorted(line) for line in reference]
    assert [line["uid"] for line in lines] == ["py-1", "py-2"]
