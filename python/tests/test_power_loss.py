"""The Python package on a filesystem that forgets what was not fsynced
(powerfs, driven through its `powerfs-ctl`): `Store.append` and
`TurnsafeSession.add_items`, with the power cut at every sync point of the
flow in turn, in every cut mode. After each cut and a remount, every
message whose append said `persisted` (or whose `add_items` returned) while
the power was still on is in `state.db` exactly once, counted with our own
connection, and `state.db` passes `integrity_check`."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from turnsafe_store import Store, TurnNotPersisted
from turnsafe_store.agents import TurnsafeSession

from conftest import ROOT, need

CTL = Path(os.environ.get("POWERFS_CTL", ROOT / "target" / "debug" / "powerfs-ctl"))


class PowerFs:
    """One mount, served by `powerfs-ctl` in a child process."""

    def __init__(self, tmp: Path):
        need(CTL.is_file(), f"{CTL} is not built (python/run-tests builds it)")
        self.path = tmp / "mnt"
        self.proc = subprocess.Popen(
            [str(CTL), str(tmp / "backing"), str(self.path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        first = self.proc.stdout.readline().strip()
        if first.startswith("unavailable"):
            self.proc.wait()
            need(False, f"powerfs: {first}")
        # Anything but `ready` is a broken harness, a failure everywhere.
        assert first == "ready", f"powerfs-ctl did not mount: {first!r}"

    def cmd(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer.startswith("ok"), f"powerfs-ctl {line!r}: {answer!r}"
        return answer[2:].strip()

    def powered(self) -> bool:
        """No sync point frozen yet: a claim made now would be made in real life."""
        return self.cmd("frozen") == "none"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)


@pytest.fixture
def powerfs(tmp_path):
    fs = PowerFs(tmp_path)
    yield fs
    fs.close()


def batch(tag: str, n: int = 2) -> list:
    return [{"role": "user", "content": f"{tag}-{i}"} for i in range(n)]


def store_flow(fs: PowerFs, home: Path) -> tuple[list, object]:
    """Three appends; the contents of those acknowledged with the power on.
    The store is left open, as it is when the power goes."""
    store = Store(home)
    acked = []
    for b in range(3):
        out = store.append("s1", batch(f"store{b}"))
        if out.persisted and fs.powered():
            acked += [m["content"] for m in batch(f"store{b}")]
    return acked, store


def session_flow(fs: PowerFs, home: Path) -> tuple[list, object]:
    """Three turns through the Agents SDK session."""
    session = TurnsafeSession("user-42", home, store=Store(home))
    acked = []

    async def go():
        for b in range(3):
            try:
                await session.add_items(batch(f"turn{b}"))
            except TurnNotPersisted:
                continue
            if fs.powered():
                acked.extend(m["content"] for m in batch(f"turn{b}"))

    asyncio.run(go())
    return acked, session.store


def stored(home: Path) -> tuple[dict, str]:
    """Each stored message's content with its count, and integrity_check."""
    db = home / "state.db"
    if not db.exists():
        return {}, "ok"
    # Our own connection, not the package's: read-write, because the first
    # open after a power cut recovers the WAL (a read-only one cannot
    # rebuild a lost -shm), as the next writer would.
    c = sqlite3.connect(db)
    try:
        counts: dict = {}
        # A cut before the schema was synced leaves a file without it: then
        # nothing can have been acknowledged, and nothing is counted.
        if c.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages'").fetchone():
            for (content,) in c.execute("SELECT json_extract(item, '$.content') FROM messages"):
                counts[content] = counts.get(content, 0) + 1
        integrity = c.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        c.close()
    return counts, integrity


def cut_and_check(fs: PowerFs, flow, n: int, mode: str) -> list:
    """Run `flow` in a fresh home with the power cut at sync point `n`
    (0: after the flow), then remount and recount."""
    fs.cmd("remount")
    home = fs.path / f"home-{n}-{mode.replace(' ', '-')}"
    if n:
        fs.cmd(f"cut_at_sync {n}")
    acked, store = flow(fs, home)
    fs.cmd(f"cut {mode}")
    try:
        # Its descriptors died with the power; closing must not matter.
        store.close()
    except Exception:  # noqa: BLE001 - any error of a dead mount is expected here
        pass
    fs.cmd("remount")
    counts, integrity = stored(home)
    bad = [f"{c!r} acknowledged, stored {counts.get(c, 0)} times" for c in acked if counts.get(c, 0) != 1]
    if integrity != "ok":
        bad.append(f"integrity_check: {integrity}")
    return [f"cut {mode} at sync {n or 'end'}: {b}" for b in bad]


@pytest.mark.parametrize("flow", [store_flow, session_flow], ids=["Store", "TurnsafeSession"])
def test_every_acknowledged_message_survives_a_cut_at_every_sync_point(powerfs, flow):
    fs = powerfs
    fs.cmd("remount")
    acked, store = flow(fs, fs.path / "count")
    store.close()
    assert len(acked) == 6, acked
    count = int(fs.cmd("sync_count"))
    # The first open, the schema, the WAL and three commits: each a sync.
    assert count >= 4, f"the flow made only {count} syncs"
    failures = cut_and_check(fs, flow, 0, "drop")
    for n in range(1, count + 1):
        for mode in ("drop", f"torn {n}", f"reorder {n}"):
            failures += cut_and_check(fs, flow, n, mode)
    assert not failures, "\n".join(failures)
