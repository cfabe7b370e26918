"""Shared fixtures. A capability a test needs (chattr, the CLI binary) is
a failure under CI=true; elsewhere a skip, counted in the skip log
scripts/test-all reports (TURNSAFE_SKIP_LOG)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import turnsafe_store

ROOT = Path(__file__).resolve().parents[2]

# The Agents SDK tests run offline: no trace export.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("CI") == "1"


def need(ok: bool, why: str) -> None:
    """A capability the test needs: a failure under CI, a counted skip elsewhere."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"missing capability under CI: {why}")
    pytest.skip(f"missing capability: {why}")


def record_skip(test: str, reason: str) -> None:
    """Append one line to the skip log scripts/test-all counts (TURNSAFE_SKIP_LOG)."""
    path = os.environ.get("TURNSAFE_SKIP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"turnsafe-store {test}: {' '.join(reason.split())}\n")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skipped test fails: CI must not hide a missing capability."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where no skip is allowed: {skip_reason(report)}"


def pytest_runtest_logreport(report):
    if report.skipped:
        record_skip(report.nodeid, skip_reason(report))


def pytest_collectreport(report):
    if report.skipped:
        if in_ci():
            report.outcome = "failed"
        record_skip(report.nodeid, skip_reason(report))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def store(home: Path):
    s = turnsafe_store.Store(home)
    yield s
    s.close()


@contextlib.contextmanager
def immutable(*paths: Path):
    """`chattr +i`: refuses writes even to root (chmod does not)."""
    need(shutil.which("chattr") is not None, "chattr is not installed")
    done = []
    try:
        for p in paths:
            r = subprocess.run(["chattr", "+i", str(p)], capture_output=True, text=True)
            need(r.returncode == 0, f"chattr +i {p}: {r.stderr.strip()}")
            done.append(p)
        yield
    finally:
        for p in reversed(done):
            subprocess.run(["chattr", "-i", str(p)], check=True)


def turnsafe_bin() -> str:
    """The `turnsafe` command line (TURNSAFE_BIN, or the debug build)."""
    b = os.environ.get("TURNSAFE_BIN") or str(ROOT / "target" / "debug" / "turnsafe")
    need(os.access(b, os.X_OK), f"no turnsafe binary at {b} (cargo build -p turnsafe-host --bin turnsafe)")
    return b


# ------------------------------------------------------------ PostgreSQL


@pytest.fixture
def pg():
    """A real PostgreSQL server of its own (pg_server.PgServer), stopped and
    removed after the test."""
    import pg_server

    try:
        server = pg_server.PgServer.start()
    except pg_server.Unavailable as e:
        need(False, str(e))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_pair():
    """A primary and a synchronous streaming standby (pg_server.SyncPair)."""
    import pg_server

    try:
        pair = pg_server.SyncPair.start()
    except pg_server.Unavailable as e:
        need(False, str(e))
    try:
        yield pair
    finally:
        pair.close()
