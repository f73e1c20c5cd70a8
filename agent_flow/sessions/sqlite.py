"""Sessions: a run's history, environment and events, saved after every step, and reloaded.

This module owns `SessionInfo`, `SessionState`, the `SessionStore` protocol with its two
implementations — `SQLiteSessionStore` (the default: one file, no server) and
`InMemorySessionStore` (the same semantics, for tests) — and the JSON-lines export format.

A session is created once (`SessionStore.create`), then saved at every step boundary with
`SessionStore.save_step(id, history=..., environment=..., events=...)`; `load` gives back its
entries and environment (``state.history()`` rebuilds a `History`) to resume it with a new user
message. Call `save_step` only when the history is consistent (every tool call answered): that is
what a reader finds, because a step is one transaction.

Cost of a step. `save_step` writes what is new, not the session: the store remembers, per
session, the entries it saved last (the very objects), the `History` and `Environment` objects
it saw and their versions. When the same history only grew since (its version rose by exactly
the number of entries added and the last saved entry is still in place) the new entries are
appended; otherwise (pruned, summarized, elided, or another history object) the saved entries
are compared with the history's and the rows from the first difference on are rewritten, in
the same transaction. This relies on `History.add` raising the version by one per entry and
on pruning never lengthening the history (true of every built-in strategy). Events are
appended. The environment is kept as its latest snapshot *without* its change log, plus the
change log as rows: a step writes the snapshot and the changes made since the last step (none
of it when the version did not move), and trims changes that fell out of ``max_changes``, so
`load` rebuilds an environment whose `Environment.to_json` is exactly what was saved.

Durability. Every write is one SQLite transaction in WAL mode, so a process killed at any
moment (SIGKILL) loses at most the step in flight; reopening finds every completed step, with
the history and the environment of the same step. ``synchronous=FULL`` (the default) also
syncs the log at each commit, so a completed step survives a power loss too: one fsync per
step is small next to a model call; ``synchronous="normal"`` trades that away for speed.

Concurrency. Each `SQLiteSessionStore` runs its one connection on its own worker thread, off
the event loop. Several stores, in one process or many, may read while one writes (WAL);
writers queue on SQLite's lock for up to ``busy_timeout`` seconds, then fail with
`StoreError`. A store notices when another store wrote a session since it last did (each
write stamps a new revision) and then compares against what is stored, so two writers never
corrupt a session: the last write wins whole.

Storage (schema version `SCHEMA_VERSION`, kept in ``PRAGMA user_version``; opening an older
file migrates it, a newer one raises `StoreError`)::

    sessions(id PK, agent, title, status, created_at, updated_at, metadata JSON, steps,
             entry_count, event_count, environment_version, environment JSON, revision)
    entries(session_id, position, entry_id, kind, data JSON)          PK (session_id, position)
    environment_changes(session_id, version, data JSON)               PK (session_id, version)
    events(session_id, position, run_id, seq, kind, data JSON)        PK (session_id, position)

Export format (`SessionStore.export`, read back by `SessionStore.import_`): UTF-8 JSON lines,
each an object tagged by ``kind`` (`ExportLine`): one ``session`` line (format and
`SessionInfo`), then one ``entry`` line per history entry in order, one ``environment`` line
(the `Environment.to_json` object, change log included) if the session has one, one ``event``
line per event in order, and a closing ``end`` line with the counts, so a truncated file is
refused rather than imported in part.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import json
import os
import re
import sqlite3
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Annotated, Any, Final, Literal, ParamSpec, Protocol, Self, TypeAlias, TypeVar
from uuid import uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agent_flow._types import JsonObject
from agent_flow.environment import Environment
from agent_flow.errors import (
    EnvironmentValidationError,
    SessionNotFoundError,
    StoreError,
    UserError,
)
from agent_flow.events import AgentEvent, event_from_json, event_to_json
from agent_flow.history import HISTORY_ENTRY_ADAPTER, History, HistoryEntry
from agent_flow.tokens import ApproxCounter, TokenCounter

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_LINE_ADAPTER",
    "SCHEMA_VERSION",
    "EndLine",
    "EntryLine",
    "EnvironmentLine",
    "EventLine",
    "ExportLine",
    "InMemorySessionStore",
    "SQLiteSessionStore",
    "SessionHeaderLine",
    "SessionInfo",
    "SessionState",
    "SessionStatus",
    "SessionStore",
    "default_store_path",
]

#: What a session is doing: ``active`` (running or resumable), ``waiting`` (for the user, e.g.
#: an approval or a question), ``completed``, ``failed`` or ``cancelled``.
SessionStatus: TypeAlias = Literal["active", "waiting", "completed", "failed", "cancelled"]
_STATUSES: frozenset[str] = frozenset(("active", "waiting", "completed", "failed", "cancelled"))

#: The version of the format `SessionStore.export` writes.
EXPORT_FORMAT: Final = 1

_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def default_store_path() -> Path:
    """Return where `SQLiteSessionStore` keeps sessions when given no path.

    ``$AGENT_FLOW_HOME/sessions.db`` if that variable is set, else
    ``$XDG_DATA_HOME/agent_flow/sessions.db`` if that is set to an absolute path, else
    ``~/.local/share/agent_flow/sessions.db``.
    """
    home = os.environ.get("AGENT_FLOW_HOME")
    if home:
        return Path(home).expanduser() / "sessions.db"
    data = os.environ.get("XDG_DATA_HOME")
    if data and Path(data).is_absolute():
        return Path(data) / "agent_flow" / "sessions.db"
    return Path.home() / ".local" / "share" / "agent_flow" / "sessions.db"


def _now() -> datetime:
    return datetime.now(UTC)


def _timestamp(moment: datetime) -> str:
    """A fixed-width UTC ISO text, so that stored timestamps sort as text."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


# -- public models ----------------------------------------------------------------------------


class SessionInfo(BaseModel):
    """What a store knows about a session without loading it.

    Attributes:
        id: The session id (letters, digits and ``._:-``, at most 128 characters).
        agent: The name of the agent that runs it.
        title: A human title (the first task, typically).
        created_at: When it was created.
        updated_at: When it was last saved.
        status: What it is doing (`SessionStatus`).
        steps: How many steps were saved.
        entry_count: History entries stored now (after any pruning).
        event_count: Events stored, over all runs.
        environment_version: The stored environment's version (0 before the first step).
        metadata: Free JSON the caller attached at creation.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    agent: str
    title: str
    created_at: AwareDatetime
    updated_at: AwareDatetime
    status: SessionStatus
    steps: int = Field(ge=0)
    entry_count: int = Field(ge=0)
    event_count: int = Field(ge=0)
    environment_version: int = Field(ge=0)
    metadata: JsonObject = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionState:
    """A loaded session: what `SessionStore.load` returns.

    Attributes:
        info: The session's description.
        entries: Its history entries, in order, as saved at the last step.
        environment: Its environment as saved at the last step; None before the first step.
    """

    info: SessionInfo
    entries: tuple[HistoryEntry, ...]
    environment: Environment | None

    def history(self, *, counter: TokenCounter | None = None) -> History:
        """Return a new `History` of the entries, counted with `counter` (default counter if None).

        Raises:
            UserError: The entries break the history's unit rules (never for saved entries).
        """
        return History(self.entries, counter=counter)


class SessionHeaderLine(BaseModel):
    """The first line of an export: the format and the session's description."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["session"] = "session"
    format: Literal[1] = EXPORT_FORMAT
    session: SessionInfo


class EntryLine(BaseModel):
    """One history entry of an export, in history order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["entry"] = "entry"
    entry: HistoryEntry


class EnvironmentLine(BaseModel):
    """The environment of an export: the `Environment.to_json` object, change log included."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["environment"] = "environment"
    environment: JsonObject


class EventLine(BaseModel):
    """One event of an export, in the order they were saved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["event"] = "event"
    event: AgentEvent


class EndLine(BaseModel):
    """The last line of an export: how many entries and events came before it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["end"] = "end"
    entries: int = Field(ge=0)
    events: int = Field(ge=0)


ExportLine: TypeAlias = Annotated[
    SessionHeaderLine | EntryLine | EnvironmentLine | EventLine | EndLine,
    Field(discriminator="kind"),
]
#: Validates one line of an export (JSON tag: ``kind``).
EXPORT_LINE_ADAPTER: TypeAdapter[ExportLine] = TypeAdapter(ExportLine)


# -- the protocol -----------------------------------------------------------------------------


class SessionStore(Protocol):
    """Where sessions live; every method is a coroutine, every failure a `StoreError`.

    Implementations: `SQLiteSessionStore`, `InMemorySessionStore`. Use one as an async context
    manager, or call `close` when done.
    """

    async def create(
        self,
        *,
        session_id: str | None = None,
        agent: str = "agent",
        title: str = "",
        metadata: JsonObject | None = None,
    ) -> SessionInfo:
        """Create an empty session (status ``active``) and return its description.

        Raises:
            UserError: `session_id` is not a valid id.
            StoreError: A session with that id exists.
        """
        ...

    async def save_step(
        self,
        session_id: str,
        *,
        history: History,
        environment: Environment,
        events: Sequence[AgentEvent] = (),
        status: SessionStatus | None = None,
    ) -> SessionInfo:
        """Save one step in one transaction: the history and environment now, the new events.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: `status` is not a `SessionStatus`.
        """
        ...

    async def load(self, session_id: str) -> SessionState:
        """Return the session as saved at its last step.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def info(self, session_id: str) -> SessionInfo:
        """Return the session's description without loading it.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def list(self, *, limit: int = 50) -> builtins.list[SessionInfo]:
        """Return up to `limit` sessions, the most recently updated first."""
        ...

    async def events(
        self,
        session_id: str,
        *,
        offset: int = 0,
        run_id: str | None = None,
        after_seq: int = -1,
        limit: int | None = None,
    ) -> builtins.list[AgentEvent]:
        """Return the session's events in the order saved.

        Args:
            session_id: The session.
            offset: Skip the session's first `offset` events (to read on from where one left
                off, pass the number of events already read).
            run_id: Only the events of this run.
            after_seq: With `run_id`: only events with a larger ``seq``.
            limit: At most this many events.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `limit`, or `after_seq` without `run_id`.
        """
        ...

    async def export(self, session_id: str, target: str | Path | IO[str]) -> None:
        """Write the session as JSON lines to a file path or a text stream (see module doc).

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def import_(
        self, source: str | Path | IO[str], *, session_id: str | None = None
    ) -> SessionInfo:
        """Store a session read from what `export` wrote, under `session_id` if given.

        Raises:
            StoreError: The source is not a complete export, or the id is taken.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Delete the session and everything stored with it.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def close(self) -> None:
        """Release the store; later calls raise `StoreError`. Closing twice is harmless."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


# -- what the store core hands to a backend -------------------------------------------------------


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
        }
    )


class _Backend(Protocol):
    def open(self) -> None: ...
    def create(self, info: SessionInfo, revision: str) -> None: ...
    def info(self, session_id: str) -> SessionInfo: ...
    def read(self, session_id: str, with_events: bool) -> _Stored: ...
    def write_step(self, write: _StepWrite) -> SessionInfo: ...
    def sessions(self, limit: int) -> list[SessionInfo]: ...
    def events(
        self, session_id: str, offset: int, run_id: str | None, after_seq: int, limit: int | None
    ) -> list[str]: ...
    def insert(self, session: _Import) -> None: ...
    def delete(self, session_id: str) -> None: ...
    def close(self) -> None: ...


def _not_found(session_id: str) -> SessionNotFoundError:
    return SessionNotFoundError(
        f"no session {session_id!r} is stored; list the sessions to find its id"
    )


def _exists(session_id: str) -> StoreError:
    return StoreError(
        f"a session {session_id!r} is already stored; choose another id or delete that session"
    )


# -- the store logic shared by both implementations --------------------------------------------


@dataclass(slots=True)
class _Tracked:
    """What this store last saved of one session (touched on the event-loop thread only)."""

    revision: str
    entries: list[HistoryEntry]
    history: weakref.ref[History] | None = None
    history_version: int = -1
    environment: weakref.ref[Environment] | None = None
    environment_version: int = -1


_P = ParamSpec("_P")
_R = TypeVar("_R")

_RETRIES = 5


class _StoreBase:
    """The async API over a synchronous `_Backend`; subclasses say where the backend runs."""

    def __init__(self, backend: _Backend, where: str) -> None:
        self._backend = backend
        self._where = where
        self._closed = False
        # Serializes this store's writes, so that each plans against the state it last saved.
        self._lock = asyncio.Lock()
        self._tracked: dict[str, _Tracked] = {}

    async def _call(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        raise NotImplementedError

    async def _run(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._closed:
            raise StoreError(f"the session store {self._where} is closed; open a new one")
        return await self._call(fn, *args, **kwargs)

    # -- sessions ------------------------------------------------------------------------

    async def create(
        self,
        *,
        session_id: str | None = None,
        agent: str = "agent",
        title: str = "",
        metadata: JsonObject | None = None,
    ) -> SessionInfo:
        """Create an empty session (status ``active``) and return its description.

        Args:
            session_id: The id to use; a new random one (12 hex digits) if None.
            agent: The name of the agent that runs it.
            title: A human title.
            metadata: Free JSON to keep with it.

        Raises:
            UserError: `session_id` is not a valid id, or `metadata` is not JSON.
            StoreError: A session with that id exists.
        """
        sid = _check_id(session_id) if session_id is not None else uuid4().hex[:12]
        now = _now()
        try:
            info = SessionInfo(
                id=sid,
                agent=agent,
                title=title,
                created_at=now,
                updated_at=now,
                status="active",
                steps=0,
                entry_count=0,
                event_count=0,
                environment_version=0,
                metadata=metadata or {},
            )
        except ValidationError as err:
            raise UserError(f"cannot create session {sid!r}: {_problem(err)}") from err
        revision = uuid4().hex
        async with self._lock:
            await self._run(self._backend.create, info, revision)
            self._tracked[sid] = _Tracked(revision=revision, entries=[])
        return info

    async def save_step(
        self,
        session_id: str,
        *,
        history: History,
        environment: Environment,
        events: Sequence[AgentEvent] = (),
        status: SessionStatus | None = None,
    ) -> SessionInfo:
        """Save one step in one transaction: the history and environment now, the new events.

        Call it at a step boundary (every tool call of the history answered). It writes what
        changed since this store's last save of the session (see the module doc); the first
        save after `load`, after another store wrote the session, or with another history
        object compares against what is stored first.

        Args:
            session_id: The session.
            history: The whole history as it is now.
            environment: The environment as it is now.
            events: The events published since the last save (appended).
            status: The new status, or None to keep it.

        Returns:
            The session's description after the step.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: `status` is not a `SessionStatus`.
            StoreError: The store failed, or other writers kept changing the session.
        """
        if status is not None and status not in _STATUSES:
            raise UserError(
                f"status {status!r} is not a session status; use one of {sorted(_STATUSES)}"
            )
        event_rows = tuple(_EventRow(e.run_id, e.seq, e.kind, event_to_json(e)) for e in events)
        async with self._lock:
            for _ in range(_RETRIES):
                tracked = self._tracked.get(session_id)
                if tracked is None:
                    stored = await self._run(self._backend.read, session_id, False)
                    tracked = _Tracked(revision=stored.revision, entries=_decode_entries(stored))
                    self._tracked[session_id] = tracked
                history_version = history.version
                keep = _kept_entries(tracked, history)
                new = history.entries[keep:]
                env_version = environment.version
                write = _StepWrite(
                    session_id=session_id,
                    expected_revision=tracked.revision,
                    revision=uuid4().hex,
                    keep_entries=keep,
                    entries=tuple(
                        _EntryRow(e.id, e.kind, HISTORY_ENTRY_ADAPTER.dump_json(e).decode())
                        for e in new
                    ),
                    environment=_environment_write(tracked, environment),
                    events=event_rows,
                    status=status,
                    updated_at=_now(),
                )
                try:
                    info = await self._run(self._backend.write_step, write)
                except _StaleError:
                    # Written by another store (or by a save of ours that was cancelled while
                    # it committed): forget what we thought was stored and compare again.
                    del self._tracked[session_id]
                    continue
                del tracked.entries[keep:]
                tracked.entries.extend(new)
                tracked.revision = write.revision
                tracked.history, tracked.history_version = weakref.ref(history), history_version
                tracked.environment = weakref.ref(environment)
                tracked.environment_version = env_version
                return info
        raise StoreError(
            f"session {session_id!r} changed under every one of {_RETRIES} attempts to save a "
            "step; let one process at a time write a session"
        )

    async def load(self, session_id: str) -> SessionState:
        """Return the session as saved at its last step.

        Raises:
            SessionNotFoundError: No session has that id.
            StoreError: The stored data cannot be read back.
        """
        async with self._lock:
            stored = await self._run(self._backend.read, session_id, False)
            entries = _decode_entries(stored)
            environment = _decode_environment(stored)
            tracked = _Tracked(revision=stored.revision, entries=list(entries))
            if environment is not None:
                tracked.environment = weakref.ref(environment)
                tracked.environment_version = environment.version
            self._tracked[session_id] = tracked
        return SessionState(info=stored.info, entries=tuple(entries), environment=environment)

    async def info(self, session_id: str) -> SessionInfo:
        """Return the session's description without loading it.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        return await self._run(self._backend.info, session_id)

    async def list(self, *, limit: int = 50) -> builtins.list[SessionInfo]:
        """Return up to `limit` sessions, the most recently updated first.

        Raises:
            UserError: `limit` is less than 1.
        """
        if limit < 1:
            raise UserError(f"limit={limit} lists nothing; pass 1 or more")
        return await self._run(self._backend.sessions, limit)

    async def events(
        self,
        session_id: str,
        *,
        offset: int = 0,
        run_id: str | None = None,
        after_seq: int = -1,
        limit: int | None = None,
    ) -> builtins.list[AgentEvent]:
        """Return the session's events in the order saved.

        Args:
            session_id: The session.
            offset: Skip the session's first `offset` events (to read on from where one left
                off, pass the number of events already read).
            run_id: Only the events of this run.
            after_seq: With `run_id`: only events with a larger ``seq``.
            limit: At most this many events.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `limit`, or `after_seq` without `run_id`.
            StoreError: A stored event cannot be read back.
        """
        if offset < 0 or (limit is not None and limit < 0):
            raise UserError(f"offset={offset} and limit={limit} must not be negative")
        if after_seq >= 0 and run_id is None:
            raise UserError(
                f"after_seq={after_seq} needs run_id: sequence numbers count within one run"
            )
        rows = await self._run(self._backend.events, session_id, offset, run_id, after_seq, limit)
        return [_decode_event(row, session_id) for row in rows]

    async def delete(self, session_id: str) -> None:
        """Delete the session and everything stored with it.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        async with self._lock:
            await self._run(self._backend.delete, session_id)
            self._tracked.pop(session_id, None)

    # -- export and import -----------------------------------------------------------------

    async def export(self, session_id: str, target: str | Path | IO[str]) -> None:
        """Write the session as JSON lines (see the module doc) to a path or a text stream.

        A path is written through a temporary file renamed at the end, so it never holds half
        an export. A stream is written to and flushed, not closed.

        Raises:
            SessionNotFoundError: No session has that id.
            StoreError: The target cannot be written.
        """
        stored = await self._run(self._backend.read, session_id, True)
        lines = _export_lines(stored)
        await asyncio.to_thread(_write_lines, lines, target)

    async def import_(
        self, source: str | Path | IO[str], *, session_id: str | None = None
    ) -> SessionInfo:
        """Store a session read from what `export` wrote.

        The whole source is validated first (entries against the history's unit rules, the
        environment, every event, the closing counts); then the session is stored in one
        transaction.

        Args:
            source: A path or a text stream.
            session_id: The id to store it under; the exported id if None.

        Returns:
            The stored session's description.

        Raises:
            UserError: `session_id` is not a valid id.
            StoreError: The source cannot be read or is not a complete export, or the id is
                taken.
        """
        if session_id is not None:
            _check_id(session_id)
        name = getattr(source, "name", None) if not isinstance(source, str | Path) else source
        label = repr(str(name)) if name is not None else "the stream"
        lines = await asyncio.to_thread(_read_lines, source, label)
        session = _parse_export(lines, label, session_id)
        async with self._lock:
            await self._run(self._backend.insert, session)
        return session.info

    # -- lifetime ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Release the store; later calls raise `StoreError`. Closing twice is harmless."""
        if self._closed:
            return
        try:
            await self._call(self._backend.close)
        finally:
            self._closed = True
            self._tracked.clear()

    async def __aenter__(self) -> Self:
        await self._run(self._backend.open)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _check_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not _ID_PATTERN.fullmatch(session_id):
        raise UserError(
            f"session id {session_id!r} is not valid; use 1 to 128 letters, digits or '._:-', "
            "starting with a letter or digit"
        )
    return session_id


def _problem(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _kept_entries(tracked: _Tracked, history: History) -> int:
    """How many leading entries of `history` are stored already (O(1) when it only grew)."""
    saved = tracked.entries
    entries = history.entries
    grown = len(entries) - len(saved)
    if (
        tracked.history is not None
        and tracked.history() is history
        and grown >= 0
        and history.version - tracked.history_version == grown
        and (not saved or entries[len(saved) - 1] is saved[-1])
    ):
        return len(saved)
    # Pruned, summarized, or another history: entries are frozen, so a kept one is the same
    # object (or, after a load, an equal one).
    for index, (mine, stored) in enumerate(zip(entries, saved, strict=False)):
        if mine is not stored and mine != stored:
            return index
    return min(len(entries), len(saved))


def _environment_write(tracked: _Tracked, environment: Environment) -> _EnvironmentWrite | None:
    """The snapshot and changes to write, or None when the environment did not change."""
    version = environment.version
    same = tracked.environment is not None and tracked.environment() is environment
    if same and version == tracked.environment_version:
        return None
    payload = json.loads(environment.to_json())
    log: list[dict[str, Any]] = payload.pop("changes")
    max_changes: int = payload["max_changes"]
    # The same object only moved forward, so its log continues what is stored; otherwise
    # (another object, e.g. after a reload elsewhere) the stored log is replaced by its log.
    reset = not (same and version > tracked.environment_version)
    since = -1 if reset else tracked.environment_version
    fresh: list[tuple[int, str]] = []
    for change in reversed(log):
        if change["version"] <= since:
            break
        fresh.append((change["version"], json.dumps(change, separators=(",", ":"))))
    fresh.reverse()
    return _EnvironmentWrite(
        base=json.dumps(payload, separators=(",", ":")),
        version=version,
        changes=tuple(fresh),
        reset=reset,
        trim_through=version - max_changes,
    )


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


def _export_lines(stored: _Stored) -> Iterator[str]:
    # Stored rows are already compact JSON: splice them in rather than parse and re-dump.
    yield SessionHeaderLine(session=stored.info).model_dump_json()
    for data in stored.entries:
        yield f'{{"kind":"entry","entry":{data}}}'
    if stored.environment is not None:
        environment = _environment_text(stored.environment, stored.changes)
        yield f'{{"kind":"environment","environment":{environment}}}'
    for data in stored.events:
        yield f'{{"kind":"event","event":{data}}}'
    yield EndLine(entries=len(stored.entries), events=len(stored.events)).model_dump_json()


def _write_lines(lines: Iterable[str], target: str | Path | IO[str]) -> None:
    if not isinstance(target, str | Path):
        for line in lines:
            target.write(line + "\n")
        target.flush()
        return
    path = Path(target)
    partial = path.with_name(f".{path.name}.{uuid4().hex[:8]}.partial")
    try:
        with partial.open("w", encoding="utf-8", newline="\n") as file:
            for line in lines:
                file.write(line + "\n")
        partial.replace(path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise StoreError(f"cannot write the export to {str(path)!r}: {err}") from err


def _read_lines(source: str | Path | IO[str], label: str) -> list[str]:
    if not isinstance(source, str | Path):
        return source.read().splitlines()
    try:
        return Path(source).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise StoreError(f"cannot read the export {label}: {err}") from err


def _parse_export(lines: Sequence[str], label: str, session_id: str | None) -> _Import:
    """Validate a whole export and return what to store."""
    header: SessionHeaderLine | None = None
    end: EndLine | None = None
    entries: list[HistoryEntry] = []
    environment: JsonObject | None = None
    events: list[AgentEvent] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if end is not None:
            raise StoreError(f"line {number} of {label} follows the end line; remove it")
        try:
            item = EXPORT_LINE_ADAPTER.validate_json(line)
        except ValidationError as err:
            raise StoreError(
                f"line {number} of {label} is not a session export line ({_problem(err)}); "
                "import only what SessionStore.export wrote"
            ) from err
        if header is None:
            if not isinstance(item, SessionHeaderLine):
                raise StoreError(
                    f"{label} starts with a {item.kind!r} line, not a session line; import only "
                    "what SessionStore.export wrote"
                )
            header = item
        elif isinstance(item, EntryLine):
            entries.append(item.entry)
        elif isinstance(item, EnvironmentLine):
            if environment is not None:
                raise StoreError(f"line {number} of {label} is a second environment line")
            environment = item.environment
        elif isinstance(item, EventLine):
            events.append(item.event)
        elif isinstance(item, EndLine):
            end = item
        else:
            raise StoreError(f"line {number} of {label} is a second session line")
    if header is None:
        raise StoreError(f"{label} is empty; import only what SessionStore.export wrote")
    if end is None:
        raise StoreError(f"{label} has no end line: the export is incomplete (cut short?)")
    if (end.entries, end.events) != (len(entries), len(events)):
        raise StoreError(
            f"{label} announces {end.entries} entries and {end.events} events but holds "
            f"{len(entries)} and {len(events)}; the export was altered"
        )
    try:
        # Any counter checks the unit rules; the cheapest will do.
        History(entries, counter=ApproxCounter())
    except UserError as err:
        raise StoreError(f"the history in {label} is inconsistent: {err}") from err
    base: str | None = None
    changes: tuple[tuple[int, str], ...] = ()
    version = 0
    if environment is not None:
        try:
            env = Environment.from_json(json.dumps(environment))
        except (UserError, EnvironmentValidationError) as err:
            raise StoreError(f"the environment in {label} is invalid: {err}") from err
        payload = json.loads(env.to_json())
        changes = tuple(
            (c["version"], json.dumps(c, separators=(",", ":"))) for c in payload.pop("changes")
        )
        base = json.dumps(payload, separators=(",", ":"))
        version = env.version
    info = header.session.model_copy(
        update={
            "id": session_id if session_id is not None else _check_id(header.session.id),
            "entry_count": len(entries),
            "event_count": len(events),
            "environment_version": version,
        }
    )
    return _Import(
        info=info,
        revision=uuid4().hex,
        entries=tuple(
            _EntryRow(e.id, e.kind, HISTORY_ENTRY_ADAPTER.dump_json(e).decode()) for e in entries
        ),
        environment=base,
        changes=changes,
        events=tuple(_EventRow(e.run_id, e.seq, e.kind, event_to_json(e)) for e in events),
    )


# -- SQLite ---------------------------------------------------------------------------------------


def _create_v1(conn: sqlite3.Connection) -> None:
    for statement in (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            title TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            metadata TEXT NOT NULL,
            steps INTEGER NOT NULL,
            entry_count INTEGER NOT NULL,
            event_count INTEGER NOT NULL,
            environment_version INTEGER NOT NULL,
            environment TEXT,
            revision TEXT NOT NULL
        )""",
        "CREATE INDEX sessions_by_update ON sessions (updated_at)",
        """CREATE TABLE entries (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            entry_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        """CREATE TABLE environment_changes (
            session_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
        """CREATE TABLE events (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        "CREATE INDEX events_by_run ON events (session_id, run_id, seq)",
    ):
        conn.execute(statement)


#: Migration ``i`` brings a store file from schema version ``i`` to ``i + 1``. To change the
#: schema, append a migration; never edit one that shipped.
_MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_create_v1,)

#: The schema version this agent_flow writes (``PRAGMA user_version`` of the store file).
SCHEMA_VERSION = len(_MIGRATIONS)

_INFO_COLUMNS = (
    "id, agent, title, status, created_at, updated_at, metadata, steps, entry_count, "
    "event_count, environment_version"
)


def _info_from_row(row: sqlite3.Row) -> SessionInfo:
    return SessionInfo(
        id=row["id"],
        agent=row["agent"],
        title=row["title"],
        status=row["status"],
        created_at=datetime.fromisoformat(row["created_at"]),
        updated_at=datetime.fromisoformat(row["updated_at"]),
        steps=row["steps"],
        entry_count=row["entry_count"],
        event_count=row["event_count"],
        environment_version=row["environment_version"],
        metadata=json.loads(row["metadata"]),
    )


@contextmanager
def _transaction(conn: sqlite3.Connection, *, write: bool) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front (waiting up to the busy timeout) rather than
    # failing when a read transaction later tries to write; a plain BEGIN reads one snapshot.
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class _SQLiteBackend:
    """The SQL of the store; every method runs on the store's one worker thread."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["normal", "full"],
        busy_timeout: float,
        trace: Callable[[str], None] | None,
    ) -> None:
        self.path = path
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._trace = trace
        self._conn: sqlite3.Connection | None = None

    def open(self) -> None:
        self._connection()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are begun and ended explicitly (see _transaction).
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            if self._trace is not None:
                conn.set_trace_callback(self._trace)
            self._check_version(conn)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"the session store {str(self.path)!r} cannot use write-ahead logging "
                    f"(journal mode {mode!r}); put it on a local file system"
                )
            conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _check_version(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the session store {str(self.path)!r} has schema version {version}, newer than "
                f"the {SCHEMA_VERSION} this agent_flow knows; upgrade agent_flow or use another "
                "store path"
            )
        return version

    def _migrate(self, conn: sqlite3.Connection) -> None:
        if self._check_version(conn) == SCHEMA_VERSION:
            return
        with _transaction(conn, write=True):
            # Read again under the write lock: another process may have migrated meanwhile.
            version = self._check_version(conn)
            if (
                version == 0
                and conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' LIMIT 1"
                ).fetchone()
            ):
                raise StoreError(
                    f"{str(self.path)!r} is a database that is not an agent_flow session store; "
                    "give the store another path"
                )
            for migration in _MIGRATIONS[version:]:
                migration(conn)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def create(self, info: SessionInfo, revision: str) -> None:
        conn = self._connection()
        with _transaction(conn, write=True):
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (info.id,)).fetchone():
                raise _exists(info.id)
            self._insert_session(conn, info, revision, None)

    @staticmethod
    def _insert_session(
        conn: sqlite3.Connection, info: SessionInfo, revision: str, environment: str | None
    ) -> None:
        conn.execute(
            f"INSERT INTO sessions ({_INFO_COLUMNS}, environment, revision) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                info.id,
                info.agent,
                info.title,
                info.status,
                _timestamp(info.created_at),
                _timestamp(info.updated_at),
                json.dumps(info.metadata, separators=(",", ":")),
                info.steps,
                info.entry_count,
                info.event_count,
                info.environment_version,
                environment,
                revision,
            ),
        )

    def info(self, session_id: str) -> SessionInfo:
        conn = self._connection()
        row = conn.execute(
            f"SELECT {_INFO_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise _not_found(session_id)
        return _info_from_row(row)

    def read(self, session_id: str, with_events: bool) -> _Stored:
        conn = self._connection()
        with _transaction(conn, write=False):
            row = conn.execute(
                f"SELECT {_INFO_COLUMNS}, environment, revision FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                raise _not_found(session_id)
            entries = conn.execute(
                "SELECT data FROM entries WHERE session_id = ? ORDER BY position", (session_id,)
            ).fetchall()
            changes = conn.execute(
                "SELECT data FROM environment_changes WHERE session_id = ? ORDER BY version",
                (session_id,),
            ).fetchall()
            events = (
                conn.execute(
                    "SELECT data FROM events WHERE session_id = ? ORDER BY position",
                    (session_id,),
                ).fetchall()
                if with_events
                else []
            )
        return _Stored(
            info=_info_from_row(row),
            revision=row["revision"],
            entries=tuple(r[0] for r in entries),
            environment=row["environment"],
            changes=tuple(r[0] for r in changes),
            events=tuple(r[0] for r in events),
        )

    def write_step(self, write: _StepWrite) -> SessionInfo:
        conn = self._connection()
        sid = write.session_id
        with _transaction(conn, write=True):
            row = conn.execute(
                f"SELECT {_INFO_COLUMNS}, revision FROM sessions WHERE id = ?", (sid,)
            ).fetchone()
            if row is None:
                raise _not_found(sid)
            if row["revision"] != write.expected_revision:
                raise _StaleError
            info = _info_from_row(row)
            if write.keep_entries < info.entry_count:
                conn.execute(
                    "DELETE FROM entries WHERE session_id = ? AND position >= ?",
                    (sid, write.keep_entries),
                )
            conn.executemany(
                "INSERT INTO entries (session_id, position, entry_id, kind, data) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    (sid, write.keep_entries + i, e.entry_id, e.kind, e.data)
                    for i, e in enumerate(write.entries)
                ),
            )
            env = write.environment
            if env is not None:
                if env.reset:
                    conn.execute("DELETE FROM environment_changes WHERE session_id = ?", (sid,))
                elif env.trim_through > 0:
                    conn.execute(
                        "DELETE FROM environment_changes WHERE session_id = ? AND version <= ?",
                        (sid, env.trim_through),
                    )
                conn.executemany(
                    "INSERT INTO environment_changes (session_id, version, data) VALUES (?, ?, ?)",
                    ((sid, version, data) for version, data in env.changes),
                )
            conn.executemany(
                "INSERT INTO events (session_id, position, run_id, seq, kind, data) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    (sid, info.event_count + i, e.run_id, e.seq, e.kind, e.data)
                    for i, e in enumerate(write.events)
                ),
            )
            after = _stepped(info, write)
            conn.execute(
                "UPDATE sessions SET status = ?, updated_at = ?, steps = ?, entry_count = ?, "
                "event_count = ?, environment_version = ?, "
                "environment = COALESCE(?, environment), revision = ? WHERE id = ?",
                (
                    after.status,
                    _timestamp(after.updated_at),
                    after.steps,
                    after.entry_count,
                    after.event_count,
                    after.environment_version,
                    env.base if env is not None else None,
                    write.revision,
                    sid,
                ),
            )
        return after

    def sessions(self, limit: int) -> list[SessionInfo]:
        conn = self._connection()
        rows = conn.execute(
            f"SELECT {_INFO_COLUMNS} FROM sessions ORDER BY updated_at DESC, id LIMIT ?",
            (limit,),
        ).fetchall()
        return [_info_from_row(row) for row in rows]

    def events(
        self, session_id: str, offset: int, run_id: str | None, after_seq: int, limit: int | None
    ) -> list[str]:
        conn = self._connection()
        query = "SELECT data FROM events WHERE session_id = ? AND position >= ?"
        parameters: list[object] = [session_id, offset]
        if run_id is not None:
            query += " AND run_id = ? AND seq > ?"
            parameters += [run_id, after_seq]
        query += " ORDER BY position LIMIT ?"
        parameters.append(-1 if limit is None else limit)
        with _transaction(conn, write=False):
            rows = conn.execute(query, parameters).fetchall()
            if (
                not rows
                and not conn.execute(
                    "SELECT 1 FROM sessions WHERE id = ?", (session_id,)
                ).fetchone()
            ):
                raise _not_found(session_id)
        return [row[0] for row in rows]

    def insert(self, session: _Import) -> None:
        conn = self._connection()
        sid = session.info.id
        with _transaction(conn, write=True):
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
                raise _exists(sid)
            self._insert_session(conn, session.info, session.revision, session.environment)
            conn.executemany(
                "INSERT INTO entries (session_id, position, entry_id, kind, data) "
                "VALUES (?, ?, ?, ?, ?)",
                ((sid, i, e.entry_id, e.kind, e.data) for i, e in enumerate(session.entries)),
            )
            conn.executemany(
                "INSERT INTO environment_changes (session_id, version, data) VALUES (?, ?, ?)",
                ((sid, version, data) for version, data in session.changes),
            )
            conn.executemany(
                "INSERT INTO events (session_id, position, run_id, seq, kind, data) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                ((sid, i, e.run_id, e.seq, e.kind, e.data) for i, e in enumerate(session.events)),
            )

    def delete(self, session_id: str) -> None:
        conn = self._connection()
        with _transaction(conn, write=True):
            if conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                raise _not_found(session_id)
            for table in ("entries", "environment_changes", "events"):
                conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SQLiteSessionStore(_StoreBase):
    """A `SessionStore` in one SQLite file: WAL mode, one transaction per step, no server.

    The file is opened on first use (or on ``async with``), created with its folders if
    missing, and migrated to `SCHEMA_VERSION` if older. All SQL runs on one worker thread
    owned by the store, never on the event loop.

    Args:
        path: The database file; `default_store_path()` if None.
        synchronous: ``"full"`` (default) syncs at every commit, so a completed step survives
            a power loss; ``"normal"`` survives a killed process but not a power loss.
        busy_timeout: Seconds a write waits for another process's write to finish before
            failing with `StoreError`.
        trace: Called (on the worker thread) with every SQL statement run, for debugging.

    Raises:
        StoreError: On first use: the file is not a session store, its schema is newer than
            this agent_flow, or it cannot be opened.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        synchronous: Literal["normal", "full"] = "full",
        busy_timeout: float = 5.0,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        if synchronous not in ("normal", "full"):
            raise UserError(f"synchronous={synchronous!r} is not 'normal' or 'full'")
        if busy_timeout < 0:
            raise UserError(f"busy_timeout={busy_timeout} is negative; pass 0 or more seconds")
        self.path = Path(path).expanduser() if path is not None else default_store_path()
        backend = _SQLiteBackend(
            self.path, synchronous=synchronous, busy_timeout=busy_timeout, trace=trace
        )
        super().__init__(backend, repr(str(self.path)))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent_flow.store")

    async def _call(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        loop = asyncio.get_running_loop()
        call = functools.partial(self._guarded, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor, call)

    def _guarded(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except sqlite3.Error as err:
            hint = (
                "another process holds the write lock; retry, or raise busy_timeout"
                if "locked" in str(err) or "busy" in str(err)
                else "check the file, or give the store another path"
            )
            raise StoreError(f"the session store {self._where} failed ({err}); {hint}") from err

    async def close(self) -> None:
        """Close the database connection and stop the worker thread."""
        try:
            await super().close()
        finally:
            self._executor.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"SQLiteSessionStore({str(self.path)!r})"


# -- in memory ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _MemorySession:
    info: SessionInfo
    revision: str
    entries: list[str] = field(default_factory=list)
    environment: str | None = None
    changes: dict[int, str] = field(default_factory=dict)
    events: list[_EventRow] = field(default_factory=list)


class _MemoryBackend:
    """The same operations as `_SQLiteBackend` over dicts of serialized rows."""

    def __init__(self) -> None:
        self._sessions: dict[str, _MemorySession] = {}

    def open(self) -> None:
        pass

    def _get(self, session_id: str) -> _MemorySession:
        session = self._sessions.get(session_id)
        if session is None:
            raise _not_found(session_id)
        return session

    def create(self, info: SessionInfo, revision: str) -> None:
        if info.id in self._sessions:
            raise _exists(info.id)
        self._sessions[info.id] = _MemorySession(info=info, revision=revision)

    def info(self, session_id: str) -> SessionInfo:
        return self._get(session_id).info

    def read(self, session_id: str, with_events: bool) -> _Stored:
        session = self._get(session_id)
        return _Stored(
            info=session.info,
            revision=session.revision,
            entries=tuple(session.entries),
            environment=session.environment,
            changes=tuple(session.changes[v] for v in sorted(session.changes)),
            events=tuple(e.data for e in session.events) if with_events else (),
        )

    def write_step(self, write: _StepWrite) -> SessionInfo:
        session = self._get(write.session_id)
        if session.revision != write.expected_revision:
            raise _StaleError
        del session.entries[write.keep_entries :]
        session.entries.extend(e.data for e in write.entries)
        env = write.environment
        if env is not None:
            if env.reset:
                session.changes.clear()
            else:
                for version in [v for v in session.changes if v <= env.trim_through]:
                    del session.changes[version]
            session.changes.update(env.changes)
            session.environment = env.base
        session.events.extend(write.events)
        session.info = _stepped(session.info, write)
        session.revision = write.revision
        return session.info

    def sessions(self, limit: int) -> list[SessionInfo]:
        infos = sorted((s.info for s in self._sessions.values()), key=lambda i: i.id)
        infos.sort(key=lambda i: i.updated_at, reverse=True)
        return infos[:limit]

    def events(
        self, session_id: str, offset: int, run_id: str | None, after_seq: int, limit: int | None
    ) -> list[str]:
        rows = self._get(session_id).events[offset:]
        if run_id is not None:
            rows = [e for e in rows if e.run_id == run_id and e.seq > after_seq]
        return [e.data for e in rows[:limit]]

    def insert(self, session: _Import) -> None:
        if session.info.id in self._sessions:
            raise _exists(session.info.id)
        self._sessions[session.info.id] = _MemorySession(
            info=session.info,
            revision=session.revision,
            entries=[e.data for e in session.entries],
            environment=session.environment,
            changes=dict(session.changes),
            events=list(session.events),
        )

    def delete(self, session_id: str) -> None:
        self._get(session_id)
        del self._sessions[session_id]

    def close(self) -> None:
        self._sessions.clear()


class InMemorySessionStore(_StoreBase):
    """A `SessionStore` in this process's memory, with the semantics of `SQLiteSessionStore`.

    Sessions are kept serialized, exactly as the SQLite store keeps them, so `load` returns
    fresh objects and the same round trips hold; everything is lost on `close`. Meant for
    tests and throwaway runs.
    """

    def __init__(self) -> None:
        super().__init__(_MemoryBackend(), "in memory")

    async def _call(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return fn(*args, **kwargs)

    def __repr__(self) -> str:
        return "InMemorySessionStore()"
