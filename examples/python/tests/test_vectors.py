"""Every shared vector, through the component in wasmtime-py: equal to
`expected`, and byte-identical to the native Rust answer."""

import json

from conftest import native


def test_every_vector_matches_expected_and_native(policy, vectors):
    requests = [json.dumps({"observation": v["observation"], "context": v["context"]}) for v in vectors]
    natives = native("evaluate", requests)
    assert len(natives) == len(requests)
    failures = []
    for v, req, nat in zip(vectors, requests, natives):
        out = policy.evaluate_json(req)
        if out != nat:
            failures.append(f"{v['name']}: python {out} != native {nat}")
            continue
        got = json.loads(out)
        summary = {
            "cause": got["cause"], "basis": got["basis"], "action": got["action"],
            "copy_code": (got.get("copy") or {}).get("code"),
        }
        if summary != v["expected"]:
            failures.append(f"{v['name']}: expected {v['expected']}, got {summary}")
    assert not failures, "\n".join(failures)


def test_classify_json_matches_native(policy, vectors):
    lines = [json.dumps(v["observation"]) for v in vectors]
    natives = native("classify", lines)
    assert [policy.classify_json(line) for line in lines] == natives


def test_the_component_reports_its_version(policy):
    assert policy.version() == "0.1.0"
