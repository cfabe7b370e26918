"""Shared fixtures. A capability a test needs (chattr, the CLI binary) is
a failure under CI=true, and a loud skip only on a developer's machine."""

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


def need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"missing capability under CI: {why}")
    pytest.skip(f"SKIPPED (missing capability): {why}")


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
