"""turnsafe's native session store for Python.

Every message of a turn ends in exactly one place: committed in
``state.db``, in a durable divert file with a receipt, or handed back with
an :class:`Outcome` that says plainly that neither happened.

    >>> from turnsafe_store import Store
    >>> store = Store("~/.myagent")
    >>> out = store.append("user-42", [{"role": "user", "content": "hi"}])
    >>> out.persisted
    True
"""

from ._errors import Error, HistoryIncomplete, InvalidSessionId, Refused, TurnNotPersisted
from ._native import SCHEMA_VERSION, Outcome, Store, canonical_json, digest_json, doctor, import_hermes, replay, search

__all__ = [
    "SCHEMA_VERSION",
    "Error",
    "HistoryIncomplete",
    "InvalidSessionId",
    "Outcome",
    "Refused",
    "Store",
    "TurnNotPersisted",
    "canonical_json",
    "digest_json",
    "doctor",
    "import_hermes",
    "replay",
    "search",
]
