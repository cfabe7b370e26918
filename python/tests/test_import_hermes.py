"""`turnsafe import hermes` on homes the real Hermes package writes
(`hermes-agent` 0.19.0's own `hermes_state.SessionDB`), with divert files
in the upstream format and snapshots made by hand: every message compared
field by field with Hermes' own `get_messages(include_inactive=True)`, a
second import adds nothing, the Hermes home keeps every byte, a Hermes
writer appending during the import is waited out or refused."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import turnsafe_store
from conftest import need, turnsafe_bin
from turnsafe_store.agents import safe_session_id

try:
    import hermes_state
except ImportError:  # pragma: no cover - reported by `need` in each test
    hermes_state = None

BOOKKEEPING = ("id", "session_id", "active", "compacted")
S1 = "20260101_090000_a1b2c3"
ODD = "user 42/ü"
S3 = "tg:chat:77"


def need_hermes() -> None:
    need(hermes_state is not None, "hermes-agent 0.19.0 is not installed (pip install --no-deps hermes-agent==0.19.0)")


def divert_line(message: Any) -> str:
    """One message as upstream's divert_session_transcript_jsonl writes it."""
    if not isinstance(message, dict):
        message = {"content": message}
    return json.dumps(message, ensure_ascii=False, default=str) + "\n"


def divert_uid(number: int, message: Any) -> str:
    """The uid of a divert line: its number and its bytes."""
    text = divert_line(message)[:-1].encode("utf-8")
    return f"hermes:jsonl:{number}:{hashlib.sha256(text).hexdigest()[:24]}"


def snapshot_uid(index: int, message: Dict[str, Any]) -> str:
    """The uid of a snapshot's entry: its index and its canonical bytes."""
    text = turnsafe_store.canonical_json(json.dumps(message)).encode("utf-8")
    return f"hermes:json:{index}:{hashlib.sha256(text).hexdigest()[:24]}"


def make_home(root: Path) -> Dict[str, Any]:
    """A Hermes home: several sessions, tool calls, non-ASCII text, a
    compaction, a rewind, a WAL not yet checkpointed (the SessionDB is
    returned open), divert files (one torn, one unreadable line), a snapshot,
    a divert file of a session state.db never got, and Hermes' other files."""
    need_hermes()
    root.mkdir(parents=True)
    db = hermes_state.SessionDB(root / "state.db")
    db.create_session(S1, source="cli", model="gpt-test", system_prompt="be brief")
    db.set_session_title(S1, "Harbour plans")
    db.append_message(S1, "user", "Wie weit ist es zum Hafen? 🚢 żółć")
    db.append_message(
        S1,
        "assistant",
        None,
        tool_calls=[{"id": "call_1", "type": "function", "function": {"name": "distance", "arguments": '{"to": "Hafen"}'}}],
        finish_reason="tool_calls",
        reasoning="I should measure it.",
    )
    db.append_message(S1, "tool", '{"km": 4.2}', tool_call_id="call_1", tool_name="distance")
    db.append_message(S1, "assistant", "4,2 km — etwa 50 Minuten zu Fuß.", finish_reason="stop", token_count=17)
    # Compaction: every active row archived (compacted=1), a summary in their place.
    db.archive_and_compact(
        S1,
        [
            {"role": "user", "content": "[summary] The harbour is 4.2 km away."},
            {"role": "assistant", "content": [{"type": "text", "text": "Noted: 4,2 km."}]},
        ],
    )
    db.append_message(S1, "user", "Und zurück?")
    db.append_message(S1, "assistant", "Dasselbe: 4,2 km.", finish_reason="stop")

    db.create_session(ODD, source="telegram", parent_session_id=S1, model="gpt-test")
    first = db.append_message(ODD, "user", "erste Frage")
    db.append_message(ODD, "assistant", "erste Antwort")
    # Rewind: the user's question and everything after it (active=0, compacted=0).
    db.rewind_to_message(ODD, first)
    db.append_message(ODD, "user", "zweite Frage — 日本語")
    db.append_message(ODD, "assistant", "zweite Antwort")

    db.create_session(S3, source="api")
    db.append_message(S3, "user", "hello")
    db.append_message(S3, "assistant", "hi there")
    db.update_token_counts(S3, input_tokens=11, output_tokens=7)

    sessions = root / "sessions"
    sessions.mkdir(exist_ok=True)
    # S1's divert: its last stored row again, byte for byte (a batch the
    # database had taken, sent again), the words of an earlier row (the
    # user said it again), a lost message, one that is not a dict, an
    # unreadable line, a lost message said twice, a torn last line.
    last = [m for m in db.get_messages(S1, include_inactive=True) if m["active"]][-1]
    with open(sessions / f"{S1}.jsonl", "w", encoding="utf-8") as f:
        f.write(divert_line(expected_item(last)))
        f.write(divert_line({"role": "user", "content": "Und zurück?"}))
        f.write(divert_line({"role": "user", "content": "Und morgen? ☀"}))
        f.write(divert_line("a bare string item"))
        f.write("{this line was damaged\n")
        f.write(divert_line({"role": "user", "content": "ok"}))
        f.write(divert_line({"role": "user", "content": "ok"}))
        f.write('{"role": "assistant", "content": "Morgen sind es auch 4')
    # S3's snapshot: every row (repeats), and one message state.db lacks.
    snapshot = {
        "session_id": S3,
        "model": "gpt-test",
        "base_url": "https://example.invalid/v1",
        "platform": "api",
        "session_start": "2026-01-01T09:00:00",
        "last_updated": "2026-01-01T09:05:00",
        "system_prompt": "",
        "tools": [],
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi there"},
            {"role": "user", "content": "one more, never in state.db"},
        ],
    }
    snapshot["message_count"] = len(snapshot["messages"])
    (sessions / f"session_{S3}.json").write_text(json.dumps(snapshot, indent=2, ensure_ascii=False), encoding="utf-8")
    # A divert of a session whose row never reached state.db.
    (sessions / "ghost-session.jsonl").write_text(divert_line({"role": "user", "content": "lost with its session"}))
    # Hermes' other files: never read as transcripts.
    (sessions / "sessions.json").write_text(json.dumps({"x": {"session_id": S1}}))
    (sessions / "request_dump_1.json").write_text(json.dumps({"messages": [{"role": "user", "content": "dump"}]}))
    wal = root / "state.db-wal"
    assert wal.exists() and wal.stat().st_size > 0, "the WAL must hold frames not yet checkpointed"
    return {"db": db, "root": root, "snapshot": snapshot}


def home_bytes(root: Path) -> Dict[str, bytes]:
    """Every file of the Hermes home but `-shm` (a live Hermes' own)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.endswith("-shm"):
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def run_import(source: Path, home: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [turnsafe_bin(), "import", "hermes", "--source", str(source), "--home", str(home), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def json_lines(out: str) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def stored(home: Path) -> Dict[str, Any]:
    """The turnsafe home's messages, archive and session records."""
    c = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        messages = c.execute("SELECT session_id, uid, seq, item FROM messages ORDER BY session_id, seq, id").fetchall()
        archive = c.execute("SELECT session_id, uid, seq, item, reason, edit FROM archive ORDER BY id").fetchall()
        meta = c.execute("SELECT session_id, origin, origin_id, meta FROM session_meta ORDER BY session_id").fetchall()
        version = c.execute("PRAGMA user_version").fetchone()[0]
    finally:
        c.close()
    return {"messages": messages, "archive": archive, "meta": meta, "version": version}


def expected_item(m: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in m.items() if v is not None and k not in BOOKKEEPING}


def test_every_message_matches_hermes_field_by_field(tmp_path: Path) -> None:
    h = make_home(tmp_path / "hermes")
    source, home = h["root"], tmp_path / "turnsafe"
    before = home_bytes(source)
    r = run_import(source, home, "--json")
    assert r.returncode == 0, r.stderr
    lines = json_lines(r.stdout)
    assert [l["type"] for l in lines] == ["session"] * 4 + ["end"]
    by_hermes = {l["data"]["hermes_id"]: l["data"] for l in lines[:-1]}
    end = lines[-1]["data"]
    # Hermes' id that breaks turnsafe's rules maps as the Python package maps it.
    mapped = safe_session_id(ODD)
    assert mapped != ODD
    assert end["renamed"] == {ODD: mapped}
    assert by_hermes[ODD]["session"] == mapped and by_hermes[ODD]["renamed"] is True
    assert by_hermes[ODD]["parent"] == S1

    s = stored(home)
    assert s["version"] == turnsafe_store.SCHEMA_VERSION == 6
    active = {}
    for sid, uid, seq, item in s["messages"]:
        active.setdefault(sid, []).append((uid, seq, json.loads(item)))
    archived = {(sid, uid): (seq, json.loads(item), reason, edit) for sid, uid, seq, item, reason, edit in s["archive"]}

    db = h["db"]
    # After each session's rows, the divert and snapshot lines it lacked.
    ok = {"role": "user", "content": "ok"}
    lines_after = {
        S1: [
            (divert_uid(2, {"role": "user", "content": "Und zurück?"}), {"role": "user", "content": "Und zurück?"}),
            (divert_uid(3, {"role": "user", "content": "Und morgen? ☀"}), {"role": "user", "content": "Und morgen? ☀"}),
            (divert_uid(4, "a bare string item"), {"content": "a bare string item"}),
            (divert_uid(6, ok), ok),
            (divert_uid(7, ok), ok),
        ],
        ODD: [],
        S3: [(snapshot_uid(2, h["snapshot"]["messages"][2]), h["snapshot"]["messages"][2])],
    }
    for hermes_id in (S1, ODD, S3):
        sid = safe_session_id(hermes_id)
        rows = db.get_messages(hermes_id, include_inactive=True)
        assert rows, hermes_id
        want_active = [(f"hermes:{m['id']}", expected_item(m)) for m in rows if m["active"]]
        # Hermes' order, field by field, then the lines.
        got = [(uid, item) for uid, _, item in active[sid]]
        assert got == want_active + lines_after[hermes_id], hermes_id
        seqs = [seq for uid, seq, _ in active[sid]]
        assert seqs == sorted(seqs)
        for m in rows:
            if m["active"]:
                continue
            seq, item, reason, edit = archived[(sid, f"hermes:{m['id']}")]
            assert item == expected_item(m), m["id"]
            assert reason == ("compaction" if m["compacted"] else "rewind")
            assert edit == "import"
        report = by_hermes[hermes_id]
        assert report["rows"] == len(rows)
        assert report["archived"] == sum(1 for m in rows if not m["active"])

    # Content decoded as Hermes decodes it: a list of parts, not Hermes' prefixed text.
    s1_items = [item for _, _, item in active[S1]]
    assert {"type": "text", "text": "Noted: 4,2 km."} in s1_items[1]["content"]
    tool_calls = [a[1] for a in archived.values() if a[1].get("tool_calls")]
    assert tool_calls[0]["tool_calls"][0]["function"]["name"] == "distance"

    # S1's divert: the last row again settled, the other lines after the
    # rows in file order (the words of an earlier row kept, the message
    # said twice kept twice and its second line reported), the bad line
    # quarantined, the torn line reported.
    r1 = by_hermes[S1]
    assert (r1["lines"], r1["imported"], r1["duplicate"], r1["quarantined"], r1["torn"]) == (6, 4 + 5, 1, 1, 1)
    assert r1["possible_duplicate"] == 1
    assert r1["possible_duplicates"] == [
        {
            "file": str(source / "sessions" / f"{S1}.jsonl"),
            "kind": "divert",
            "line": 7,
            "uid": divert_uid(7, ok),
            "may_repeat": divert_uid(6, ok),
        }
    ]
    assert end["possible_duplicate"] == 1
    quarantine = Path(end["quarantine"])
    assert quarantine == home / "import-quarantine" / "hermes.jsonl"
    q = json_lines(quarantine.read_text(encoding="utf-8"))
    assert [(x["line"], x["text"], x["session"]) for x in q] == [(5, "{this line was damaged", S1)]
    assert oct(quarantine.stat().st_mode & 0o777) == "0o600"

    # S3's snapshot: its first two entries are the rows at their positions,
    # the third extends them (checked above, with its uid).
    r3 = by_hermes[S3]
    assert (r3["lines"], r3["duplicate"], r3["imported"], r3["possible_duplicate"]) == (3, 2, 3, 0)

    # The ghost divert is a session of its own.
    assert by_hermes["ghost-session"]["imported"] == 1
    assert [item for _, _, item in active["ghost-session"]] == [{"role": "user", "content": "lost with its session"}]

    # Session records: title, source, lineage, model, token counts.
    meta = {sid: (origin, origin_id, json.loads(m)) for sid, origin, origin_id, m in s["meta"]}
    origin, origin_id, m1 = meta[S1]
    assert (origin, origin_id) == ("hermes", S1)
    assert m1["hermes"]["title"] == "Harbour plans" and m1["hermes"]["model"] == "gpt-test"
    assert m1["hermes"]["source"] == "cli" and m1["parent"] is None
    assert meta[mapped][1] == ODD and meta[mapped][2]["parent"] == S1
    assert meta[mapped][2]["hermes"]["parent_session_id"] == S1
    assert meta[S3][2]["hermes"]["input_tokens"] == 11 and meta[S3][2]["hermes"]["output_tokens"] == 7

    # The Hermes home kept every byte (and got no new file).
    assert home_bytes(source) == before
    h["db"].close()


def human_lines(d: Dict[str, Any]) -> List[str]:
    """A session's lines of the human report, from its JSON report."""
    line = (
        f"{d['hermes_id']} -> {d['session']}: {d['rows']} rows, {d['lines']} lines: {d['imported']} imported, "
        f"{d['archived']} archived, {d['duplicate']} duplicate, {d['quarantined']} quarantined"
    )
    if d["torn"]:
        line += f", {d['torn']} torn"
    if d["possible_duplicate"]:
        line += f", {d['possible_duplicate']} possible duplicate"
    if d["refused"]:
        line += ", refused"
    marks = [
        f"  possible duplicate: {p['file']} {'line' if p['kind'] == 'divert' else 'message'} {p['line']} "
        f"({p['uid']}) may repeat {p['may_repeat']}"
        for p in d["possible_duplicates"]
    ]
    return [line] + marks


def test_human_output_and_json_agree(tmp_path: Path) -> None:
    h = make_home(tmp_path / "hermes")
    dry = run_import(h["root"], tmp_path / "a", "--dry-run", "--json")
    human = run_import(h["root"], tmp_path / "b")
    assert dry.returncode == 0 and human.returncode == 0, (dry.stderr, human.stderr)
    reports = json_lines(dry.stdout)
    sessions, end = [l["data"] for l in reports[:-1]], reports[-1]["data"]
    assert len(sessions) == end["sessions"] == 4
    want = [text for d in sessions for text in human_lines(d)]
    want.append(
        f"{end['sessions']} sessions, {end['rows']} rows, {end['lines']} lines: {end['imported']} imported, "
        f"{end['archived']} archived, {end['duplicate']} duplicate, {end['quarantined']} quarantined, "
        f"{end['torn']} torn, {end['possible_duplicate']} possible duplicate"
    )
    want.append(f"unreadable lines copied to {tmp_path / 'b' / 'import-quarantine' / 'hermes.jsonl'}")
    got = human.stdout.splitlines()
    assert len(got) == len(want), (got, want)
    assert got == want
    h["db"].close()


def test_second_import_adds_nothing(tmp_path: Path) -> None:
    h = make_home(tmp_path / "hermes")
    source, home = h["root"], tmp_path / "turnsafe"
    first = turnsafe_store.import_hermes(source, home)
    assert first["imported"] > 0 and first["archived"] > 0
    snapshot = stored(home)
    quarantine = (home / "import-quarantine" / "hermes.jsonl").read_bytes()
    second = turnsafe_store.import_hermes(source, home)
    assert (second["imported"], second["archived"]) == (0, 0)
    assert second["duplicate"] == first["imported"] + first["archived"] + first["duplicate"]
    # A possible duplicate is reported by the import that wrote it only.
    assert (first["possible_duplicate"], second["possible_duplicate"]) == (1, 0)
    assert second["quarantined"] == first["quarantined"] == 1
    assert stored(home)["messages"] == snapshot["messages"]
    assert stored(home)["archive"] == snapshot["archive"]
    assert (home / "import-quarantine" / "hermes.jsonl").read_bytes() == quarantine
    # A message popped since the import is not brought back.
    r = subprocess.run([turnsafe_bin(), "pop", "--home", str(home), "--session", S3], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    third = turnsafe_store.import_hermes(source, home)
    assert (third["imported"], third["archived"]) == (0, 0)
    # Hermes writes on; the next import brings exactly the new rows.
    h["db"].append_message(S3, "user", "later")
    fourth = turnsafe_store.import_hermes(source, home, session=S3)
    assert (fourth["sessions"], fourth["imported"]) == (1, 1)
    h["db"].close()


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    h = make_home(tmp_path / "hermes")
    home = tmp_path / "turnsafe"
    dry = turnsafe_store.import_hermes(h["root"], home, dry_run=True)
    assert not home.exists()
    assert dry["dry_run"] is True and dry["imported"] > 0
    real = turnsafe_store.import_hermes(h["root"], home)
    for k in ("imported", "archived", "duplicate", "possible_duplicate", "quarantined", "torn", "rows", "lines"):
        assert dry[k] == real[k], k
    # A dry run over an imported home changes nothing and finds nothing new.
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file() and not p.name.endswith("-shm")}
    again = turnsafe_store.import_hermes(h["root"], home, dry_run=True)
    assert (again["imported"], again["archived"]) == (0, 0)
    after = {p: p.read_bytes() for p in home.rglob("*") if p.is_file() and not p.name.endswith("-shm")}
    assert after == before
    h["db"].close()


def test_home_equal_to_source_is_refused(tmp_path: Path) -> None:
    h = make_home(tmp_path / "hermes")
    source = h["root"]
    before = home_bytes(source)
    link = tmp_path / "same"
    link.symlink_to(source)
    for home in (source, link, source / "turnsafe", link / "sessions" / "t"):
        r = run_import(source, home)
        assert r.returncode == 5, r.stderr
        assert "is the Hermes home itself, or inside it" in r.stderr
    with pytest.raises(turnsafe_store.Refused):
        turnsafe_store.import_hermes(source, link)
    assert home_bytes(source) == before
    h["db"].close()


def test_a_live_turnsafe_lease_refuses_that_session_only(tmp_path: Path) -> None:
    h = make_home(tmp_path / "hermes")
    home = tmp_path / "turnsafe"
    writer = turnsafe_store.Store(home)
    try:
        assert writer.append(S3, [{"role": "user", "content": "mine"}]).persisted
        r = run_import(h["root"], home, "--json")
        assert r.returncode == 5, r.stderr
        assert "live turn lease" in r.stderr
        end = json_lines(r.stdout)[-1]["data"]
        assert end["refused"] == [S3]
        s = stored(home)
        assert [json.loads(i)["content"] for sid, _, _, i in s["messages"] if sid == S3] == ["mine"]
        assert any(sid == S1 for sid, *_ in s["messages"])
    finally:
        writer.close()
    again = run_import(h["root"], home, "--json")
    assert again.returncode == 0, again.stderr
    by = {l["data"]["hermes_id"]: l["data"] for l in json_lines(again.stdout)[:-1]}
    assert by[S3]["imported"] == 3 and by[S1]["imported"] == 0
    # The session's own message stays first; the imported ones follow it.
    s = stored(home)
    s3 = [(seq, json.loads(i)["content"]) for sid, _, seq, i in s["messages"] if sid == S3]
    assert [c for _, c in s3] == ["mine", "hello", "hi there", "one more, never in state.db"]
    assert [q for q, _ in s3] == sorted({q for q, _ in s3})
    h["db"].close()


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import hermes_state
    db = hermes_state.SessionDB(Path(sys.argv[1]) / "state.db")
    seconds = float(sys.argv[2])
    db.create_session("live", source="cli")
    print("ready", flush=True)
    start, n = time.monotonic(), 0
    while seconds <= 0 or time.monotonic() - start < seconds:
        db.append_message("live", "user", f"message {n}")
        n += 1
    print(n, flush=True)
    """
)


def big_home(root: Path) -> Path:
    """A Hermes home large enough that copying it takes longer than the
    gap between a busy writer's commits."""
    need_hermes()
    root.mkdir(parents=True)
    db = hermes_state.SessionDB(root / "state.db")
    db.create_session("big", source="cli")
    chunk = "x" * (1 << 20)
    for i in range(24):
        db.append_message("big", "user", f"{i} {chunk}")
    db.close()
    return root


def start_writer(root: Path, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(0.05)
    return p


def test_a_hermes_writer_that_keeps_writing_is_refused(tmp_path: Path) -> None:
    root = big_home(tmp_path / "hermes")
    home = tmp_path / "turnsafe"
    writer = start_writer(root, 0)
    try:
        r = run_import(root, home, "--json")
    finally:
        writer.kill()
        writer.wait()
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    assert "changed during each of" in r.stderr and "Hermes is idle" in r.stderr
    assert r.stdout == ""
    assert not (home / "state.db").exists()


WRITER_ON_WORD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import hermes_state
    db = hermes_state.SessionDB(Path(sys.argv[1]) / "state.db")
    count = int(sys.argv[2])
    db.create_session("live", source="cli")
    print("ready", flush=True)
    sys.stdin.readline()  # the test's word: the import is inside a copy
    for n in range(count):
        db.append_message("live", "user", f"message {n}")
    db.close()
    print(count, flush=True)
    """
)

F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
F_SETOWN_EX = getattr(fcntl, "F_SETOWN_EX", 15)
F_OWNER_TID = 0


class CopyStop:
    """A point inside the import's copy where it stops until the test lets
    it go: a write lease on an empty `state.db-journal` in the Hermes home
    (a WAL database never opens it; the import copies it after state.db and
    its WAL, between the fingerprints it compares). The import's open of
    the file waits for the lease; the kernel tells this thread (SIGIO), and
    the copy goes on once the lease is given back."""

    def __init__(self, root: Path) -> None:
        self.path = root / "state.db-journal"
        self.path.touch()
        # SIGIO is ignored by the process and blocked in this thread, so
        # it waits here for sigtimedwait and never ends the process.
        self.disposition = signal.signal(signal.SIGIO, signal.SIG_IGN)
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGIO])
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.fcntl(self.fd, F_SETLEASE, fcntl.F_WRLCK)
        except OSError as e:
            self.close()
            need(False, f"a write lease on {self.path} (fcntl F_SETLEASE): {e}")
        try:
            # The break is signalled to this thread, not to any thread of the process.
            fcntl.fcntl(self.fd, F_SETOWN_EX, struct.pack("ii", F_OWNER_TID, threading.get_native_id()))
        except BaseException:
            self.close()
            raise

    def reached(self) -> None:
        """Return once the import has opened the file (the 120 s only bound
        a failure: nothing here waits for time to pass)."""
        got = signal.sigtimedwait([signal.SIGIO], 120)
        assert got is not None, "the import never reached its copy of the Hermes home"

    def close(self) -> None:
        """Give the lease back (the copy goes on) and remove the file."""
        if self.fd is None:
            return
        os.close(self.fd)
        self.fd = None
        while signal.sigtimedwait([signal.SIGIO], 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        signal.signal(signal.SIGIO, self.disposition)
        self.path.unlink(missing_ok=True)


def test_a_hermes_writer_that_stops_is_waited_out(tmp_path: Path) -> None:
    root = big_home(tmp_path / "hermes")
    home = tmp_path / "turnsafe"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_ON_WORD, str(root), "40"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    stop = None
    imp = None
    try:
        assert writer.stdout.readline().strip() == "ready"
        stop = CopyStop(root)
        imp = subprocess.Popen(
            [turnsafe_bin(), "import", "hermes", "--source", str(root), "--home", str(home), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The first copy has fingerprinted the files and copied state.db
        # and its WAL: Hermes writes now, and has stopped (its connection
        # closed) before the copy goes on.
        stop.reached()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        written = int(writer.stdout.readline().strip())
        assert writer.wait(timeout=60) == 0
        stop.close()
        out, err = imp.communicate(timeout=120)
    finally:
        writer.kill()
        writer.wait()
        if stop is not None:
            stop.close()
        if imp is not None and imp.poll() is None:
            imp.kill()
            imp.wait()
    assert imp.returncode == 0, err
    end = json_lines(out)[-1]["data"]
    # The copy Hermes wrote under was taken again; the next one met no writer.
    assert end["copy_attempts"] == 2, end
    # Whatever the copy held is imported; the next import brings the rest,
    # and then every message Hermes holds is there exactly once.
    again = run_import(root, home, "--json")
    assert again.returncode == 0, again.stderr
    s = stored(home)
    live = [json.loads(i)["content"] for sid, _, _, i in s["messages"] if sid == "live"]
    assert live == [f"message {n}" for n in range(written)]
    assert len([1 for sid, *_ in s["messages"] if sid == "big"]) == 24


def test_hermes_ids_map_as_the_python_package_maps_them(tmp_path: Path) -> None:
    """Every Hermes id that breaks turnsafe's session-id rules is stored
    under the id `safe_session_id` gives it (the Rust port and the Python
    function agree), and the report lists each mapping."""
    need_hermes()
    root = tmp_path / "hermes"
    root.mkdir()
    db = hermes_state.SessionDB(root / "state.db")
    ids = [
        "plain_id-1",
        "ok:with.dots",
        "has space",
        "../../etc/passwd",
        ".hidden",
        "a..b",
        "日本語のセッション",
        "emoji 🚢 id",
        "x" * 129,
        "y" * 300 + "/z",
        "tab\tand\nnewline",
    ]
    for i, sid in enumerate(ids):
        db.create_session(sid, source="cli")
        db.append_message(sid, "user", f"message {i}")
    report = turnsafe_store.import_hermes(root, tmp_path / "turnsafe")
    by_hermes = {r["hermes_id"]: r["session"] for r in report["session_reports"]}
    assert set(by_hermes) == set(ids)
    for sid in ids:
        assert by_hermes[sid] == safe_session_id(sid), sid
    assert report["renamed"] == {sid: safe_session_id(sid) for sid in ids if safe_session_id(sid) != sid}
    assert len(report["renamed"]) == 9
    with turnsafe_store.Store(tmp_path / "turnsafe") as store:
        for i, sid in enumerate(ids):
            rows = store.rows(safe_session_id(sid))
            assert [r["message"]["content"] for r in rows] == [f"message {i}"]
    db.close()
