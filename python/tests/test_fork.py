"""A child process of fork never mints a uid its parent did, and never
writes through its parent's connection."""

from __future__ import annotations

import json
import os

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
    assert row == ("parent",)
    assert store.append("s1", [{"role": "user", "content": "y"}]).persisted
    store.close()
