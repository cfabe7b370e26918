"""The PostgreSQL harness itself (pg_server.py), without the package: the
scenarios in test_postgres.py are only as good as the failures it makes."""

from __future__ import annotations

import os
import subprocess

import pytest

from pg_server import PASSWORD, USER, HarnessBroken


def psql_as(pg, password: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(pg.bindir / "psql"), "-X", "-At", "-h", "127.0.0.1", "-p", str(pg.port), "-U", USER, "-c", "SELECT 1"],
        env=dict(os.environ, PGPASSWORD=password, PGCONNECT_TIMEOUT="5"), capture_output=True, text=True,
    )


def test_a_server_checks_passwords_and_runs_as_its_own_account(pg):
    assert psql_as(pg, PASSWORD).stdout.strip() == "1"
    wrong = psql_as(pg, "not-the-password")
    assert wrong.returncode == 2 and "password authentication failed" in wrong.stderr
    assert pg.query("SHOW listen_addresses") == [["127.0.0.1"]]
    assert pg.query("SHOW password_encryption") == [["scram-sha-256"]]
    if os.geteuid() == 0:
        pid = pg.postmaster_pid()
        assert pid is not None and os.stat(f"/proc/{pid}").st_uid == pg.run_as[0] != 0


def test_stop_and_kill_take_the_server_away_and_a_restart_keeps_what_was_committed(pg):
    db = pg.create_db("kept")
    pg.query("CREATE TABLE t(x int); INSERT INTO t VALUES (1)", db)
    pg.stop_immediate()
    with pytest.raises(HarnessBroken):
        pg.query("SELECT 1", retry=0)
    pg.start_again()
    pg.query("INSERT INTO t VALUES (2)", db)
    old = pg.postmaster_pid()
    pg.kill9()
    assert not os.path.exists(f"/proc/{old}")
    with pytest.raises(HarnessBroken):
        pg.query("SELECT 1", retry=0)
    pg.start_again()  # crash recovery, same port
    assert pg.query("SELECT x FROM t ORDER BY x", db) == [["1"], ["2"]]
    assert pg.postmaster_pid() != old
