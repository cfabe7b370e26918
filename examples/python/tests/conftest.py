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
        if f.name == "flush_sequences.json":  # the flush machine's own runner reads it
            continue
        out.extend(json.loads(f.read_text()))
    assert len(out) >= 60
    return out


def native(command: str, lines: list[str]) -> list[str]:
    """The Rust host's answers for the same input lines."""
    proc = subprocess.run([turnsafe_bin(), command], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, check=False)
    return proc.stdout.splitlines()
