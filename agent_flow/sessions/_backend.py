"""What the store core hands to a backend, and how stored rows are read back.

A backend (`_Backend`: SQLite or memory, synchronous; `_AsyncBackend`: PostgreSQL) stores
sessions as serialized rows: history entries and events as JSON text, the environment as its
snapshot without the change log plus the changes as rows. This module holds those row types,
the writes the core asks a backend to make, and the decoding of rows back into entries,
environments and events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pydantic import ValidationError

from agent_flow.environment import Environment
from agent_flow.errors import (
    EnvironmentValidationError,
    SessionNotFoundError,
    StoreError,
    UserError,
)
from agent_flow.events import AgentEvent, event_from_json
from agent_flow.history import HISTORY_ENTRY_ADAPTER, HistoryEntry
from agent_flow.sessions._usage import _Totals
from agent_flow.sessions.models import Checkpoint, SessionInfo, SessionStatus


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


def _stepped(info: SessionInfo, write: _StepWrite) -> SessionInfo:
    environment = write.environment
    return info.model_copy(
        update={
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
    def open(self) -> None: ...
    def create(self, info: SessionInfo, revision: str) -> None: ...
    def info(self, session_id: str) -> SessionInfo: ...
    def read(self, session_id: str, with_events: bool) -> _Stored: ...
    def write_step(self, write: _StepWrite) -> SessionInfo: ...
    def sessions(self, limit: int, owner: str | None) -> list[SessionInfo]: ...
    def events(
        self, session_id: str, offset: int, run_id: str | None, after_seq: int, limit: int | None
    ) -> list[str]: ...
    def write_checkpoints(
        self, session_id: str, rows: tuple[Checkpoint, ...], synced: bool
    ) -> None: ...
    def checkpoints(self, session_id: str, run_id: str) -> list[Checkpoint]: ...
    def insert(self, session: _Import) -> None: ...
    def delete(self, session_id: str) -> None: ...
    def close(self) -> None: ...


class _AsyncBackend(Protocol):
    """What `_StoreBase` calls: the `_Backend` operations, awaited (see `_base._OnWorker`)."""

    async def open(self) -> None: ...
    async def create(self, info: SessionInfo, revision: str) -> None: ...
    async def info(self, session_id: str) -> SessionInfo: ...
    async def read(self, session_id: str, with_events: bool) -> _Stored: ...
    async def write_step(self, write: _StepWrite) -> SessionInfo: ...
    async def sessions(self, limit: int, owner: str | None) -> list[SessionInfo]: ...
    async def events(
        self, session_id: str, offset: int, run_id: str | None, after_seq: int, limit: int | None
    ) -> list[str]: ...
    async def write_checkpoints(
        self, session_id: str, rows: tuple[Checkpoint, ...], synced: bool
    ) -> None: ...
    async def checkpoints(self, session_id: str, run_id: str) -> list[Checkpoint]: ...
    async def insert(self, session: _Import) -> None: ...
    async def delete(self, session_id: str) -> None: ...
    async def close(self) -> None: ...


def _not_found(session_id: str) -> SessionNotFoundError:
    return SessionNotFoundError(
        f"no session {session_id!r} is stored; list the sessions to find its id"
    )


def _exists(session_id: str) -> StoreError:
    return StoreError(
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
