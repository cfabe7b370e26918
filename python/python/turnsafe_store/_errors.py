"""The exceptions of turnsafe_store (raised by the native module too)."""

from __future__ import annotations

from typing import Any, Optional


class Error(Exception):
    """Base of every turnsafe_store error. ``cause`` is the policy's cause
    label (``disk``, ``locked``, ...) when a failure had one."""

    cause: Optional[str] = None


class InvalidSessionId(Error, ValueError):
    """A session id that is not safe as a file name: 1 to 128 bytes of ASCII
    letters, digits, ``-``, ``_``, ``.`` and ``:``, not starting with ``.``,
    without ``..``."""


class Refused(Error):
    """Refused while another writer holds a live turn lease, a capture is
    not settled, or a process holds files the command would replace."""


class HistoryIncomplete(Error):
    """A read whose history is not complete: an unsettled capture of a
    retired database generation holds rows of the session that the
    database lacks. ``rows`` is what the read would have returned (every
    stored row, in order); ``captures`` lists each capture as
    ``{"path", "cause", "rows"}``. Settle the capture (``turnsafe recover
    --install`` or ``--dismiss``) to make the history whole; until then,
    building a turn on ``rows`` would build it on a history without them."""

    def __init__(self, message: str, rows: Any = None, captures: Any = None) -> None:
        super().__init__(message)
        self.rows = rows if rows is not None else []
        self.captures = captures if captures is not None else []

    def __reduce__(self):  # pragma: no cover - pickling keeps the rows
        return (type(self), (str(self), self.rows, self.captures))


class TurnNotPersisted(Error):
    """A batch was not committed. ``outcome`` says where every message is:
    diverted with a receipt, or handed back."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.cause = getattr(outcome, "cause", None)
        error = getattr(outcome, "error", None) or "session_persistence_failed"
        copy = getattr(outcome, "copy", None) or {}
        title = copy.get("title") if isinstance(copy, dict) else None
        super().__init__(f"{error}: {title}" if title else error)

    def __reduce__(self):  # pragma: no cover - pickling keeps the outcome
        return (type(self), (self.outcome,))
