"""The Python package on a filesystem that forgets what was not fsynced
(powerfs, driven through its `powerfs-ctl`): `Store.append` and
`TurnsafeSession.add_items`, three batches committed into one home and two
diverted (a folder stands where the other home's `state.db` should be),
with the power cut at every sync point of the flow in turn, in every cut
mode. After each cut and a remount, with our own connection, JSON parsing
and sha256 (never the package's readers): every message whose append said
`persisted` (or whose `add_items` returned) while the power was still on is
in `state.db` exactly once with the object sent (its `item`, compared in
canonical form), and every receipt given while the power was on holds its
range (its sha256, its count), each line the message sent under the
outcome's uid; `state.db` passes `integrity_check`. An outcome names one
uid per message sent, the ones the test gave when it gave them."""

from __future__ import annotations

import asyncio
import hashlib
import json
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


def canonical(value) -> str:
    """The test's own canonical text of its plain ASCII records: sorted
    keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Acked:
    """What a flow sent and was acknowledged with the power on: committed
    messages as (uid or None, object), diverted batches as (receipt,
    session, uids, objects). `problems` are outcomes that named other uids
    than were sent."""

    def __init__(self) -> None:
        self.committed: list = []
        self.diverted: list = []
        self.problems: list = []

    def uids(self, out, sent: list, given: list | None) -> None:
        if len(out.uids) != len(sent) or (given is not None and list(out.uids) != given):
            self.problems.append(f"an outcome names the uids {out.uids}; the test sent {len(sent)}, {given}")


def divert_home(home: Path) -> Path:
    """The home beside `home` whose `state.db` is a folder: every batch is
    diverted. Made before the flow's mount, so it is durable."""
    return home.with_name(home.name + "-diverted")


def store_flow(fs: PowerFs, home: Path) -> tuple[Acked, list]:
    """Three appends committed, two diverted, each with the uids the test
    gives. The stores are left open, as they are when the power goes."""
    store = Store(home)
    acked = Acked()
    for b in range(3):
        sent, uids = batch(f"store{b}"), [f"store{b}-{i}" for i in range(2)]
        out = store.append("s1", sent, uids=uids)
        acked.uids(out, sent, uids)
        if out.persisted and fs.powered():
            acked.committed += list(zip(uids, sent))
    other = Store(divert_home(home))
    for b in range(2):
        sent, uids = batch(f"diverted{b}"), [f"diverted{b}-{i}" for i in range(2)]
        out = other.append("s1", sent, uids=uids)
        acked.uids(out, sent, uids)
        if out.receipt is not None and fs.powered():
            acked.diverted.append((out.receipt, "s1", list(out.uids), sent))
    return acked, [store, other]


def session_flow(fs: PowerFs, home: Path) -> tuple[Acked, list]:
    """Three turns through the Agents SDK session, two more into the home
    that diverts (the uids are the session's own)."""
    session = TurnsafeSession("user-42", home, store=Store(home))
    diverting = TurnsafeSession("user-42", divert_home(home), store=Store(divert_home(home)))
    acked = Acked()

    async def go():
        for b in range(3):
            try:
                await session.add_items(batch(f"turn{b}"))
            except TurnNotPersisted as e:
                acked.uids(e.outcome, batch(f"turn{b}"), None)
                continue
            if fs.powered():
                acked.committed += [(None, m) for m in batch(f"turn{b}")]
        for b in range(2):
            sent = batch(f"diverted{b}")
            try:
                await diverting.add_items(sent)
            except TurnNotPersisted as e:
                out = e.outcome
                acked.uids(out, sent, None)
                if out.receipt is not None and fs.powered():
                    acked.diverted.append((out.receipt, "user-42", list(out.uids), sent))
                continue
            acked.problems.append(f"{sent} was committed into a home whose state.db is a folder")

    asyncio.run(go())
    return acked, [session.store, diverting.store]


def stored(home: Path) -> tuple[list, str]:
    """Every stored message as (session, uid, item text), and integrity_check."""
    db = home / "state.db"
    if not db.is_file():
        return [], "ok"
    # Our own connection, not the package's: read-write, because the first
    # open after a power cut recovers the WAL (a read-only one cannot
    # rebuild a lost -shm), as the next writer would.
    c = sqlite3.connect(db)
    try:
        rows: list = []
        # A cut before the schema was synced leaves a file without it: then
        # nothing can have been acknowledged, and nothing is read.
        if c.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages'").fetchone():
            rows = c.execute("SELECT session_id, uid, item FROM messages").fetchall()
        integrity = c.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        c.close()
    return rows, integrity


def committed_problems(home: Path, acked: Acked) -> list:
    """Each committed message stored exactly once with the object sent: by
    its uid when the test gave one, else by its bytes."""
    rows, integrity = stored(home)
    bad = [] if integrity == "ok" else [f"integrity_check: {integrity}"]
    for uid, sent in acked.committed:
        if uid is not None:
            items = [item for (_, u, item) in rows if u == uid]
            if len(items) != 1:
                bad.append(f"{uid} acknowledged, stored {len(items)} times")
            elif canonical(json.loads(items[0])) != canonical(sent):
                bad.append(f"{uid} is stored as {items[0]}, sent {canonical(sent)}")
        else:
            n = sum(1 for (_, _, item) in rows if canonical(json.loads(item)) == canonical(sent))
            if n != 1:
                bad.append(f"{canonical(sent)} acknowledged, stored {n} times with its bytes")
    return bad


def receipt_problems(receipt: dict, session: str, uids: list, sent: list) -> list:
    """The receipt's range, read and hashed here: its sha256, whole lines,
    `count` of them, each the message sent under the outcome's uid."""
    path = Path(receipt["path"])
    where = f"receipt {path} [{receipt['offset']}, +{receipt['length']})"
    try:
        data = path.read_bytes()
    except OSError as e:
        return [f"{where}: {e}"]
    start, end = receipt["offset"], receipt["offset"] + receipt["length"]
    if len(data) < end:
        return [f"{where}: the file is {len(data)} bytes"]
    rng = data[start:end]
    digest = hashlib.sha256(rng).hexdigest()
    if digest != receipt["sha256"]:
        return [f"{where}: the bytes hash to {digest}, the receipt says {receipt['sha256']}"]
    if (start > 0 and data[start - 1 : start] != b"\n") or not rng.endswith(b"\n"):
        return [f"{where}: not whole lines"]
    lines = rng[:-1].split(b"\n")
    if not (len(lines) == receipt["count"] == len(sent) == len(uids)):
        return [f"{where}: {len(lines)} lines, the receipt says {receipt['count']}, {len(sent)} sent"]
    bad = []
    for i, (raw, uid, message) in enumerate(zip(lines, uids, sent)):
        line = json.loads(raw)
        if line.get("uid") != uid or line.get("session") != session:
            bad.append(f"{where}: line {i} is {line.get('session')}/{line.get('uid')}, sent {session}/{uid}")
        if canonical(line.get("message")) != canonical(message):
            bad.append(f"{where}: line {i} holds {canonical(line.get('message'))}, sent {canonical(message)}")
    return bad


def cut_and_check(fs: PowerFs, flow, n: int, mode: str) -> list:
    """Run `flow` in a fresh home with the power cut at sync point `n`
    (0: after the flow), then remount and recount."""
    home = fs.path / f"home-{n}-{mode.replace(' ', '-')}"
    (divert_home(home) / "state.db").mkdir(parents=True)
    fs.cmd("remount")
    if n:
        fs.cmd(f"cut_at_sync {n}")
    acked, stores = flow(fs, home)
    fs.cmd(f"cut {mode}")
    for store in stores:
        try:
            # Its descriptors died with the power; closing must not matter.
            store.close()
        except Exception:  # noqa: BLE001 - any error of a dead mount is expected here
            pass
    fs.cmd("remount")
    bad = list(acked.problems) + committed_problems(home, acked)
    for receipt, session, uids, sent in acked.diverted:
        bad += receipt_problems(receipt, session, uids, sent)
    return [f"cut {mode} at sync {n or 'end'}: {b}" for b in bad]


@pytest.mark.parametrize("flow", [store_flow, session_flow], ids=["Store", "TurnsafeSession"])
def test_every_acknowledged_message_survives_a_cut_at_every_sync_point(powerfs, flow):
    fs = powerfs
    home = fs.path / "count"
    (divert_home(home) / "state.db").mkdir(parents=True)
    fs.cmd("remount")
    acked, stores = flow(fs, home)
    for store in stores:
        store.close()
    assert not acked.problems, acked.problems
    assert len(acked.committed) == 6, acked.committed
    assert len(acked.diverted) == 2, acked.diverted
    count = int(fs.cmd("sync_count"))
    # The first open, the schema, the WAL, three commits, two diverts: each a sync.
    assert count >= 6, f"the flow made only {count} syncs"
    failures = cut_and_check(fs, flow, 0, "drop")
    for n in range(1, count + 1):
        for mode in ("drop", f"torn {n}", f"reorder {n}"):
            failures += cut_and_check(fs, flow, n, mode)
    assert not failures, "\n".join(failures)
