"""The package on PostgreSQL, against real servers (pg_server.py): stored,
read back, diverted under the home when the server goes away, replayed,
resent, and carried across a failover to a promoted synchronous standby.

What is on the server is read with psql (``PgServer.messages``), not only
through the package under test.
"""

from __future__ import annotations

import asyncio
import json
import stat
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import turnsafe_store
from turnsafe_store import Outcome, Store, TurnNotPersisted
from turnsafe_store.agents import TurnsafeSession

from pg_server import PASSWORD


def batch(tag: str, n: int = 3) -> List[Dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} message {i}", "n": i}
        for i in range(n)
    ]


def stored(pg, db: str, session: str) -> List[Dict[str, Any]]:
    """The session's items on the server, in order (read with psql)."""
    return [json.loads(item) for _, _, item in pg.messages(db, session)]


def assert_each_uid_once(pg, db: str, session: str, uids: List[str]) -> None:
    rows = pg.messages(db, session)
    got = [uid for uid, _, _ in rows]
    assert len(got) == len(set(got)), f"a uid stored twice: {got}"
    assert sorted(got) == sorted(uids)
    assert [seq for _, seq, _ in rows] == sorted(seq for _, seq, _ in rows)


def assert_diverted_here(out: Outcome, home: Path, session: str, n: int) -> None:
    """Not committed, every message in the home's divert file with a receipt."""
    assert not out.persisted, out.to_dict()
    assert (out.diverted, out.committed, out.handed_back) == (n, 0, 0), out.to_dict()
    assert out.action == "divert", out.to_dict()
    receipt = out.receipt
    assert receipt is not None and receipt["count"] == n, out.to_dict()
    path = Path(receipt["path"])
    assert path == (home / "sessions" / f"{session}.jsonl").resolve()
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600
    uids = {json.loads(line)["uid"] for line in path.read_text().splitlines()}
    assert set(out.uids) <= uids


# ------------------------------------------------------------ stored and read


def test_a_batch_stored_with_db_is_on_the_server_and_read_back(pg, home, tmp_path):
    db = pg.create_db("stored")
    items = batch("first", 4)
    with Store(home, db=pg.url(db)) as store:
        out = store.append("s1", items)
        assert out.persisted and out.committed == 4 and out.durable, out.to_dict()
        assert out.receipt is None and out.diverted == 0
        assert store.show("s1") == items
        assert store.show("s1", limit=2) == items[2:]
        assert [r["uid"] for r in store.rows("s1")] == out.uids
    # On the server, exactly as written, in order.
    rows = pg.messages(db, "s1")
    assert [uid for uid, _, _ in rows] == out.uids
    assert [seq for _, seq, _ in rows] == [1, 2, 3, 4]
    assert [json.loads(item) for _, _, item in rows] == items
    # Nothing went to SQLite under the home.
    assert not (home / "state.db").exists()
    # Another home on the same server reads the same transcript.
    with Store(tmp_path / "elsewhere", db=pg.url(db)) as other:
        assert other.show("s1") == items


def test_turnsafe_db_is_used_when_db_is_none(pg, home, tmp_path, monkeypatch):
    db = pg.create_db("fromenv")
    monkeypatch.setenv("TURNSAFE_DB", pg.url(db))
    with Store(home) as store:
        assert store.append("s1", batch("env")).persisted
    assert stored(pg, db, "s1") == batch("env")
    assert not (home / "state.db").exists()

    async def through_the_session() -> None:
        s = TurnsafeSession("s2", tmp_path / "agents-home")
        await s.add_items(batch("agent"))
        assert await s.get_items() == batch("agent")
        s.close()

    asyncio.run(through_the_session())
    assert stored(pg, db, "s2") == batch("agent")
    assert not (tmp_path / "agents-home" / "state.db").exists()

    # An explicit db wins over the environment.
    other = pg.create_db("explicit")
    with Store(tmp_path / "h2", db=pg.url(other)) as store:
        assert store.append("s3", batch("explicit")).persisted
    assert stored(pg, other, "s3") == batch("explicit") and stored(pg, db, "s3") == []

    # Empty means unset: SQLite under the home.
    monkeypatch.setenv("TURNSAFE_DB", "")
    sqlite_home = tmp_path / "sqlite-home"
    with Store(sqlite_home) as store:
        assert store.append("s4", batch("local")).persisted
        assert store.show("s4") == batch("local")
    assert (sqlite_home / "state.db").is_file()
    assert stored(pg, db, "s4") == []


def test_a_session_given_both_db_and_store_is_refused(pg, home):
    with Store(home, db=pg.url()) as store, pytest.raises(ValueError):
        TurnsafeSession("s1", home, db=pg.url(), store=store)


# ------------------------------------------------------------ outages


def test_a_server_stopped_between_batches_diverts_under_home_and_replay_brings_it_in(pg, home):
    db = pg.create_db("outage")
    url = pg.url(db)
    store = Store(home, db=url)
    first, second, third = batch("before"), batch("during"), batch("also during", 2)
    out1 = store.append("s1", first)
    assert out1.persisted, out1.to_dict()

    pg.stop_immediate()
    out2 = store.append("s1", second)
    assert_diverted_here(out2, home, "s1", 3)
    assert out2.cause == "unavailable", out2.to_dict()
    # The copy says a copy was kept, and where: the receipt's own path.
    assert out2.copy["code"] == "unavailable.diverted", out2.copy
    assert out2.copy["details"]["receipt_path"] == out2.receipt["path"]
    assert out2.receipt["path"] in out2.copy["body"]
    assert out2.error == "session_persistence_failed:unavailable"
    assert PASSWORD not in out2.to_json()
    out3 = store.append("s1", third)
    assert_diverted_here(out3, home, "s1", 2)
    assert not (home / "state.db").exists()

    pg.start_again()
    # The server has only what was committed; the home has the rest. The
    # store reads again once the server is back (a new connection).
    assert stored(pg, db, "s1") == first
    assert store.show("s1") == first
    report = turnsafe_store.doctor(home, db=url)
    assert report["facts"]["pending_divert_files"] == 1, report
    store.close()  # gives back the turn lease: replay takes turns with writers

    report = turnsafe_store.replay(home, db=url)
    assert (report["replayed"], report["duplicate"], report["quarantined"]) == (5, 0, 0), report
    assert stored(pg, db, "s1") == first + second + third
    assert_each_uid_once(pg, db, "s1", out1.uids + out2.uids + out3.uids)
    # Settled: a second replay has nothing left to do, and doctor agrees.
    again = turnsafe_store.replay(home, db=url)
    assert again["replayed"] == 0 and again["duplicate"] == 0, again
    assert turnsafe_store.doctor(home, db=url)["facts"]["pending_divert_files"] == 0
    with Store(home, db=url) as store:
        assert store.show("s1") == first + second + third


def test_a_postmaster_killed_among_batches_loses_nothing(pg, home):
    """Four sessions write batch after batch through TurnsafeSession; the
    postmaster is SIGKILLed under them. Each run ends with TurnNotPersisted
    and a receipt; after the restart, replay brings every diverted item
    in, and each transcript has every item once, in the order sent."""
    db = pg.create_db("killed")
    url = pg.url(db)
    n_sessions, at_most = 4, 2000
    persisted = [0] * n_sessions

    async def run() -> List[Any]:
        sessions = [TurnsafeSession(f"run-{k}", home, db=url) for k in range(n_sessions)]
        assert len({id(s.store) for s in sessions}) == 1  # one store for the home and the server

        async def writer(k: int):
            sent: List[List[Dict[str, Any]]] = []
            for b in range(at_most):
                items = batch(f"session {k} batch {b}")
                sent.append(items)
                try:
                    await sessions[k].add_items(items)
                except TurnNotPersisted as e:
                    return sent, e.outcome
                persisted[k] += 1
            return sent, None

        async def killer() -> None:
            while min(persisted) < 3:
                await asyncio.sleep(0.005)
            await asyncio.to_thread(pg.kill9)

        results = await asyncio.gather(killer(), *(writer(k) for k in range(n_sessions)))
        return [sessions, *results]

    sessions, _, *results = asyncio.run(run())
    for k, (sent, outcome) in enumerate(results):
        assert outcome is not None, f"session {k} never saw the server go away ({len(sent)} batches)"
        assert len(sent) == persisted[k] + 1 and persisted[k] >= 3
        assert_diverted_here(outcome, home, f"run-{k}", len(sent[-1]))
        # A batch in flight at the kill may have been committed unseen.
        assert outcome.cause in ("unavailable", "outcome_unknown"), outcome.to_dict()

    pg.start_again()

    async def committed_part() -> None:
        # The run goes on once the server is back: each session reads what
        # was committed (a new connection), then gives its lease back.
        for k, (sent, _) in enumerate(results):
            got = await sessions[k].get_items()
            before_the_last = [i for items in sent[:-1] for i in items]
            # The last batch only if the server committed it unseen.
            assert got in (before_the_last, before_the_last + sent[-1])
            sessions[k].close()

    asyncio.run(committed_part())
    report = turnsafe_store.replay(home, db=url)
    assert report["quarantined"] == 0, report
    # Every diverted line settles: replayed, or a duplicate of what the
    # server committed before it died.
    assert report["replayed"] + report["duplicate"] == sum(len(sent[-1]) for sent, _ in results), report

    async def read_back() -> None:
        for k, (sent, _) in enumerate(results):
            want = [item for items in sent for item in items]
            assert stored(pg, db, f"run-{k}") == want
            s = TurnsafeSession(f"run-{k}", home, db=url)
            assert await s.get_items() == want
            s.close()

    asyncio.run(read_back())


def test_a_resend_after_turn_not_persisted_stores_each_item_once(pg, home):
    db = pg.create_db("resend")
    url = pg.url(db)
    opening = batch("opening", 2)
    turn = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]

    async def main() -> None:
        s = TurnsafeSession("s1", home, db=url)
        await s.add_items(opening)
        opening_uids = [r["uid"] for r in s.store.rows("s1")]
        pg.stop_immediate()
        with pytest.raises(TurnNotPersisted) as e1:
            await s.add_items(turn)
        with pytest.raises(TurnNotPersisted) as e2:
            await s.add_items(turn)  # the caller retries the same items
        o1, o2 = e1.value.outcome, e2.value.outcome
        assert_diverted_here(o1, home, "s1", 2)
        assert_diverted_here(o2, home, "s1", 2)
        assert o2.uids == o1.uids and o2.minted_uids == []

        pg.start_again()
        assert await s.get_items() == opening  # the server is back; the turn is not there yet
        s.close()
        report = turnsafe_store.replay(home, db=url)
        # The same uids twice in the divert file: one copy in, one duplicate.
        assert (report["replayed"], report["duplicate"], report["quarantined"]) == (2, 2, 0), report
        await s.add_items(turn)  # the resend, once the server is back
        assert await s.get_items() == opening + turn
        s.close()
        assert stored(pg, db, "s1") == opening + turn
        assert_each_uid_once(pg, db, "s1", opening_uids + o1.uids)

    asyncio.run(main())


# ------------------------------------------------------------ failover


def test_failover_to_a_promoted_synchronous_standby_keeps_every_acknowledged_item(pg_pair, home):
    """A writer on the multi-host URL (target_session_attrs=read-write);
    the primary's postmaster is SIGKILLed mid-stream and the synchronous
    standby promoted. The writer carries on against the new primary; what
    it could not store is diverted with a receipt and replayed. On the new
    primary: every acknowledged item, and every item sent, exactly once."""
    db = pg_pair.primary.create_db("failover")
    url = pg_pair.multi_host_url(db)
    total, kill_after = 30, 10

    report = turnsafe_store.doctor(home, db=pg_pair.primary.url(db))
    assert report["facts"]["synchronous_replication"] is True, report
    assert all(f["kind"] != "replication" for f in report["findings"]), report

    store = Store(home, db=url)
    sent: List[List[Dict[str, Any]]] = []
    outcomes: List[Outcome] = []
    progress = threading.Condition()
    failover_done = threading.Event()
    sent_after_failover: List[int] = []

    def writer() -> None:
        for b in range(total):
            items = batch(f"b{b}")
            out = store.append("s1", items)
            with progress:
                sent.append(items)
                outcomes.append(out)
                if failover_done.is_set():
                    sent_after_failover.append(b)
                progress.notify_all()
            time.sleep(0.02)

    t = threading.Thread(target=writer)
    t.start()
    try:
        with progress:
            assert progress.wait_for(lambda: len(outcomes) >= kill_after, timeout=60)
        pg_pair.primary.kill9()
        pg_pair.standby.promote()
        failover_done.set()
    finally:
        t.join(timeout=300)
    assert not t.is_alive()
    assert len(outcomes) == total and sent_after_failover, "the stream ended before the failover"

    acknowledged: List[str] = []
    diverted = 0
    for items, out in zip(sent, outcomes):
        assert out.handed_back == 0, out.to_dict()
        assert out.persisted or out.receipt is not None, out.to_dict()
        if out.persisted:
            acknowledged.extend(out.uids)
        else:
            assert_diverted_here(out, home, "s1", len(items))
            assert out.cause in ("unavailable", "read_only", "outcome_unknown"), out.to_dict()
            diverted += len(items)
    assert outcomes[0].persisted and outcomes[-1].persisted, [o.to_dict() for o in (outcomes[0], outcomes[-1])]
    # The failover reached the writer: a batch met the dead primary.
    assert any(o.attempts > 1 or not o.persisted for o in outcomes), [o.to_dict() for o in outcomes]

    new = pg_pair.standby
    on_new = {uid for uid, _, _ in new.messages(db, "s1")}
    missing = [u for u in acknowledged if u not in on_new]
    assert not missing, f"{len(missing)} acknowledged item(s) not on the promoted standby"

    store.close()
    report = turnsafe_store.replay(home, db=url)
    assert report["quarantined"] == 0 and report["replayed"] + report["duplicate"] == diverted, report
    every_uid = [u for out in outcomes for u in out.uids]
    assert_each_uid_once(new, db, "s1", every_uid)
    by_uid = {uid: json.loads(item) for uid, _, item in new.messages(db, "s1")}
    assert [by_uid[u] for out in outcomes for u in out.uids] == [i for items in sent for i in items]


# ------------------------------------------------------------ doctor


def test_doctor_names_the_server_and_never_its_password(pg, home):
    db = pg.create_db("doctored")
    url = pg.url(db)
    with Store(home, db=url) as store:
        assert store.append("s1", batch("x")).persisted
    report = turnsafe_store.doctor(home, db=url)
    assert report["ok"] is True, report
    assert report["facts"]["db"] == pg.shown(db)
    assert report["facts"]["messages"] == 3 and report["facts"]["sessions"] == 1, report
    reachable = [f for f in report["findings"] if f["kind"] == "postgres" and f["severity"] == "ok"]
    assert reachable and pg.shown(db) in reachable[0]["message"], report
    # One server, no standby: the promise rests on it, and doctor says so.
    assert report["facts"]["synchronous_replication"] is False
    assert any(f["kind"] == "replication" and f["severity"] == "warning" for f in report["findings"]), report
    assert PASSWORD not in json.dumps(report)

    # A server that is down is an error that names it, not a crash.
    pg.stop_immediate()
    down = turnsafe_store.doctor(home, db=url)
    assert down["ok"] is False
    assert any(
        f["kind"] == "postgres" and f["severity"] == "error" and pg.shown(db) in f["message"]
        for f in down["findings"]
    ), down
    assert PASSWORD not in json.dumps(down)


def test_close_after_an_outage_gives_the_lease_back_so_replay_runs(pg, home):
    """The connection the server dropped is made again once at close: the
    store's own lease does not block replay until it expires."""
    db = pg.create_db("closelease")
    url = pg.url(db)
    store = Store(home, db=url)
    assert store.append("s1", batch("before", 1)).persisted
    pg.stop_immediate()
    out = store.append("s1", batch("during", 2))
    assert out.receipt is not None, out.to_dict()
    pg.start_again()
    store.close()  # nothing read since the restart: close reconnects
    holders = pg.query("SELECT count(*) FROM sessions WHERE lease_holder IS NOT NULL", db)
    assert holders == [["0"]], holders
    report = turnsafe_store.replay(home, db=url)
    assert report["replayed"] == 2, report
    assert [m["content"] for m in stored(pg, db, "s1")] == [m["content"] for m in batch("before", 1) + batch("during", 2)]


# ------------------------------------------------------------ a killed client

KILLED_WRITER = r"""
import json, sys
from turnsafe_store import Store

home, url, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Store(home, db=url) as store:
    for i in range(start, start + 100000):
        uids = [f"u{i}-{j}" for j in range(2)]
        items = [{"role": "user", "content": f"message {i}-{j}"} for j in range(2)]
        out = store.append("s1", items, uids=uids)
        print(json.dumps({"i": i, "acked": out.persisted or out.receipt is not None}), flush=True)
"""


def test_a_python_writer_killed_mid_stream_loses_and_doubles_nothing(pg, home, tmp_path):
    """``Store(db=)`` in a child process, SIGKILLed while it writes batch
    after batch (so inside a transaction, between COMMIT and its outcome,
    or between two batches, wherever the kill lands), six times over. After
    each kill: replay, then the batches without an answer sent again, as
    a client would. Every acknowledged message is on the server once, and
    after the resend every message sent is there once."""
    import os
    import signal
    import subprocess
    import sys

    db = pg.create_db("killedpy")
    url = pg.url(db)
    script = tmp_path / "writer.py"
    script.write_text(KILLED_WRITER)
    acked: set = set()
    sent_up_to = -1
    for round_, answers_before_kill in enumerate([3, 11, 1, 25, 7, 40]):
        child = subprocess.Popen(
            [sys.executable, str(script), str(home), url, str(sent_up_to + 1)], stdout=subprocess.PIPE, text=True
        )
        seen = 0
        assert child.stdout is not None
        for line in child.stdout:
            answer = json.loads(line)
            sent_up_to = max(sent_up_to, answer["i"])
            if answer["acked"]:
                acked.update(f"u{answer['i']}-{j}" for j in range(2))
            seen += 1
            if seen >= answers_before_kill:
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL, child.returncode
        # The batch after the last answer may have committed: it counts as sent.
        sent_up_to += 1

        # The killed writer's backend must be gone before replay judges its
        # lease: the server's own list is the evidence, waited on.
        deadline = time.monotonic() + 30
        while pg.query(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}'") != [["0"]]:
            assert time.monotonic() < deadline, "the killed writer's backend never ended"
            time.sleep(0.05)
        turnsafe_store.replay(home, db=url)
        rows = pg.messages(db, "s1")
        uids = [uid for uid, _, _ in rows]
        assert len(uids) == len(set(uids)), f"round {round_}: a uid stored twice"
        missing = acked - set(uids)
        assert not missing, f"round {round_}: acknowledged and not on the server: {sorted(missing)}"

        # Everything sent so far, again: what is stored is an idempotent no-op.
        with Store(home, db=url) as store:
            for i in range(sent_up_to + 1):
                out = store.append(
                    "s1",
                    [{"role": "user", "content": f"message {i}-{j}"} for j in range(2)],
                    uids=[f"u{i}-{j}" for j in range(2)],
                )
                assert out.persisted, out.to_dict()
        rows = pg.messages(db, "s1")
        assert sorted(uid for uid, _, _ in rows) == sorted(f"u{i}-{j}" for i in range(sent_up_to + 1) for j in range(2))
        # Each session's seqs stay distinct across the kills.
        seqs = [seq for _, seq, _ in rows]
        assert len(seqs) == len(set(seqs)), f"round {round_}: a seq given twice"


# ------------------------------------------------------------ import into a server


def test_import_hermes_into_a_server_stores_what_the_sqlite_import_stores(pg, tmp_path):
    import shutil
    import sqlite3

    fixture = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hermes-0.19.0"
    source = tmp_path / "hermes"
    shutil.copytree(fixture, source)
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}

    sqlite_report = turnsafe_store.import_hermes(source, tmp_path / "sqlite")
    db = pg.create_db("hermesimport")
    report = turnsafe_store.import_hermes(source, tmp_path / "pg", db=pg.url(db))
    strip = lambda r: {k: v for k, v in r.items() if k not in ("home", "quarantine")}  # noqa: E731
    assert strip(report) == strip(sqlite_report)
    assert (report["imported"], report["archived"], report["sessions"]) == (5, 5, 2), report
    assert not (tmp_path / "pg" / "state.db").exists()

    on_server = pg.query("SELECT session_id, uid, seq, item FROM messages ORDER BY session_id, seq", db)
    con = sqlite3.connect(tmp_path / "sqlite" / "state.db")
    in_sqlite = [
        [s, u, str(q), i] for s, u, q, i in con.execute("SELECT session_id, uid, seq, item FROM messages ORDER BY session_id, seq")
    ]
    assert on_server == in_sqlite

    again = turnsafe_store.import_hermes(source, tmp_path / "pg", db=pg.url(db))
    assert (again["imported"], again["archived"]) == (0, 0), again
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before
