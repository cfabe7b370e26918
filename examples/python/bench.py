"""Time one policy decision through wasmtime-py, instance reused.

Run: TURNSAFE_COMPONENT=<component.wasm> python bench.py
"""

import json
import time

from turnsafe_policy import Policy

OBS = json.dumps({"operation": "open", "code": 14, "errno": 24, "message": "unable to open database file"})
REQ = json.dumps({"observation": json.loads(OBS), "context": {"receipt_path": "/h/sessions/s1.jsonl"}})


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


if __name__ == "__main__":
    main()
