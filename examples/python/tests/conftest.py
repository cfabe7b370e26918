import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from turnsafe_policy import Policy  # noqa: E402


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("CI") == "1"


def need(ok: bool, why: str) -> None:
    """A capability the test needs (root, chattr, strace, a tmpfs mount): a
    failure under CI, a skip elsewhere that the skip log counts."""
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
            f.write(f"python {test}: {' '.join(reason.split())}\n")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(getattr(report, "wasxfail", "") or longrepr)


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
    # A whole module skipped at import (pytest.importorskip, pytest.skip(allow_module_level=True)).
    if report.skipped:
        if in_ci():
            report.outcome = "failed"
        record_skip(report.nodeid, skip_reason(report))


def turnsafe_bin() -> str:
    b = os.environ.get("TURNSAFE_BIN")
    if not b:
        pytest.fail("TURNSAFE_BIN is not set: run the suite through examples/run-all")
    return b


@pytest.fixture(scope="session")
def policy() -> Policy:
    return Policy()


@pytest.fixture(scope="session")
def vectors() -> list[dict]:
    out = []
    for f in sorted((ROOT / "tests" / "vectors").glob("*.json")):
        if f.name in ("flush_sequences.json", "lease.json", "scope.json"):  # each has its own runner
            continue
        out.extend(json.loads(f.read_text()))
    assert len(out) >= 60
    return out


def native(command: str, lines: list[str]) -> list[str]:
    """The Rust host's answers for the same input lines."""
    proc = subprocess.run([turnsafe_bin(), command], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, check=False)
    return proc.stdout.splitlines()
