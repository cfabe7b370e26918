"""A hostile home, from Python: session ids that could leave ``sessions/``
(``../``, NUL) or are too long, a ``sessions/`` folder that is a symlink,
a FIFO or another user's file where a divert file belongs, and the longest
divert line at the limit and one byte past it (docs/STORAGE.md, "Limits").
Each answer says what was wrong; nothing is acknowledged that was not
stored or copied with a receipt."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import turnsafe_store
from turnsafe_store import InvalidSessionId, Store

from conftest import need

# host/src/lines.rs MAX_DIVERT_LINE: 32 MiB of message and 64 KiB of envelope.
MAX_DIVERT_LINE = (32 << 20) + (64 << 10)
MAX_SESSION_ID = 128


@pytest.mark.parametrize("bad", ["../x", "..", "a/b", "a\x00b", "a" * 300, "a" * (MAX_SESSION_ID + 1)])
def test_a_hostile_session_id_is_refused(tmp_path: Path, bad: str):
    home = tmp_path / "home"
    store = Store(home)
    try:
        with pytest.raises(InvalidSessionId) as e:
            store.append(bad, [{"role": "user", "content": "x"}])
        assert "session id" in str(e.value)
        with pytest.raises(InvalidSessionId):
            store.show(bad)
        with pytest.raises(InvalidSessionId):
            turnsafe_store.replay(home, session=bad)
        # The longest id is taken.
        assert store.append("a" * MAX_SESSION_ID, [{"role": "user", "content": "x"}]).persisted
    finally:
        store.close()
    assert not (home / "sessions").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def diverting_home(tmp_path: Path) -> Path:
    """A home whose state.db cannot be opened (a folder in its place)."""
    home = tmp_path / "home"
    (home / "state.db").mkdir(parents=True)
    return home


def append(home: Path, session: str, messages: list) -> turnsafe_store.Outcome:
    store = Store(home)
    try:
        return store.append(session, messages)
    finally:
        store.close()


def handed_back(out: turnsafe_store.Outcome, n: int) -> None:
    assert not out.persisted
    assert out.receipt is None
    assert out.handed_back == n and out.diverted == 0
    assert out.copy["outcome"] == "divert_failed"


def test_a_sessions_folder_that_is_a_symlink_is_not_written_through(tmp_path: Path):
    home = diverting_home(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / "sessions").symlink_to(elsewhere)
    out = append(home, "s1", [{"role": "user", "content": "hi"}])
    handed_back(out, 1)
    assert out.divert_error["errno"] == errno.ELOOP
    assert list(elsewhere.iterdir()) == []


def test_a_divert_file_that_is_a_fifo_hangs_nothing_and_holds_nothing(tmp_path: Path):
    home = diverting_home(tmp_path)
    (home / "sessions").mkdir(mode=0o700)
    fifo = home / "sessions" / "s1.jsonl"
    os.mkfifo(fifo)
    # More than a pipe holds: a write into it would block for ever.
    out = append(home, "s1", [{"role": "user", "content": "x" * 200_000}])
    handed_back(out, 1)
    assert out.divert_error["operation"] == "open"
    assert "a FIFO, not a regular file" in out.divert_error["error"]


def test_another_users_divert_file_is_never_appended_to(tmp_path: Path):
    need(os.geteuid() == 0, "chown to another user needs root")
    home = diverting_home(tmp_path)
    (home / "sessions").mkdir(mode=0o700)
    planted = home / "sessions" / "s1.jsonl"
    planted.write_bytes(b"")
    os.chown(planted, 65534, 65534)
    out = append(home, "s1", [{"role": "user", "content": "mine"}])
    handed_back(out, 1)
    assert out.divert_error["errno"] == errno.EPERM
    assert planted.stat().st_size == 0


def test_a_message_whose_divert_line_is_at_the_limit_is_copied_and_one_byte_more_is_handed_back(tmp_path: Path):
    home = diverting_home(tmp_path)
    # The envelope's size, from an empty message (fixed-width ids and time).
    probe = append(home, "s0", [{"role": "user", "content": ""}])
    envelope = probe.receipt["length"]

    def message(line_len: int) -> list:
        return [{"role": "user", "content": "y" * (line_len - envelope)}]

    at = append(home, "s1", message(MAX_DIVERT_LINE))
    assert at.copy["outcome"] == "diverted"
    assert at.receipt["length"] == MAX_DIVERT_LINE

    past = append(home, "s2", message(MAX_DIVERT_LINE + 1))
    handed_back(past, 1)
    assert past.divert_error["operation"] == "encode"
    assert past.divert_error["error"] == (
        f"a divert line of {MAX_DIVERT_LINE + 1} bytes is longer than the limit of {MAX_DIVERT_LINE} bytes"
    )
    assert not (home / "sessions" / "s2.jsonl").exists()

    # With a database that takes it, the same message is stored: the divert
    # line limit bounds only what can be copied when the database fails.
    healthy = tmp_path / "healthy"
    out = append(healthy, "s2", message(MAX_DIVERT_LINE + 1))
    assert out.persisted


def nest(n: int):
    """``n`` lists, one inside the other, around a number."""
    v = 0
    for _ in range(n):
        v = [v]
    return v


def test_a_message_nested_to_the_limit_is_stored_and_one_level_more_is_refused(tmp_path: Path):
    # python/src/convert.rs MAX_DEPTH: a value 100 levels under the message
    # dict is taken; one level more is a ValueError, and nothing is written.
    store = Store(tmp_path / "home")
    try:
        assert store.append("s1", [{"role": "user", "content": nest(99)}]).persisted
        with pytest.raises(ValueError, match="nested deeper than 100 levels"):
            store.append("s1", [{"role": "user", "content": nest(100)}])
        assert [m["content"] for m in store.show("s1")] == [nest(99)]
    finally:
        store.close()
