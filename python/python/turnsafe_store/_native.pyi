"""Types of the native module (turnsafe_store._native)."""

from os import PathLike
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, TypeVar, Union

_Path = Union[str, "PathLike[str]"]
_O = TypeVar("_O", bound="Outcome")
_S = TypeVar("_S", bound="Store")
Message = Dict[str, Any]

SCHEMA_VERSION: int

class Outcome:
    """What one ``append`` did. Attributes are named as the keys of the JSON
    object ``turnsafe append`` prints; nested values are dicts."""

    @property
    def persisted(self) -> bool: ...
    @property
    def operation(self) -> Optional[str]: ...
    @property
    def cause(self) -> Optional[str]: ...
    @property
    def action(self) -> Optional[str]: ...
    @property
    def attempts(self) -> int: ...
    @property
    def committed(self) -> int: ...
    @property
    def diverted(self) -> int: ...
    @property
    def handed_back(self) -> int: ...
    @property
    def receipt(self) -> Optional[Dict[str, Any]]: ...
    @property
    def divert_error(self) -> Optional[Dict[str, Any]]: ...
    @property
    def divert_residue(self) -> Optional[Dict[str, Any]]: ...
    @property
    def pending_capture(self) -> Optional[Dict[str, Any]]: ...
    @property
    def capture(self) -> Optional[Dict[str, Any]]: ...
    @property
    def durable(self) -> bool:
        """Whether what this outcome says is stored survives a power cut
        now: ``False`` for a commit under ``synchronous="normal"``."""
    @property
    def copy(self) -> Optional[Dict[str, Any]]: ...
    @property
    def error(self) -> Optional[str]: ...
    @property
    def uids(self) -> List[str]: ...
    @property
    def minted_uids(self) -> List[str]: ...
    def to_dict(self) -> Dict[str, Any]:
        """The JSON object ``turnsafe append`` prints, as a dict."""
    def to_json(self) -> str:
        """The same object as JSON text."""
    def raise_for_status(self: _O) -> _O:
        """Raise ``TurnNotPersisted`` unless the batch was committed."""

class Completions:
    """Answers to work handed over with ``Store._append_then`` (and
    ``_show_then``, ``_pop_then``, ``_clear_then``), for one event loop:
    ``fileno()`` is readable while some are ready."""

    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def drain(self) -> List[Tuple[int, bool, Any]]:
        """What is ready, oldest first: ``(ticket, True, result)`` (an
        append's ``Outcome``, a read's or an edit's value) or ``(ticket,
        False, exception)``."""

class Store:
    """One turnsafe home (``state.db`` and ``sessions/``), safe to share
    between threads. The GIL is released around every effect.

    ``db`` is a PostgreSQL URL (``postgres://user@host:port/db``, with
    ``sslmode=require`` or ``disable``; several ``host:port`` with
    ``target_session_attrs=read-write`` for failover): messages go to that
    server instead of ``home/state.db``, and the divert folder stays under
    ``home`` (``home/sessions/``). With ``db`` None, ``TURNSAFE_DB`` is used
    when set and not empty, else SQLite at ``home/state.db``."""

    def __init__(
        self,
        home: _Path,
        *,
        db: Optional[str] = None,
        synchronous: Literal["full", "normal"] = "full",
        holder: Optional[str] = None,
        lease_ttl: float = 30,
    ) -> None: ...
    @property
    def home(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def append(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        uids: Optional[Sequence[Optional[str]]] = None,
    ) -> Outcome:
        """Flush one batch. Each message is any JSON object (dict), stored
        exactly as given. Its uid is ``uids[i]`` when ``uids`` is given
        (``None`` entries are minted), else the message's own string ``uid``
        field (which stays in the message), else one turnsafe mints (listed
        in ``Outcome.minted_uids``). Resend a batch that was not persisted
        with ``uids=outcome.uids``: no message is then stored twice."""
    def show(
        self, session_id: str, *, limit: Optional[int] = None, archived: bool = False
    ) -> List[Message]:
        """The newest ``limit`` messages in seq order; with ``archived=True``
        the archived rows instead, newest archived first, each
        ``{"uid", "seq", "message", "archived_at", "reason"}``."""
    def restore(
        self,
        session_id: str,
        *,
        uids: Optional[List[str]] = None,
        reason: Optional[str] = None,
        since: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Bring archived rows back at their seqs, in one transaction; a uid
        active again is skipped. ``reason="delete"`` brings back what a
        LangGraph ``delete_thread`` of the thread whose safe id is
        ``session_id`` marked. ``{"restored", "skipped_active", "not_archived",
        "checkpoints_restored", "writes_restored"}``."""
    def fork(self, session_id: str, at_seq: int, new_session: str) -> Dict[str, Any]:
        """Copy the messages up to and including ``at_seq`` into ``new_session``,
        keeping the lineage; idempotent. Raises ``Refused`` when it exists otherwise."""
    def replace_suffix(
        self,
        session_id: str,
        start_seq: int,
        items: List[Message],
        *,
        expected_uids: Optional[List[str]] = None,
        prune_before: Optional[int] = None,
    ) -> bool:
        """Replace the messages from ``start_seq`` on in one transaction,
        archiving what was replaced; False when the suffix changed."""
    def lineage(self, session_id: str) -> Optional[Dict[str, Any]]: ...
    def delete_session(self, session_id: str) -> Dict[str, int]:
        """Delete the session for good (messages, archive, lineage)."""
    def rows(self, session_id: str, *, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Like ``show``, as ``{"uid", "seq", "message"}`` dicts."""
    def pop(self, session_id: str) -> Optional[Message]:
        """Remove and return the newest message (``None`` when there is
        none). A write: raises ``Error`` with the policy's ``cause`` when it
        cannot be done."""
    def clear(self, session_id: str) -> int:
        """Remove every message, and settle the session's pending divert
        lines as ``cleared``; how many stored messages went."""
    def _append_then(
        self,
        completions: Completions,
        ticket: int,
        session_id: str,
        messages: Sequence[Message],
        *,
        uids: Optional[Sequence[Optional[str]]] = None,
    ) -> None:
        """Hand one batch over without waiting; its outcome reaches
        ``completions`` under ``ticket``."""
    def _show_then(
        self, completions: Completions, ticket: int, session_id: str, *, limit: Optional[int] = None
    ) -> None: ...
    def _pop_then(self, completions: Completions, ticket: int, session_id: str) -> None: ...
    def _clear_then(self, completions: Completions, ticket: int, session_id: str) -> None: ...
    def _lg_put_checkpoint(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        parent_checkpoint_id: Optional[str],
        type_: Optional[str],
        checkpoint: bytes,
        metadata: str,
    ) -> Outcome:
        """One LangGraph checkpoint through the flush machine (turnsafe_store.langgraph)."""
    def _lg_put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        task_path: str,
        writes: Sequence[Tuple[int, str, Optional[str], bytes]],
    ) -> Outcome:
        """One task's pending writes, each ``(idx, channel, type, value)``."""
    def _lg_read(
        self,
        thread_id: Optional[str] = None,
        checkpoint_ns: Optional[str] = None,
        checkpoint_id: Optional[str] = None,
        before: Optional[str] = None,
        filter: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[Tuple[str, str, str, Optional[str], Optional[str], bytes, str, List[Tuple[str, str, Optional[str], bytes, str, int]]]]:
        """Live checkpoints, newest first, each with its writes."""
    def _lg_edit(self, kind: str, threads: Sequence[str], runs: Sequence[str] = ...) -> Dict[str, int]:
        """A LangGraph delete, prune or copy."""
    def _settle(self) -> None:
        """Wait until every batch handed over has settled."""
    def release(self, session_id: str) -> None:
        """Give back this store's turn lease on the session."""
    def close(self) -> None:
        """Release every lease and close the database."""
    def __enter__(self: _S) -> _S: ...
    def __exit__(self, *exc: object) -> None: ...

def replay(
    home: _Path,
    *,
    db: Optional[str] = None,
    session: Optional[str] = None,
    force: bool = False,
    dry_run: bool = False,
) -> Dict[str, Any]:
    """Import the diverted transcripts under ``home/sessions/`` into the
    home's store (``db``, else ``TURNSAFE_DB``, else ``home/state.db``):
    the report of ``turnsafe replay --json`` (the summary's fields, and
    ``file_reports``). Raises ``Refused`` while a live lease is held or a
    capture is not settled, unless ``force``."""

def import_hermes(
    source: _Path,
    home: _Path,
    *,
    session: Optional[str] = None,
    dry_run: bool = False,
    db: Optional[str] = None,
) -> Dict[str, Any]:
    """Import the Hermes home ``source`` (``HERMES_HOME``: ``state.db`` and
    ``sessions/``) into the turnsafe home ``home`` (``home/state.db``), or
    with ``db`` (else ``TURNSAFE_DB``) into that PostgreSQL database, the
    home keeping only the quarantine: the
    report of ``turnsafe import hermes --json`` (the ``end`` line's fields:
    ``sessions``, ``rows``, ``lines``, ``imported``, ``archived``,
    ``duplicate``, ``possible_duplicate``, ``quarantined``, ``torn``,
    ``renamed``, ``refused``, ``quarantine``, ``copy_attempts``...; and
    ``session_reports``, one dict per session, each listing its
    ``possible_duplicates``). The Hermes home is never written to. Raises ``Refused``
    when ``home`` is ``source`` or Hermes kept writing during every copy."""

def doctor(home: _Path, *, db: Optional[str] = None) -> Dict[str, Any]:
    """Findings about a home, or about the PostgreSQL server ``db`` (else
    ``TURNSAFE_DB``) names: ``ok``, ``findings``, ``facts``."""

def canonical_json(text: str) -> str:
    """The canonical JSON text of a JSON text: RFC 8785's key order and
    string form, numbers as written (an exponent as ``e`` with its sign).
    Two records are the same only when these bytes are. Raises
    ``ValueError`` for a text that is not JSON (a lone surrogate included)."""

def digest_json(text: str) -> str:
    """``sha256:<hex>`` of ``canonical_json(text)``'s UTF-8 bytes. Raises
    ``ValueError`` for a text that is not JSON."""

def search(
    home: _Path, query: str, *, session: Optional[str] = None, limit: int = 20, archived: bool = False
) -> List[Dict[str, Any]]:
    """Full-text search that never misses a committed message: hits as
    ``turnsafe search --json`` prints them (``session``, ``uid``, ``seq``,
    ``role``, ``snippet`` with matches in ``[`` ``]``). With ``archived``,
    the archive's rows too, after them, each with ``archived: True``,
    ``archived_at`` and ``reason``."""
