"""The flush machine's event-sequence vectors, through the component from
Python: every step, down to the outcome, must be the one the vectors hold
(the Rust runner checks the same file natively and in wasmtime)."""

import json

from conftest import ROOT


def load():
    return json.loads((ROOT / "tests" / "vectors" / "flush_sequences.json").read_text())


def test_every_sequence_gives_the_expected_steps(policy):
    cases = load()
    assert len(cases) >= 35
    failures = []
    for case in cases:
        state = None
        for i, turn in enumerate(case["turns"]):
            answer = json.loads(policy.flush_step({"state": state, "start": turn["start"]}))
            steps = [answer["step"]]
            for event in turn["events"]:
                answer = json.loads(policy.flush_step({"state": answer["state"], "event": event}))
                assert "error" not in answer, (case["name"], answer)
                steps.append(answer["step"])
            state = answer["state"]
            if steps != turn["steps"]:
                failures.append(f"{case['name']} turn {i}: {steps} != {turn['steps']}")
    assert not failures, "\n".join(failures)


def test_the_outcome_text_is_the_components_own(policy, tmp_path):
    from session_writer import SessionWriter

    w = SessionWriter(tmp_path, "s1", policy)
    out = w.append([{"role": "user", "content": "hi", "uid": "u1"}])
    assert out["persisted"] is True
    assert json.loads(w.outcome_text) == out
    # Printed unchanged: the exact bytes, which json.dumps reproduces only
    # because the component sorts keys and escapes as it does.
    assert w.outcome_text == json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def test_a_malformed_state_is_refused(policy):
    answer = json.loads(policy.flush_step({"state": {"v": 99}, "event": {"type": "opened"}}))
    assert "the state is not one this policy wrote" in answer["error"]
