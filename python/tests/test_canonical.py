"""Canonical bytes (turnsafe_store.canonical_json and digest_json, the
native host's same.rs) against the vectors every runtime reads:
tests/canonical.json, each vector's canonical text and digest, each
refusal, each pair."""

from __future__ import annotations

import hashlib
import json

import pytest

import turnsafe_store

from conftest import ROOT

FILE = json.loads((ROOT / "tests" / "canonical.json").read_text(encoding="utf-8"))
# What the file holds today: fewer means vectors went missing.
VECTORS = 27
PAIRS = 8


def test_the_file_holds_every_vector_and_pair() -> None:
    assert len(FILE["vectors"]) >= VECTORS, f"tests/canonical.json has {len(FILE['vectors'])} vectors"
    assert len(FILE["pairs"]) >= PAIRS, f"tests/canonical.json has {len(FILE['pairs'])} pairs"


@pytest.mark.parametrize("vector", FILE["vectors"], ids=[v["name"] for v in FILE["vectors"]])
def test_vector(vector: dict) -> None:
    if "canonical" not in vector:
        with pytest.raises(ValueError):
            turnsafe_store.canonical_json(vector["input"])
        with pytest.raises(ValueError):
            turnsafe_store.digest_json(vector["input"])
        return
    got = turnsafe_store.canonical_json(vector["input"])
    assert got == vector["canonical"]
    assert turnsafe_store.digest_json(vector["input"]) == vector["digest"]
    assert "sha256:" + hashlib.sha256(got.encode("utf-8")).hexdigest() == vector["digest"]
    # The canonical text is its own canonical text.
    assert turnsafe_store.canonical_json(got) == got


@pytest.mark.parametrize("pair", FILE["pairs"], ids=[f"{p['a']} vs {p['b']}" for p in FILE["pairs"]])
def test_pair(pair: dict) -> None:
    def canonical(text: str) -> str | None:
        try:
            return turnsafe_store.canonical_json(text)
        except ValueError:
            return None

    a, b = canonical(pair["a"]), canonical(pair["b"])
    assert (a is not None and a == b) == pair["same"]


def test_python_json_round_trip_is_not_the_same_record() -> None:
    # An integer past 2^53 read as a float loses its digits: other bytes.
    # Read as Python reads it (an int), it keeps them: the same record.
    text = '{"n":9007199254740993}'
    assert turnsafe_store.canonical_json(json.dumps(json.loads(text, parse_int=float))) != turnsafe_store.canonical_json(text)
    assert turnsafe_store.canonical_json(json.dumps(json.loads(text))) == turnsafe_store.canonical_json(text)
