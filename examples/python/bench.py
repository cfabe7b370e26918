"""Time one policy decision through wasmtime-py, instance reused.

Run: TURNSAFE_COMPONENT=<component.wasm> python bench.py
"""

import json
import time

from turnsafe_policy import Policy

OBS = json.dumps({"operation": "open", "code": 14, "errno": 24, "message": "unable to open database file"})
REQ = json.dumps({"observation": json.loads(OBS), "context": {"receipt": {"path": "/h/sessions/s1.jsonl", "offset": 0, "length": 231, "count": 1, "sha256": "5f2b" * 16}}})


def main(n: int = 20000) -> None:
    p = Policy()
    for _ in range(1000):
        p.classify_json(OBS)
    t = time.perf_counter()
    for _ in range(n):
        p.classify_json(OBS)
    classify = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        p.evaluate_json(REQ)
    evaluate = (time.perf_counter() - t) / n
    print(f"python wasmtime-py: classify-json {classify * 1e6:.1f} us/call, evaluate-json (decision + copy) {evaluate * 1e6:.1f} us/call")
    # One whole flush through the machine, no I/O: open, a locked write, a
    # wait, the write again, committed, done with its outcome.
    start = {"session": "s1", "uids": [f"u{i}" for i in range(10)], "minted_uids": [], "seed": 7}
    events = [{"type": "opened"},
              {"type": "failed", "code": 5, "extended_code": 5, "message": "database is locked"},
              {"type": "waited", "elapsed_ms": 30},
              {"type": "committed"}]
    flushes = n // 10
    t = time.perf_counter()
    for _ in range(flushes):
        answer = json.loads(p.flush_step({"state": None, "start": start}))
        for e in events:
            answer = json.loads(p.flush_step({"state": answer["state"], "event": e}))
        assert answer["step"]["type"] == "done"
    flush = (time.perf_counter() - t) / flushes
    print(f"python wasmtime-py: one whole flush through flush-step-json (5 calls) {flush * 1e6:.1f} us/flush")


if __name__ == "__main__":
    main()
