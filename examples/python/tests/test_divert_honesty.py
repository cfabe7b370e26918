"""The divert is as honest as the native host's, shown with real failures:
a short write (a file size limit in a child process, a full tmpfs), a
cut-back the file system refuses (`chattr +a`: appends allowed, truncation
not, even for root), and the folder fsyncs seen by strace.

Each divert here follows a database that cannot be opened (a folder at the
`state.db` path: cause `disk`, action `divert`)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HERE, need, turnsafe_bin
from session_writer import SessionWriter

# Runs one append in a child process, with RLIMIT_FSIZE set (soft limit
# only, so the child could raise it again) and SIGXFSZ ignored: a write
# that crosses the limit stores what fits and returns that count; the next
# one fails with EFBIG. The policy is instantiated before the limit.
CHILD = r"""
import json, resource, signal, sys
sys.path.insert(0, sys.argv[1])
from session_writer import SessionWriter
args = json.loads(sys.argv[2])
w = SessionWriter(args["home"], args["session"])
w.policy.version()
if args.get("fsize") is not None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (args["fsize"], resource.RLIM_INFINITY))
out = w.append(args["messages"])
print(json.dumps(out), flush=True)
"""


def child_argv(home: Path, messages: list[dict], fsize: int | None = None, session: str = "s1") -> list[str]:
    args = {"home": str(home), "session": session, "messages": messages, "fsize": fsize}
    return [sys.executable, "-c", CHILD, str(HERE), json.dumps(args)]


def append_in_child(home: Path, messages: list[dict], fsize: int | None = None) -> dict:
    proc = subprocess.run(child_argv(home, messages, fsize), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def diverting_home(base: Path) -> Path:
    """A home whose database cannot be opened, so every batch is diverted."""
    home = base / "home"
    home.mkdir(mode=0o700)
    (home / "state.db").mkdir()
    return home


def batch(tag: str, n: int = 3, size: int = 300) -> list[dict]:
    return [{"role": "user", "content": f"{tag}-{i}-" + "x" * size, "uid": f"{tag}-{i}"} for i in range(n)]


def receipt_lines(receipt: dict) -> list[dict]:
    """The lines in the receipt's byte range, read from the file; its sha256
    and count must match what is there."""
    data = Path(receipt["path"]).read_bytes()
    start, end = receipt["offset"], receipt["offset"] + receipt["length"]
    assert end <= len(data), "the receipt names bytes the file does not hold"
    chunk = data[start:end]
    assert hashlib.sha256(chunk).hexdigest() == receipt["sha256"]
    assert chunk.endswith(b"\n") and chunk.count(b"\n") == receipt["count"]
    return [json.loads(line) for line in chunk.splitlines()]


def divert_file(home: Path, session: str = "s1") -> Path:
    return home / "sessions" / f"{session}.jsonl"


def claims_nothing(out: dict) -> None:
    text = json.dumps(out["copy"]).lower()
    assert "a copy was kept" not in text
    assert out["receipt"] is None and out["persisted"] is False


def first_divert(policy, home: Path) -> dict:
    out = SessionWriter(home, "s1", policy).append(batch("first"))
    assert out["copy"]["outcome"] == "diverted", out
    assert [line["uid"] for line in receipt_lines(out["receipt"])] == ["first-0", "first-1", "first-2"]
    return out["receipt"]


def test_a_short_write_is_continued_and_a_failed_divert_is_cut_back(policy, tmp_path):
    home = diverting_home(tmp_path)
    first_divert(policy, home)
    path = divert_file(home)
    before = path.read_bytes()
    # Room for 100 bytes of the next batch: the first write stores them and
    # returns 100, mid-line; only a second write, for the rest, fails.
    out = append_in_child(home, batch("cut"), fsize=len(before) + 100)
    assert out["copy"]["outcome"] == "divert_failed", out
    # EFBIG comes only from a write after the short one: the host went on.
    assert out["divert_error"]["operation"] == "write"
    assert out["divert_error"]["errno"] == errno.EFBIG
    assert out["divert_residue"] is None
    assert out["handed_back"] == 3 and out["uids"] == ["cut-0", "cut-1", "cut-2"]
    claims_nothing(out)
    assert out["copy"]["code"] == "disk.divert_failed"
    # Cut back to where the batch began: the file is exactly what it was.
    assert path.stat().st_size == len(before)
    assert path.read_bytes() == before
    # The next divert's receipt covers exactly its own lines, right after
    # the earlier ones, and nothing of the cut batch is left.
    again = SessionWriter(home, "s1", policy).append(batch("again"))
    assert again["copy"]["outcome"] == "diverted", again
    r = again["receipt"]
    assert r["offset"] == len(before) and r["offset"] + r["length"] == path.stat().st_size
    assert [line["uid"] for line in receipt_lines(r)] == ["again-0", "again-1", "again-2"]
    assert b"cut-0" not in path.read_bytes()


@contextlib.contextmanager
def tmpfs(mountpoint: Path, size: str):
    need(os.geteuid() == 0, "mounting a tmpfs needs root")
    need(shutil.which("mount") is not None, "mount is not installed")
    mountpoint.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mountpoint)],
                       capture_output=True, text=True)
    need(r.returncode == 0, f"mount -t tmpfs: {r.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_a_disk_that_fills_mid_line_is_cut_back(policy, tmp_path):
    with tmpfs(tmp_path / "small", "64k") as mnt:
        home = diverting_home(mnt)
        (home / "sessions").mkdir(mode=0o700)
        filler = home / "filler"
        with open(filler, "wb", buffering=0) as f:
            with pytest.raises(OSError) as full:
                while True:
                    f.write(b"\0" * 4096)
            assert full.value.errno == errno.ENOSPC
            # One page free: the batch (about 10 KB) fits only in part.
            os.ftruncate(f.fileno(), os.fstat(f.fileno()).st_size - 4096)
        out = SessionWriter(home, "s1", policy).append(batch("full", size=3500))
        assert out["copy"]["outcome"] == "divert_failed", out
        assert (out["divert_error"]["operation"], out["divert_error"]["errno"]) == ("write", errno.ENOSPC)
        assert out["divert_residue"] is None
        claims_nothing(out)
        assert divert_file(home).stat().st_size == 0
        # With room again, the same batch is diverted whole.
        filler.unlink()
        again = SessionWriter(home, "s1", policy).append(batch("full", size=3500))
        assert again["copy"]["outcome"] == "diverted", again
        assert again["receipt"]["offset"] == 0
        assert [line["uid"] for line in receipt_lines(again["receipt"])] == ["full-0", "full-1", "full-2"]
        assert divert_file(home).stat().st_size == again["receipt"]["length"]


@contextlib.contextmanager
def append_only(path: Path):
    """`chattr +a`: appends still work, truncation fails (EPERM), even as root."""
    need(shutil.which("chattr") is not None, "chattr is not installed")
    r = subprocess.run(["chattr", "+a", str(path)], capture_output=True, text=True)
    need(r.returncode == 0, f"chattr +a {path}: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-a", str(path)], check=True)


def native_copy(cause: str, outcome: str, **flags: str) -> dict:
    argv = [turnsafe_bin(), "explain", "--cause", cause, "--outcome", outcome, "--json"]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", v]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    envelope = json.loads(proc.stdout)
    assert envelope["type"] == "copy", envelope
    return envelope["data"]


def test_a_divert_that_cannot_be_cut_back_reports_its_residue(policy, tmp_path):
    home = diverting_home(tmp_path)
    first_divert(policy, home)
    path = divert_file(home)
    before = path.read_bytes()
    with append_only(path):
        out = append_in_child(home, batch("stuck"), fsize=len(before) + 100)
        after = path.read_bytes()
    assert out["copy"]["outcome"] == "divert_failed", out
    assert (out["divert_error"]["operation"], out["divert_error"]["errno"]) == ("write", errno.EFBIG)
    assert out["divert_residue"] == {"path": str(path), "offset": len(before)}
    # The residue is real: the batch's first 100 bytes are in the file.
    assert after[:len(before)] == before and len(after) == len(before) + 100
    assert after[len(before):].startswith(b'{"v":1,"session":"s1","uid":"stuck-0"')
    claims_nothing(out)
    copy = out["copy"]
    text = json.dumps(copy).lower()
    assert "not stored anywhere" not in text
    assert str(path).lower() not in text and "s1.jsonl" not in text
    assert copy["details"]["divert_residue"] == "possible"
    # The native host words the same case the same way.
    theirs = native_copy("disk", "divert_failed", divert_error="write: EFBIG", divert_residue=str(path),
                         session="s1")
    assert copy == theirs


def strace_fsyncs(log: str) -> list[tuple[str, str]]:
    """(event, path) in order: `open`/`fsync` of each path, and `stdout`."""
    fds: dict[str, str] = {}
    events = []
    for line in log.splitlines():
        m = re.search(r'openat\(AT_FDCWD, "([^"]+)", [^)]*\) = (\d+)$', line)
        if m:
            fds[m.group(2)] = m.group(1)
            events.append(("open", m.group(1)))
            continue
        m = re.search(r"fsync\((\d+)\) += 0$", line)
        if m:
            events.append(("fsync", fds.get(m.group(1), "?")))
            continue
        if re.search(r'write\(1, "\{', line):
            events.append(("stdout", ""))
    return events


def test_every_divert_fsyncs_its_folders_before_the_receipt(tmp_path):
    need(shutil.which("strace") is not None, "strace is not installed")
    home = diverting_home(tmp_path)
    # What a divert that created the folder and the file, then failed before
    # fsyncing them (or crashed), leaves: both exist, neither entry synced.
    (home / "sessions").mkdir(mode=0o700)
    path = divert_file(home)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    log = tmp_path / "strace.log"
    proc = subprocess.run(["strace", "-f", "-qq", "-o", str(log), "-e", "trace=openat,fsync,write"]
                          + child_argv(home, batch("seen")), capture_output=True, text=True, check=False)
    need(not (proc.returncode != 0 and "ptrace" in proc.stderr), f"strace cannot trace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["copy"]["outcome"] == "diverted"
    events = strace_fsyncs(log.read_text())
    opened = events.index(("open", str(path)))
    told = events.index(("stdout", ""))
    synced = [p for kind, p in events[opened:told] if kind == "fsync"]
    assert str(path) in synced
    assert str(home / "sessions") in synced, events[opened:told]
    assert str(home) in synced, events[opened:told]
