"""The lease decisions (tests/vectors/lease.json) through the component
from Python: when a writer takes over a turn lease another holder has,
byte for byte what the native host answers."""
import json

import pytest

from conftest import ROOT

VECTORS = json.loads((ROOT / "tests" / "vectors" / "lease.json").read_text())


def test_there_are_lease_vectors_for_every_verdict():
    verdicts = {v["expected"]["verdict"] for v in VECTORS}
    assert verdicts == {"free", "holder_exited", "pid_reused", "backend_gone", "stands"}


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_lease_vector(policy, vector):
    out = json.loads(policy.decide_lease_json(json.dumps(vector["probe"])))
    assert out == vector["expected"], vector["why"]


def test_a_probe_it_cannot_read_is_an_error(policy):
    out = json.loads(policy.decide_lease_json('{"now_ms": 1, "local": "alive"}'))
    assert "error" in out
