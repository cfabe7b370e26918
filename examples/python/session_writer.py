"""A small agent session writer on the standard library's sqlite3, whose
failure handling is entirely the turnsafe policy component.

On a failed append it builds the observation (Python 3.11 exposes the
extended code as ``sqlite_errorcode``), asks the policy, and does what the
policy says: retry after the policy's delay, divert the batch to JSONL in
the docs/DIVERT.md format (flock, O_NOFOLLOW, fsync, then a receipt), or
fail closed. It shows the policy's copy.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import sqlite3
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from turnsafe_policy import Policy

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages(
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    uid TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    UNIQUE(session_id, uid)
);
"""


def observation(operation: str, err: BaseException, attempt: int, elapsed_ms: int, seed: int) -> dict:
    ext = getattr(err, "sqlite_errorcode", None)
    return {
        "operation": operation,
        "code": (ext & 0xFF) if isinstance(ext, int) else None,
        "extended_code": ext if isinstance(ext, int) else None,
        "message": f"{type(err).__module__}.{type(err).__name__}: {err}",
        "errno": getattr(err, "errno", None) if isinstance(getattr(err, "errno", None), int) else None,
        "evidence": [],
        "attempt": attempt,
        "elapsed_ms": elapsed_ms,
        "seed": seed,
    }


class DivertFailed(Exception):
    def __init__(self, operation: str, errno: int | None):
        super().__init__(f"{operation}: errno {errno}")
        self.operation = operation
        self.errno = errno


def divert(home: Path, session: str, cause: str, messages: list[dict], first_seq: int | None) -> dict:
    """Append one line per message, fsync, and only then return the receipt."""
    if not session or len(session) > 128 or "/" in session or ".." in session or session.startswith("."):
        raise DivertFailed("validate", 22)
    folder = home / "sessions"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise DivertFailed("mkdir", e.errno) from e
    path = folder / f"{session}.jsonl"
    created = not path.exists()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise DivertFailed("open", e.errno) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        prefix = b""
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            prefix = b"\n"
        at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{datetime.now(timezone.utc).microsecond // 1000:03d}Z"
        batch = uuid.uuid4().hex
        body = b""
        for i, m in enumerate(messages):
            line = {
                "v": 1, "session": session, "uid": m["uid"],
                "seq": None if first_seq is None else first_seq + i,
                "batch": batch, "cause": cause, "at": at, "message": m,
            }
            body += json.dumps(line, separators=(",", ":")).encode() + b"\n"
        try:
            os.write(fd, prefix + body)
        except OSError as e:
            raise DivertFailed("write", e.errno) from e
        try:
            os.fsync(fd)
            if created:
                dfd = os.open(folder, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as e:
            raise DivertFailed("fsync", e.errno) from e
    finally:
        os.close(fd)
    return {
        "path": str(path.resolve()),
        "offset": size + len(prefix),
        "length": len(body),
        "count": len(messages),
        "sha256": hashlib.sha256(body).hexdigest(),
    }


class SessionWriter:
    def __init__(self, home: str | os.PathLike, session: str, policy: Policy | None = None,
                 db_uri: str | None = None, busy_timeout: float = 0.0):
        self.home = Path(home)
        self.session = session
        self.policy = policy or Policy()
        self.db_uri = db_uri
        self.busy_timeout = busy_timeout
        self.conn: sqlite3.Connection | None = None
        self.next_seq: int | None = None

    def _open(self) -> sqlite3.Connection:
        if self.conn is None:
            target = self.db_uri or str(self.home / "state.db")
            conn = sqlite3.connect(target, uri=self.db_uri is not None, timeout=self.busy_timeout,
                                   isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(SCHEMA)
            self.conn = conn
        return self.conn

    def append(self, messages: list[dict]) -> dict:
        batch = [dict(m, uid=m.get("uid") or uuid.uuid4().hex) for m in messages]
        started = time.monotonic()
        seed = random.getrandbits(63)
        attempt = 0
        while True:
            attempt += 1
            operation = "open" if self.conn is None else "append_batch"
            try:
                conn = self._open()
                operation = "append_batch"
                conn.execute("BEGIN IMMEDIATE")
                try:
                    seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = ?",
                                       (self.session,)).fetchone()[0]
                    if self.next_seq is None:
                        self.next_seq = seq
                    for i, m in enumerate(batch):
                        conn.execute(
                            "INSERT INTO messages(session_id, uid, seq, role, content) VALUES (?, ?, ?, ?, ?)",
                            (self.session, m["uid"], seq + i, m["role"], json.dumps(m["content"])
                             if not isinstance(m["content"], str) else m["content"]))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                self.next_seq = seq + len(batch)
                return self._outcome(True, None, None, attempt, len(batch), 0, 0, None, None, batch)
            except sqlite3.Error as err:
                elapsed = int((time.monotonic() - started) * 1000)
                obs = observation(operation, err, attempt, elapsed, seed)
                decision = self.policy.decide(obs)
                action = decision["action"]
                if action == "retry":
                    time.sleep(decision["delay_ms"] / 1000)
                    continue
                if action in ("divert", "adopt_continuation", "degrade_fts", "recreate_session"):
                    return self._divert(decision["cause"], attempt, batch)
                return self._outcome(False, decision["cause"], action, attempt, 0, 0, len(batch),
                                     None, self.policy.explain(decision["cause"], "handed_back",
                                                               session=self.session), batch)

    def _divert(self, cause: str, attempt: int, batch: list[dict]) -> dict:
        try:
            receipt = divert(self.home, self.session, cause, batch, self.next_seq)
        except DivertFailed as e:
            copy = self.policy.explain(cause, "divert_failed", session=self.session,
                                       divert_error=f"{e.operation}: errno {e.errno}" if e.errno else e.operation)
            out = self._outcome(False, cause, "divert", attempt, 0, 0, len(batch), None, copy, batch)
            out["divert_error"] = {"operation": e.operation, "errno": e.errno}
            return out
        if self.next_seq is not None:
            self.next_seq += len(batch)
        copy = self.policy.explain(cause, "diverted", session=self.session, receipt_path=receipt["path"])
        return self._outcome(False, cause, "divert", attempt, 0, len(batch), 0, receipt, copy, batch)

    def _outcome(self, persisted, cause, action, attempts, committed, diverted, handed_back, receipt, copy, batch):
        return {
            "persisted": persisted, "cause": cause, "action": action, "attempts": attempts,
            "committed": committed, "diverted": diverted, "handed_back": handed_back,
            "receipt": receipt, "copy": copy,
            "error": None if persisted else f"session_persistence_failed:{cause}",
            "uids": [m["uid"] for m in batch],
        }
