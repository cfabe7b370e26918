"""TurnsafeSessionService against ADK's SqliteSessionService and
DatabaseSessionService (SQLAlchemy over aiosqlite), in process.

Each session lives what a Runner does to it, without a model: it is
created, then each turn reads it (``get_session``, the whole history, as a
Runner does at the start of a run) and appends the user's event and the
agent's reply (~200 B of text each, the reply with a session-state delta).
One session, then 16 at once on one service (16 asyncio tasks). The three
services write files in the same temporary folder (TMPDIR): turnsafe in
WAL with synchronous=FULL, ADK's two with SQLite's defaults (a rollback
journal, synchronous=FULL), as each ships. Prints events/s (appended
events per second) and turnsafe's ratio to each peer: the median of ROUNDS
rounds (default 3), the services' order alternating between rounds; TURNS
turns per session (default 100 at one session, a quarter each at 16).
Run through benches/adk-vs-sessionservices, which builds the package into
the bench's venv first.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time

TURNS = int(os.environ.get("TURNS", "100"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SESSIONS = 16
TARGET = {1: 1.5, SESSIONS: 3.0}
PAYLOAD = "x" * 180
KINDS = ("turnsafe", "sqlite", "database")


def make(kind: str, d: str):
    if kind == "turnsafe":
        from turnsafe_store.adk import TurnsafeSessionService

        return TurnsafeSessionService(os.path.join(d, "home"))
    if kind == "sqlite":
        from google.adk.sessions.sqlite_session_service import SqliteSessionService

        return SqliteSessionService(os.path.join(d, "adk.db"))
    from google.adk.sessions.database_session_service import DatabaseSessionService

    return DatabaseSessionService(f"sqlite+aiosqlite:///{os.path.join(d, 'adk-sqlalchemy.db')}")


async def close(service) -> None:
    closer = getattr(service, "close", None)
    if closer is not None:
        await closer()


async def live(service, k: int, turns: int) -> int:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    def text(role: str, t: str):
        return types.Content(role=role, parts=[types.Part(text=t)])

    sid = f"bench-{k}"
    await service.create_session(app_name="bench", user_id=f"user-{k}", session_id=sid)
    for t in range(turns):
        session = await service.get_session(app_name="bench", user_id=f"user-{k}", session_id=sid)
        await service.append_event(session, Event(invocation_id=f"i{t}", author="user", content=text("user", f"turn {t:05d} " + PAYLOAD)))
        reply = Event(
            invocation_id=f"i{t}",
            author="agent",
            content=text("model", f"reply {t:05d} " + PAYLOAD),
            actions=EventActions(state_delta={"turns": t + 1}),
        )
        await service.append_event(session, reply)
    got = await service.get_session(app_name="bench", user_id=f"user-{k}", session_id=sid)
    if len(got.events) != 2 * turns or got.state.get("turns") != turns:
        raise SystemExit(f"{type(service).__name__}: {len(got.events)} events and state {got.state}, not {2 * turns}")
    return 2 * turns


async def run(kind: str, d: str, n: int, turns: int, together: bool = True) -> float:
    """Events/s of ``n`` sessions on one service, all at once (``together``)
    or one after another. A session that fails raises ``Failed``."""
    service = make(kind, d)
    try:
        t = time.perf_counter()
        if together:
            done = await asyncio.gather(*(live(service, k, turns) for k in range(n)), return_exceptions=True)
        else:
            done = []
            for k in range(n):
                try:
                    done.append(await live(service, k, turns))
                except Exception as e:  # noqa: BLE001 - counted and named
                    done.append(e)
        spent = time.perf_counter() - t
        errors = [e for e in done if isinstance(e, BaseException)]
        if errors:
            raise Failed(len(errors), f"{type(errors[0]).__name__}: {str(errors[0]).splitlines()[0][:80]}")
        return sum(done) / spent
    finally:
        await close(service)


class Failed(Exception):
    def __init__(self, sessions: int, first: str) -> None:
        super().__init__(f"{sessions} session(s) failed, first: {first}")


def main() -> int:
    results: dict = {}
    failed: dict = {}
    for r in range(ROUNDS):
        for n, turns in ((1, TURNS), (SESSIONS, max(1, TURNS // 4))):
            kinds = KINDS if r % 2 == 0 else KINDS[::-1]
            for kind in kinds:
                with tempfile.TemporaryDirectory() as d:
                    try:
                        rate = asyncio.run(run(kind, d, n, turns))
                    except Failed as e:
                        # ADK's services on one SQLite file refuse concurrent
                        # sessions ("database is locked"): said, and measured
                        # again with the sessions one after another.
                        failed.setdefault((kind, n), str(e))
                        with tempfile.TemporaryDirectory() as d2:
                            rate = asyncio.run(run(kind, d2, n, turns, together=False))
                    results.setdefault((kind, n), []).append(rate)
    med = {k: statistics.median(v) for k, v in results.items()}
    spread = {k: (min(v), max(v)) for k, v in results.items()}
    print(
        f"a turn: get_session, then 2 events of ~200 B (the reply with a state delta); {TURNS} turns for 1 session,"
        f" {max(1, TURNS // 4)} per session for {SESSIONS}; median of {ROUNDS} rounds (min-max); events/s"
    )
    for n in (1, SESSIONS):
        ts = med[("turnsafe", n)]
        cells = []
        for kind, name in (("sqlite", "SqliteSessionService"), ("database", "DatabaseSessionService")):
            peer = med[(kind, n)]
            lo, hi = spread[(kind, n)]
            cells.append(f"{name} {peer:>7,.0f} ({lo:,.0f}-{hi:,.0f}) ratio {ts / peer:.2f}")
        lo, hi = spread[("turnsafe", n)]
        for kind in KINDS:
            if (kind, n) in failed:
                print(f"   {kind} at {n} session(s) at once: {failed[(kind, n)]}; its figure is of the sessions one after another")
        print(f"{n:>2} session(s): TurnsafeSessionService {ts:>7,.0f} ({lo:,.0f}-{hi:,.0f})   " + "   ".join(cells)
              + f"   (target >= {TARGET[n]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
