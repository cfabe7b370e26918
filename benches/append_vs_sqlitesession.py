"""`turnsafe append` end to end against the OpenAI Agents SDK's SQLiteSession.

Same batches (10 messages of about 200 B), both WAL with synchronous=FULL;
SQLiteSession keeps no full-text index, turnsafe does (FTS5 on). Prints
msg/s for each and the ratio. Needs `pip install openai-agents` and a built
`turnsafe` (TURNSAFE_BIN).

    TURNSAFE_BIN=target/release/turnsafe python benches/append_vs_sqlitesession.py
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

BATCHES = int(os.environ.get("BATCHES", "1000"))


def batches():
    for b in range(BATCHES):
        yield [{"role": "user" if i % 2 == 0 else "assistant",
                "content": f"batch {b} message {i} " + "x" * 180} for i in range(10)]


def run_turnsafe(home: str) -> float:
    data = "".join(json.dumps(b) + "\n" for b in batches()).encode()
    t = time.perf_counter()
    proc = subprocess.run([os.environ["TURNSAFE_BIN"], "append", "--home", home, "--session", "bench"],
                          input=data, capture_output=True, check=False)
    elapsed = time.perf_counter() - t
    outs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(outs) == BATCHES and all(o["persisted"] for o in outs), proc.stderr[-500:]
    return BATCHES * 10 / elapsed


async def run_sqlitesession(path: str) -> float:
    from agents.memory import SQLiteSession
    session = SQLiteSession("bench", path)
    conn = session._get_connection()
    conn.execute("PRAGMA synchronous=FULL")
    t = time.perf_counter()
    for b in batches():
        await session.add_items(b)
    elapsed = time.perf_counter() - t
    session.close()
    return BATCHES * 10 / elapsed


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        results = {"turnsafe": [], "sqlitesession": []}
        for r in range(3):
            results["turnsafe"].append(run_turnsafe(os.path.join(d, f"ts{r}")))
            results["sqlitesession"].append(asyncio.run(run_sqlitesession(os.path.join(d, f"sdk{r}.db"))))
        ts = sorted(results["turnsafe"])[1]
        sdk = sorted(results["sqlitesession"])[1]
        print(f"{BATCHES} batches x 10 messages, WAL, synchronous=FULL (median of 3)")
        print(f"turnsafe append (end to end, FTS on): {ts:,.0f} msg/s")
        print(f"SQLiteSession.add_items:              {sdk:,.0f} msg/s")
        print(f"ratio turnsafe/SQLiteSession: {ts / sdk:.2f} (target >= 1.2)")


if __name__ == "__main__":
    sys.exit(main())
