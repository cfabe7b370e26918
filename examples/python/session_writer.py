"""A small agent session writer on the standard library's sqlite3 whose
flush protocol is the turnsafe policy component's flush machine.

The writer holds no decision of its own. For each batch it starts the
machine (``flush-step-json``) and performs the steps it asks for: open the
database, write the batch, wait, capture (this host keeps no retired
generation, so it reports that it cannot), or divert the batch to JSONL in
the docs/DIVERT.md format (flock, O_NOFOLLOW, every byte written, fsync of
the file and its folders, then a receipt; a failed divert is cut back, or
its residue is reported). It feeds back what happened (Python 3.11 exposes
the extended code as ``sqlite_errorcode``) until the machine says
``done``, and returns the outcome the component built: ``outcome_text`` is
its exact JSON.
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
    """A divert that did not happen. ``residue`` is set when some of the
    batch's bytes reached the file and could not be cut away again: lines
    from ``residue["offset"]`` on may remain in ``residue["path"]``."""

    def __init__(self, operation: str, errno: int | None, message: str | None = None):
        self.operation = operation
        self.errno = errno
        self.residue: dict | None = None
        text = message or (os.strerror(errno) if errno else "failed")
        super().__init__(f"{operation}: {text}")


def _valid_session(session: str) -> bool:
    """docs/DIVERT.md: 1 to 128 bytes of ASCII letters, digits, ``-``,
    ``_``, ``.``, ``:``; no leading ``.``, no ``..``."""
    return (0 < len(session.encode()) <= 128 and not session.startswith(".") and ".." not in session
            and all(c.isascii() and (c.isalnum() or c in "-_.:") for c in session))


def _fsync_dir(folder: Path) -> None:
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` may write fewer bytes than asked (a file size limit, a
    full disk): go on from where it stopped until every byte is written or
    a call fails. The failure of a later call is the one reported."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            raise DivertFailed("write", e.errno) from e
        if n <= 0:
            raise DivertFailed("write", None, "the write stored no bytes")
        view = view[n:]


def _cut_back(fd: int, size: int) -> bool:
    """Truncate the file back to ``size`` and make that durable."""
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError:
        return False
    return True


def divert(home: Path, session: str, cause: str, messages: list[dict], first_seq: int | None) -> dict:
    """Append one line per message, fsync, and only then return the receipt.

    Folder durability does not depend on which call created the file or the
    folder: every divert fsyncs ``sessions/`` and the home before its
    receipt. A divert that created the file (or the folder) and then failed
    before the folder's fsync leaves an entry that may not survive a power
    cut, and the next divert, which finds the file already there, must not
    vouch for it unsynced. Diverts are rare (the database already failed),
    so two directory fsyncs each cost less than a durable marker would.

    On a failure after the write began, the file is cut back to the size it
    had (under the flock) and fsynced, so it holds exactly what it held
    before; if that fails too, the error carries the residue (absolute path,
    and the offset where this batch's lines began), as the native host does.
    """
    if not _valid_session(session):
        raise DivertFailed("validate", 22, "invalid session id")
    folder = home / "sessions"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise DivertFailed("mkdir", e.errno) from e
    path = folder / f"{session}.jsonl"
    try:
        # Read and append: the torn-line check reads the last byte.
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise DivertFailed("open", e.errno) from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            raise DivertFailed("lock", e.errno) from e
        try:
            size = os.fstat(fd).st_size
        except OSError as e:
            raise DivertFailed("stat", e.errno) from e
        prefix = b""
        if size > 0:
            # A torn last line from an earlier crash stays detectable: start
            # ours on a fresh line (an unreadable last byte counts as torn).
            try:
                last = os.pread(fd, 1, size - 1)
            except OSError:
                last = b""
            if last != b"\n":
                prefix = b"\n"
        now = datetime.now(timezone.utc)
        at = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
        batch = uuid.uuid4().hex
        try:
            body = b"".join(
                json.dumps({
                    "v": 1, "session": session, "uid": m["uid"],
                    "seq": None if first_seq is None else first_seq + i,
                    "batch": batch, "cause": cause, "at": at, "message": m,
                }, separators=(",", ":")).encode() + b"\n"
                for i, m in enumerate(messages))
        except (TypeError, ValueError) as e:
            raise DivertFailed("encode", None, str(e)) from e
        offset = size + len(prefix)
        try:
            _write_all(fd, prefix + body)
            try:
                os.fsync(fd)
            except OSError as e:
                raise DivertFailed("fsync", e.errno) from e
            try:
                _fsync_dir(folder)
                _fsync_dir(home)
            except OSError as e:
                raise DivertFailed("fsync_dir", e.errno) from e
        except DivertFailed as e:
            # Bytes of this batch may be in the file with no receipt to
            # vouch for them.
            if not _cut_back(fd, size):
                e.residue = {"path": os.path.abspath(path), "offset": offset}
            raise
    finally:
        os.close(fd)
    return {
        "path": str(path.resolve()),
        "offset": offset,
        "length": len(body),
        "count": len(messages),
        "sha256": hashlib.sha256(body).hexdigest(),
    }


def failure(err: BaseException, elapsed_ms: int) -> dict:
    """A failed open or write, as the flush machine takes it."""
    obs = observation("append_batch", err, 1, elapsed_ms, 0)
    return {"type": "failed", "code": obs["code"], "extended_code": obs["extended_code"],
            "message": obs["message"], "errno": obs["errno"], "evidence": [], "elapsed_ms": elapsed_ms}


def outcome_text(answer: str) -> str:
    """The outcome object of a ``done`` answer, byte for byte as the
    component wrote it (its keys are sorted: ``state`` then ``step``, and
    in the step ``outcome`` then ``type``)."""
    head = '"step":{"outcome":'
    tail = ',"type":"done"}}'
    return answer[answer.index(head) + len(head):answer.rindex(tail)]


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
        # The machine's handle (open, sticky, capture), opaque to this host.
        self.state = None
        self.outcome_text: str | None = None

    # The effects. Each one does what its step says and reports what happened.

    def _open(self, started: float) -> dict:
        try:
            target = self.db_uri or str(self.home / "state.db")
            conn = sqlite3.connect(target, uri=self.db_uri is not None, timeout=self.busy_timeout,
                                   isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(SCHEMA)
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as err:
            return failure(err, self._elapsed(started))
        self.conn = conn
        return {"type": "opened"}

    def _write(self, batch: list[dict], started: float) -> dict:
        # This schema has no search index and no session rows, so the
        # plan's `degrade_fts` and `recreate_session` have nothing to change.
        conn = self.conn
        if conn is None:
            return failure(sqlite3.OperationalError("the database is not open"), self._elapsed(started))
        try:
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
        except sqlite3.Error as err:
            return failure(err, self._elapsed(started))
        self.next_seq = seq + len(batch)
        return {"type": "committed"}

    def _divert(self, cause: str, batch: list[dict]) -> dict:
        try:
            receipt = divert(self.home, self.session, cause, batch, self.next_seq)
        except DivertFailed as e:
            return {"type": "divert_failed", "operation": e.operation, "errno": e.errno,
                    "message": str(e), "residue": e.residue}
        if self.next_seq is not None:
            self.next_seq += len(batch)
        return {"type": "diverted", "receipt": receipt}

    @staticmethod
    def _elapsed(started: float) -> int:
        return int((time.monotonic() - started) * 1000)

    def append(self, messages: list[dict]) -> dict:
        """Flush one batch; the outcome the component built, as a dict."""
        minted = []
        batch = []
        for m in messages:
            uid = m.get("uid")
            if not uid:
                uid = uuid.uuid4().hex
                minted.append(uid)
            batch.append(dict(m, uid=uid))
        started = time.monotonic()
        start = {"session": self.session, "uids": [m["uid"] for m in batch], "minted_uids": minted,
                 "seed": random.getrandbits(63)}
        answer = self.policy.flush_step({"state": self.state, "start": start})
        while True:
            reply = json.loads(answer)
            if "error" in reply:
                raise RuntimeError(f"the flush machine refused a step: {reply['error']}")
            self.state = reply["state"]
            step = reply["step"]
            kind = step["type"]
            if kind == "done":
                self.outcome_text = outcome_text(answer)
                return step["outcome"]
            if kind == "open":
                event = self._open(started)
            elif kind == "write":
                event = self._write(batch, started)
            elif kind == "wait":
                time.sleep(step["ms"] / 1000)
                event = {"type": "waited", "elapsed_ms": self._elapsed(started)}
            elif kind == "capture":
                event = {"type": "capture_failed", "operation": "read", "errno": None,
                         "error": "this host keeps no record of the generation it wrote, so it cannot capture it"}
            elif kind == "divert":
                event = self._divert(step["cause"], batch)
            else:
                raise RuntimeError(f"unknown step {kind!r}")
            answer = self.policy.flush_step({"state": self.state, "event": event})
