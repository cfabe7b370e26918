"""Real failures caused in Python's own sqlite3. Each must get the cause and
action the Rust host gets for the same failure (its scenario tests assert
the same pairs), and the copy must match what actually happened."""

import hashlib
import json
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import native, turnsafe_bin
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


def native_rows(db: Path, session: str) -> list:
    """The rows the native replay stored, read from its database directly."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [(uid, seq, json.loads(item)) for uid, seq, item in c.execute(
            "SELECT uid, seq, item FROM messages WHERE session_id = ? ORDER BY seq", (session,))]
    finally:
        c.close()


def diverted_lines(receipt: dict) -> list:
    data = Path(receipt["path"]).read_bytes()[receipt["offset"]:receipt["offset"] + receipt["length"]]
    assert hashlib.sha256(data).hexdigest() == receipt["sha256"]
    return [json.loads(line) for line in data.decode().splitlines()]


def test_divert_lines_follow_the_shared_format(policy, tmp_path):
    """The Python writer diverts now (one batch past a real SQLITE_FULL, with
    its seqs known; one from a writer that never opened its database, seq
    null), and the native `turnsafe replay` stores exactly those values:
    each uid at its seq (null: appended), each message as diverted, and a
    `replayed` ledger line per uid."""
    home = tmp_path / "home"
    home.mkdir()
    # The Python writer's own database lies outside the home: the home's
    # state.db is the native store the replay creates.
    w = SessionWriter(home, "py-session", policy, db_uri=f"file:{tmp_path / 'python.db'}")
    first = [{"role": "user", "content": "committed", "uid": "py-0a"},
             {"role": "assistant", "content": "also committed", "uid": "py-0b"}]
    assert w.append(first)["persisted"]
    pages = w.conn.execute("PRAGMA page_count").fetchone()[0]
    w.conn.execute(f"PRAGMA max_page_count = {pages}")  # the database is full from here
    kept = [{"role": "user", "content": "h\u00e9llo \u2713 " + "x" * 20000, "uid": "py-1"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi", "n": 1.5, "ok": True, "none": None}],
             "uid": "py-2", "extra": {"nested": ["a", 2]}}]
    out = w.append(kept)
    assert (out["persisted"], out["cause"], out["diverted"]) == (False, "disk_full", 2), out
    w.conn.close()

    unopened = SessionWriter(home, "py-unopened", policy, db_uri=f"file:{tmp_path / 'no' / 'such.db'}")
    orphans = [{"role": "user", "content": "never stored", "uid": "py-3"},
               {"role": "assistant", "content": "nor this", "uid": "py-4"}]
    out2 = unopened.append(orphans)
    assert (out2["persisted"], out2["cause"], out2["diverted"]) == (False, "disk", 2), out2

    lines = diverted_lines(out["receipt"])
    assert [(line["v"], line["session"], line["uid"], line["seq"], line["cause"], line["message"])
            for line in lines] == [(1, "py-session", m["uid"], 3 + i, "disk_full", m) for i, m in enumerate(kept)]
    null_lines = diverted_lines(out2["receipt"])
    assert [(line["session"], line["uid"], line["seq"], line["message"]) for line in null_lines] == \
        [("py-unopened", m["uid"], None, m) for m in orphans]

    proc = subprocess.run([turnsafe_bin(), "replay", "--home", str(home), "--json"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    summary = [r["data"] for r in records if r["type"] == "summary"]
    assert [(s["lines"], s["replayed"], s["duplicate"], s["quarantined"]) for s in summary] == [(4, 4, 0, 0)], records

    # Version 1 lines carry the uid inside the message; the store keeps it beside.
    def stored(m: dict) -> dict:
        return {k: v for k, v in m.items() if k != "uid"}

    db = home / "state.db"
    assert native_rows(db, "py-session") == [(line["uid"], line["seq"], stored(line["message"])) for line in lines]
    assert native_rows(db, "py-unopened") == [(m["uid"], 1 + i, stored(m)) for i, m in enumerate(orphans)]
    ledger = [json.loads(line) for line in (home / "sessions" / "ledger.jsonl").read_text().splitlines()]
    assert sorted((e["session"], e["uid"], e["state"]) for e in ledger) == sorted(
        [("py-session", m["uid"], "replayed") for m in kept] + [("py-unopened", m["uid"], "replayed") for m in orphans])
