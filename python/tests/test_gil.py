"""The GIL is released around every effect.

A long native wait (a flush retrying while another connection holds the
write lock) must leave Python threads running: with the GIL held, the
ticker below would stop for the whole wait. Two threads appending to two
sessions then overlap: the second thread's Python-side work (building its
batch) runs while the first is inside the native flush. (The store
serialises batches itself today, so the native parts take turns.)
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from turnsafe_store import Store

# Past the store's stall window (1 s): a lock held for less, with no commit,
# is waited out below the policy and the outcome names no cause.
LOCK_S = 1.6


def hold_write_lock(db, seconds: float, ready: threading.Event) -> threading.Thread:
    """Another process holds the write lock (POSIX locks do not conflict
    within one process, so it must be another one)."""
    script = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('ready', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "c.execute('COMMIT')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)

    def run():
        assert proc.stdout.readline().strip() == "ready"
        ready.set()
        assert proc.wait() == 0

    t = threading.Thread(target=run)
    t.start()
    return t


def test_python_threads_run_while_a_flush_waits_in_native_code(home):
    store = Store(home)
    assert store.append("s1", [{"role": "user", "content": "first"}]).persisted
    ready = threading.Event()
    locker = hold_write_lock(home / "state.db", LOCK_S, ready)
    ready.wait()
    result = {}

    def writer():
        result["start"] = time.perf_counter()
        result["outcome"] = store.append("s1", [{"role": "user", "content": "waits"}])
        result["end"] = time.perf_counter()

    w = threading.Thread(target=writer)
    w.start()
    ticks = []
    while w.is_alive():
        ticks.append(time.perf_counter())
    w.join()
    locker.join()
    out = result["outcome"]
    assert out.persisted and out.cause == "locked" and out.attempts > 1, out.to_dict()
    inside = [t for t in ticks if result["start"] < t < result["end"]]
    assert result["end"] - result["start"] >= LOCK_S * 0.8
    # With the GIL held the ticker would be frozen for the whole wait.
    gaps = max(b - a for a, b in zip(inside, inside[1:]))
    assert len(inside) > 1000 and gaps < LOCK_S / 3, (len(inside), gaps)


def test_two_threads_on_two_sessions_overlap(home):
    store = Store(home)
    assert store.append("s1", [{"role": "user", "content": "warm"}]).persisted
    ready = threading.Event()
    locker = hold_write_lock(home / "state.db", LOCK_S, ready)
    ready.wait()
    spans = {}
    b_work = []

    def a():
        t0 = time.perf_counter()
        out = store.append("s1", [{"role": "user", "content": f"a{i}"} for i in range(10)])
        spans["a"] = (t0, time.perf_counter(), out)

    def b():
        t0 = time.perf_counter()
        outs = []
        while time.perf_counter() - t0 < LOCK_S / 2:
            # Python-side work: build a batch, convert it, append it.
            batch = [{"role": "user", "content": f"b{len(b_work)}-{i}", "n": list(range(20))} for i in range(10)]
            b_work.append(time.perf_counter())
            outs.append(batch)
        t1 = time.perf_counter()
        results = [store.append("s2", batch) for batch in outs[:5]]
        spans["b"] = (t0, t1, time.perf_counter(), results)

    ta = threading.Thread(target=a)
    ta.start()
    time.sleep(0.05)  # a is inside its flush, waiting out the lock
    tb = threading.Thread(target=b)
    tb.start()
    ta.join()
    tb.join()
    locker.join()
    a0, a1, a_out = spans["a"]
    assert a_out.persisted and a_out.cause == "locked"
    assert all(o.persisted for o in spans["b"][3])
    during = [t for t in b_work if a0 < t < a1]
    assert len(during) > 50, f"b did {len(during)} Python batches while a was in its flush"
    assert len(store.show("s1")) == 11 and len(store.show("s2")) == 50
