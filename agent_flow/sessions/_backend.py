"""What the store core hands to a backend, and how stored rows are read back.

A backend (`_Backend`: SQLite or memory, synchronous; `_AsyncBackend`: PostgreSQL) stores
sessions as serialized rows: history entries and events as JSON text, the environment as its
snapshot without the change log plus the changes as rows. This module holds those row types,
the writes the core asks a backend to make, and the decoding of rows back into entries,
environments and events.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from agent_flow.environment import Environment
from agent_flow.errors import (
    EnvironmentValidationError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
    UserError,
)
from agent_flow.events import AgentEvent, event_from_json
from agent_flow.history import HISTORY_ENTRY_ADAPTER, HistoryEntry
from agent_flow.sessions._usage import USAGE_COLUMNS, USAGE_FIELDS, _Totals
from agent_flow.sessions.models import Checkpoint, Lease, SessionInfo, SessionStatus


class _StaleError(Exception):
    """Another store wrote the session since this one last saw it (internal; triggers a retry)."""


@dataclass(frozen=True, slots=True)
class _EntryRow:
    entry_id: str
    kind: str
    data: str


@dataclass(frozen=True, slots=True)
class _EventRow:
    run_id: str
    seq: int
    kind: str
    data: str
    #: The fence of the event's own run, when it is not the writer's (saved late).
    fence: int | None = None


@dataclass(frozen=True, slots=True)
class _EnvironmentWrite:
    base: str  # the to_json object without its change log
    version: int
    changes: tuple[tuple[int, str], ...]  # (version, change JSON), oldest first
    reset: bool  # delete every stored change first
    trim_through: int  # delete stored changes with a version up to this


@dataclass(frozen=True, slots=True)
class _StepWrite:
    session_id: str
    expected_revision: str
    revision: str
    keep_entries: int  # stored entries from this position on are replaced by `entries`
    entries: tuple[_EntryRow, ...]
    environment: _EnvironmentWrite | None
    events: tuple[_EventRow, ...]
    status: SessionStatus | None
    updated_at: datetime
    checkpoints: tuple[Checkpoint, ...] = ()
    fence: int | None = None  # the writer's lease (see `_lease._writable`); None: un-leased
    lease_run: str | None = None  # the writer's run, when it says (`_lease._writable`)


@dataclass(frozen=True, slots=True)
class _EventQuery:
    """Which of a session's events to read: from a position, or after an id; then a filter.

    With `after_id`, the events whose id is above it, by id (`offset` is then 0); otherwise
    from position `offset` on, by position (the same order). `run_id` keeps that run's events
    with a ``seq`` above `after_seq`; `limit` keeps the first ones.
    """

    offset: int = 0
    after_id: int | None = None
    run_id: str | None = None
    after_seq: int = -1
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class _Import:
    """A whole session to store at once (read from an export)."""

    info: SessionInfo
    revision: str
    entries: tuple[_EntryRow, ...]
    environment: str | None
    changes: tuple[tuple[int, str], ...]
    events: tuple[_EventRow, ...]


@dataclass(frozen=True, slots=True)
class _Stored:
    """One consistent read of a session."""

    info: SessionInfo
    revision: str
    entries: tuple[str, ...]
    environment: str | None
    changes: tuple[str, ...]
    events: tuple[str, ...] = ()


#: The ``sessions`` columns a `SessionInfo` is read from, in every SQL backend.
_INFO_COLUMNS = (
    "id, agent, title, status, created_at, updated_at, metadata, steps, entry_count, "
    f"event_count, environment_version, task, {USAGE_COLUMNS}, owner, last_event_id, "
    "lease_run, lease_fence"
)
#: The ``sessions`` columns of its lease (`_lease._LeaseState`).
_LEASE_COLUMNS = "lease_run, lease_holder, lease_fence, lease_expires"


class _Row(Protocol):
    """A stored row read by column name (``sqlite3.Row``, a psycopg ``dict_row``)."""

    def __getitem__(self, key: str, /) -> Any: ...


def _info_of(row: _Row, when: Callable[[Any], datetime]) -> SessionInfo:
    """The `SessionInfo` of a row of `_INFO_COLUMNS`; `when` reads a stored timestamp."""
    return SessionInfo(
        id=row["id"],
        agent=row["agent"],
        title=row["title"],
        status=row["status"],
        created_at=when(row["created_at"]),
        updated_at=when(row["updated_at"]),
        steps=row["steps"],
        entry_count=row["entry_count"],
        event_count=row["event_count"],
        environment_version=row["environment_version"],
        metadata=json.loads(row["metadata"]),
        task=row["task"],
        **{name: row[name] for name in USAGE_FIELDS},
        owner=row["owner"],
        last_event_id=row["last_event_id"],
        lease_run=row["lease_run"],
        lease_fence=row["lease_fence"],
    )


def _info_values(info: SessionInfo, when: Callable[[datetime], object]) -> tuple[object, ...]:
    """The values of `_INFO_COLUMNS` for `info` (an INSERT); `when` writes a timestamp."""
    return (
        info.id,
        info.agent,
        info.title,
        info.status,
        when(info.created_at),
        when(info.updated_at),
        json.dumps(info.metadata, separators=(",", ":")),
        info.steps,
        info.entry_count,
        info.event_count,
        info.environment_version,
        info.task,
        *_Totals.of(info).values(),
        info.owner,
        info.last_event_id,
        info.lease_run,
        info.lease_fence,
    )


def _stepped(info: SessionInfo, write: _StepWrite, event_ids: list[int]) -> SessionInfo:
    """The session's description after `write`, whose events got the ids `event_ids`."""
    environment = write.environment
    return info.model_copy(
        update={
            "last_event_id": event_ids[-1] if event_ids else info.last_event_id,
            "updated_at": write.updated_at,
            "status": write.status if write.status is not None else info.status,
            "steps": info.steps + 1,
            "entry_count": write.keep_entries + len(write.entries),
            "event_count": info.event_count + len(write.events),
            "environment_version": (
                environment.version if environment is not None else info.environment_version
            ),
            # The step's model calls (the agent's and the summarizer's) join the totals.
            **_Totals.of(info).add((e.kind, e.data) for e in write.events).fields(),
        }
    )


class _Backend(Protocol):
    """A synchronous backend (SQLite, memory); `_AsyncBackend` says what each operation does."""

    def open(self) -> None: ...
    def create(self, info: SessionInfo, revision: str) -> None: ...
    def info(self, session_id: str) -> SessionInfo: ...
    def read(self, session_id: str, with_events: bool) -> _Stored: ...
    def write_step(self, write: _StepWrite) -> SessionInfo: ...
    def claim(self, session_id: str, run_id: str, holder: str, ttl: float) -> Lease: ...
    def renew(self, lease: Lease, ttl: float) -> Lease: ...
    def release(self, lease: Lease) -> None: ...
    def sessions(self, limit: int, owner: str | None) -> list[SessionInfo]: ...
    def events(self, session_id: str, query: _EventQuery) -> list[tuple[int, str]]: ...
    def write_checkpoints(
        self,
        session_id: str,
        rows: tuple[Checkpoint, ...],
        synced: bool,
        fence: int | None,
        lease_run: str | None,
    ) -> None: ...
    def checkpoints(self, session_id: str, run_id: str) -> list[Checkpoint]: ...
    def insert(self, session: _Import) -> None: ...
    def delete(self, session_id: str) -> None: ...
    def close(self) -> None: ...


class _AsyncBackend(Protocol):
    """What `_StoreBase` calls: the `_Backend` operations, awaited (see `_base._OnWorker`).

    Each is one transaction. `write_step`, `claim`, `renew`, `release` and a fenced
    `write_checkpoints` lock the session (its row) and decide by `_lease` on what they read
    under that lock; `events` returns (event id, JSON) pairs.
    """

    async def open(self) -> None: ...
    async def create(self, info: SessionInfo, revision: str) -> None: ...
    async def info(self, session_id: str) -> SessionInfo: ...
    async def read(self, session_id: str, with_events: bool) -> _Stored: ...
    async def write_step(self, write: _StepWrite) -> SessionInfo: ...
    async def claim(self, session_id: str, run_id: str, holder: str, ttl: float) -> Lease: ...
    async def renew(self, lease: Lease, ttl: float) -> Lease: ...
    async def release(self, lease: Lease) -> None: ...
    async def sessions(self, limit: int, owner: str | None) -> list[SessionInfo]: ...
    async def events(self, session_id: str, query: _EventQuery) -> list[tuple[int, str]]: ...
    async def write_checkpoints(
        self,
        session_id: str,
        rows: tuple[Checkpoint, ...],
        synced: bool,
        fence: int | None,
        lease_run: str | None,
    ) -> None: ...
    async def checkpoints(self, session_id: str, run_id: str) -> list[Checkpoint]: ...
    async def insert(self, session: _Import) -> None: ...
    async def delete(self, session_id: str) -> None: ...
    async def close(self) -> None: ...


def _not_found(session_id: str) -> SessionNotFoundError:
    return SessionNotFoundError(
        f"no session {session_id!r} is stored; list the sessions to find its id"
    )


def _exists(session_id: str) -> SessionExistsError:
    return SessionExistsError(
        f"a session {session_id!r} is already stored; choose another id or delete that session"
    )


def _checkpoint_taken(session_id: str, rows: tuple[Checkpoint, ...]) -> StoreError:
    runs = sorted({row.run_id for row in rows})
    return StoreError(
        f"session {session_id!r} already holds a checkpoint at one of positions "
        f"{sorted(row.position for row in rows)} of run(s) {runs}: two executions of one run "
        "wrote it; this one stops so that the other's record stands"
    )


def _problem(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _decode_entries(stored: _Stored) -> list[HistoryEntry]:
    try:
        return [HISTORY_ENTRY_ADAPTER.validate_json(data) for data in stored.entries]
    except ValidationError as err:
        raise StoreError(
            f"session {stored.info.id!r} holds a history entry that cannot be read "
            f"({_problem(err)}); it was written by an incompatible version, export it with that "
            "version"
        ) from err


def _environment_text(base: str, changes: Iterable[str]) -> str:
    payload = json.loads(base)
    payload["changes"] = [json.loads(change) for change in changes]
    return json.dumps(payload, separators=(",", ":"))


def _decode_environment(stored: _Stored) -> Environment | None:
    if stored.environment is None:
        return None
    try:
        return Environment.from_json(_environment_text(stored.environment, stored.changes))
    except (UserError, EnvironmentValidationError) as err:
        raise StoreError(
            f"the environment of session {stored.info.id!r} cannot be read ({err}); it was "
            "written by an incompatible version, export it with that version"
        ) from err


def _decode_event(data: str, session_id: str) -> AgentEvent:
    try:
        return event_from_json(data)
    except ValidationError as err:
        raise StoreError(
            f"session {session_id!r} holds an event that cannot be read ({_problem(err)}); it was "
            "written by an incompatible version, export it with that version"
        ) from err
