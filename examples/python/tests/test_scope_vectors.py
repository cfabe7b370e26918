"""The failure scopes (tests/vectors/scope.json) through the component from
Python: how far a failure inside a group's transaction reaches (the batch's
savepoint or the whole transaction), byte for byte what the native host
answers."""
import json

import pytest

from conftest import ROOT

VECTORS = json.loads((ROOT / "tests" / "vectors" / "scope.json").read_text())


def test_there_are_scope_vectors_for_both_scopes():
    assert {v["expected"]["scope"] for v in VECTORS} == {"batch", "transaction"}
    assert len(VECTORS) >= 40


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_scope_vector(policy, vector):
    out = json.loads(policy.decide_scope_json(json.dumps(vector["request"])))
    assert out == vector["expected"], vector["why"]


def test_a_request_without_the_transactions_state_is_an_error(policy):
    out = json.loads(policy.decide_scope_json('{"observation": {"code": 13}}'))
    assert "error" in out
