"""A child process of fork never mints a uid its parent did, and never
writes through its parent's connection: watched from outside with strace,
the child opens `state.db` itself and writes the database only through
descriptors it opened."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import need

from turnsafe_store import Store


def test_a_forked_child_mints_no_uid_the_parent_did(home):
    store = Store(home)
    batch = [{"role": "user", "content": f"m{i}"} for i in range(50)]
    before = store.append("parent", batch)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(r)
            out = store.append("child", batch)
            os.write(w, json.dumps({"persisted": out.persisted, "uids": out.minted_uids}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child = json.loads(data)
    after = store.append("parent", batch)
    assert before.persisted and after.persisted and child["persisted"]
    parent_uids = set(before.minted_uids) | set(after.minted_uids)
    assert len(child["uids"]) == 50
    assert not parent_uids & set(child["uids"])
    # Both processes' rows are in the one database, intact.
    assert len(store.show("parent")) == 100 and len(store.show("child")) == 50
    store.close()


def test_a_child_that_drops_its_inherited_store_leaves_the_parents_lease(home):
    import sqlite3

    store_box = [Store(home, holder="parent", lease_ttl=60)]
    store = store_box[0]
    assert store.append("s1", [{"role": "user", "content": "x"}]).persisted
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            del store
            del store_box[0]  # the child's last reference: the handle is dropped here
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    row = sqlite3.connect(home / "state.db").execute("SELECT lease_holder FROM sessions WHERE id = 's1'").fetchone()
    # The lease is still the parent's: its name, and its own process.
    holder = json.loads(row[0])
    assert (holder["name"], holder["pid"]) == ("parent", os.getpid()), holder
    assert store.append("s1", [{"role": "user", "content": "y"}]).persisted
    store.close()


FORKING = r"""
import json, os, sys
from turnsafe_store import Store

store = Store(sys.argv[1])
batch = [{"role": "user", "content": f"m{i}"} for i in range(5)]
assert store.append("parent", batch).persisted
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # the child
    code = 1
    try:
        os.close(r)
        out = store.append("child", batch)
        os.write(w, json.dumps({"persisted": out.persisted}).encode())
        code = 0
    finally:
        os._exit(code)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
assert store.append("parent", batch).persisted
print(json.dumps({"child": pid, **json.loads(data)}))
store.close()
"""

# `1234 openat(AT_FDCWD</x>, "/h/state.db", O_RDWR|O_CREAT, 0644) = 5</h/state.db>`,
# `1234 pwrite64(5</h/state.db-wal>, "..."..., 4096, 32) = 4096`,
# `1234 <... clone3 resumed> => {parent_tid=[1240]}, 88) = 1240`.
LINE = re.compile(r"^(\d+) +(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
RESULT = re.compile(r"\) +=\s+(-?\d+)(?:<([^>]*)>)?")
FD_ARG = re.compile(r"^\(?(\d+)<([^>]*)>")


def strace_works() -> bool:
    if not shutil.which("strace"):
        return False
    return subprocess.run(["strace", "-qq", "-o", os.devnull, "true"], check=False).returncode == 0


def test_a_forked_child_opens_and_writes_its_own_state_db(home, tmp_path):
    need(strace_works(), "strace (installed by .ci/run) watches the child's opens and writes from outside")
    trace = tmp_path / "trace"
    run = subprocess.run(
        ["strace", "-f", "-qq", "-y", "-o", str(trace),
         "-e", "trace=open,openat,write,pwrite64,pwritev,pwritev2,clone,clone3,fork,vfork",
         sys.executable, "-c", FORKING, str(home)],
        capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["persisted"] is True, seen
    db = str(Path(home).resolve() / "state.db")

    parent_of: dict[int, int] = {}
    events = []  # (tid, syscall, args, result, result path)
    for line in trace.read_text().splitlines():
        m = LINE.match(line)
        if not m or line.endswith("<unfinished ...>"):
            continue
        tid, name, args = int(m.group(1)), m.group(2) or m.group(3), m.group(4)
        returned = list(RESULT.finditer(args))  # the last one: a written string may hold ") = "
        if not returned:
            continue
        r = returned[-1]
        result, path = int(r.group(1)), r.group(2)
        if name in ("clone", "clone3", "fork", "vfork") and result > 0:
            parent_of[result] = tid
        events.append((tid, name, args, result, path))

    def in_child(tid: int) -> bool:
        while tid != seen["child"]:
            if tid not in parent_of:
                return False
            tid = parent_of[tid]
        return True

    opened = {}  # fd -> path, opened by the child
    writes = []  # (fd, path) of the child's writes to the database
    for tid, name, args, result, path in events:
        if not in_child(tid):
            continue
        if name in ("open", "openat") and result >= 0 and path in (db, db + "-wal"):
            opened[result] = path  # strace -y: the path of the descriptor returned
        elif name in ("write", "pwrite64", "pwritev", "pwritev2"):
            m = FD_ARG.match(args)
            if m and m.group(2) in (db, db + "-wal"):
                writes.append((int(m.group(1)), m.group(2)))
    assert db in opened.values(), f"the child never opened {db} itself: {opened}"
    assert writes, "the child wrote nothing to the database"
    inherited = [w for w in writes if opened.get(w[0]) != w[1]]
    assert not inherited, f"the child wrote through descriptors it did not open (its parent's): {inherited}"
