"""`turnsafe import hermes` throughput and peak memory on a large Hermes home.

The home is made by Hermes' own `SessionDB` (its schema, triggers and FTS
tables), then filled with bulk SQL (`append_message` runs at about 2k
msg/s): SESSIONS sessions of PER_SESSION messages of about 230 bytes, a
tenth of each session compacted (active = 0, compacted = 1), every fifth
message an assistant turn with a tool call, its WAL checkpointed. The
import runs once on a tenth of the home and once on all of it, into fresh
homes; the figures are wall time, messages per second and the peak RSS
(`getrusage` of the child)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hermes_state

SESSIONS = int(os.environ.get("SESSIONS", "10000"))
PER_SESSION = int(os.environ.get("PER_SESSION", "100"))
BIN = os.environ.get("TURNSAFE_BIN", "target/release/turnsafe")
TEXT = ("The harbour is 4.2 km away; the ferry leaves at ten past the hour, "
        "the bus at twenty to. Bring a coat: wind from the north-west, 6 Bft. ") * 2


def make_home(root: Path, sessions: int, per_session: int) -> None:
    root.mkdir(parents=True)
    db = hermes_state.SessionDB(root / "state.db")
    db.close()
    c = sqlite3.connect(root / "state.db")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=OFF")
    t0 = time.time()
    with c:
        c.executemany(
            "INSERT INTO sessions(id, source, model, started_at, message_count, title) VALUES (?, 'cli', 'gpt-bench', ?, ?, ?)",
            ((f"s{i:06d}", t0 + i, per_session, f"bench {i}") for i in range(sessions)),
        )

        def rows():
            compacted = per_session // 10
            for i in range(sessions):
                sid = f"s{i:06d}"
                for k in range(per_session):
                    active, was_compacted = (0, 1) if k < compacted else (1, 0)
                    if k % 5 == 4:
                        calls = json.dumps([{"id": f"c{k}", "type": "function",
                                             "function": {"name": "ferry", "arguments": "{}"}}])
                        yield (sid, "assistant", None, calls, None, t0 + k, active, was_compacted)
                    else:
                        role = "user" if k % 2 == 0 else "assistant"
                        yield (sid, role, f"{k} {TEXT[:220]}", None, None, t0 + k, active, was_compacted)

        c.executemany(
            "INSERT INTO messages(session_id, role, content, tool_calls, tool_call_id, timestamp, active, compacted) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows(),
        )
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()


def run(source: Path, home: Path) -> dict:
    """One import in a child of its own: wall time and that child's peak RSS."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen([BIN, "import", "hermes", "--source", str(source), "--home", str(home), "--json"],
                             stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            sys.exit(f"import failed ({p.returncode}): {err.read()}")
        end = json.loads(out.read().splitlines()[-1])["data"]
    return {"rows": end["rows"], "imported": end["imported"], "archived": end["archived"],
            "wall_s": round(wall, 2), "msg_per_s": round(end["rows"] / wall),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hermes-bench-"))
    try:
        for sessions in (max(1, SESSIONS // 10), SESSIONS):
            source = work / f"hermes-{sessions}"
            t = time.perf_counter()
            make_home(source, sessions, PER_SESSION)
            made = time.perf_counter() - t
            size = (source / "state.db").stat().st_size
            result = run(source, work / f"turnsafe-{sessions}")
            result.update({"sessions": sessions, "hermes_db_mb": round(size / 2**20, 1), "generated_s": round(made, 1)})
            print(json.dumps(result), flush=True)
            shutil.rmtree(source)
            shutil.rmtree(work / f"turnsafe-{sessions}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
