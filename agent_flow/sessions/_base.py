"""The async store shared by every implementation: `_StoreBase` over an `_AsyncBackend`.

`_StoreBase` implements every `SessionStore` method once; `SQLiteSessionStore` and
`InMemorySessionStore` give it a synchronous `_Backend` wrapped in `_OnWorker` (which says where
the backend runs), `PostgresSessionStore` an asynchronous backend of its own.
"""

from __future__ import annotations

import asyncio
import builtins
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, ParamSpec, Protocol, Self, TypeVar
from uuid import uuid4

from pydantic import ValidationError

from agent_flow._defaults import EVENTS_POLL_SECONDS
from agent_flow._types import JsonObject
from agent_flow.environment import Environment
from agent_flow.errors import SessionConflictError, StoreError, UserError
from agent_flow.events import AgentEvent, event_to_json
from agent_flow.history import HISTORY_ENTRY_ADAPTER, History
from agent_flow.sessions._backend import (
    _AsyncBackend,
    _Backend,
    _decode_entries,
    _decode_environment,
    _decode_event,
    _EntryRow,
    _EventRow,
    _Import,
    _problem,
    _StaleError,
    _StepWrite,
    _Stored,
)
from agent_flow.sessions._changes import _Changes
from agent_flow.sessions._planner import _environment_write, _kept_entries, _Tracked
from agent_flow.sessions.export import _export_lines, _parse_export, _read_lines, _write_lines
from agent_flow.sessions.models import (
    _STATUSES,
    Checkpoint,
    SessionInfo,
    SessionState,
    SessionStatus,
    _check_id,
)


def _now() -> datetime:
    return datetime.now(UTC)


_P = ParamSpec("_P")
_R = TypeVar("_R")

_RETRIES = 5


class _Runner(Protocol):
    """Runs a synchronous call somewhere (a worker thread, or inline) and awaits it."""

    def __call__(self, fn: Callable[[], _R]) -> Awaitable[_R]: ...


class _OnWorker:
    """A synchronous `_Backend` seen as an `_AsyncBackend`: every call goes through `run`."""

    def __init__(self, backend: _Backend, run: _Runner) -> None:
        self._backend = backend
        self._go = run

    async def open(self) -> None:
        await self._go(self._backend.open)

    async def create(self, info: SessionInfo, revision: str) -> None:
        await self._go(lambda: self._backend.create(info, revision))

    async def info(self, session_id: str) -> SessionInfo:
        return await self._go(lambda: self._backend.info(session_id))

    async def read(self, session_id: str, with_events: bool) -> _Stored:
        return await self._go(lambda: self._backend.read(session_id, with_events))

    async def write_step(self, write: _StepWrite) -> SessionInfo:
        return await self._go(lambda: self._backend.write_step(write))

    async def sessions(self, limit: int, owner: str | None) -> builtins.list[SessionInfo]:
        return await self._go(lambda: self._backend.sessions(limit, owner))

    async def events(
        self, session_id: str, offset: int, run_id: str | None, after_seq: int, limit: int | None
    ) -> builtins.list[str]:
        return await self._go(
            lambda: self._backend.events(session_id, offset, run_id, after_seq, limit)
        )

    async def write_checkpoints(
        self, session_id: str, rows: tuple[Checkpoint, ...], synced: bool
    ) -> None:
        await self._go(lambda: self._backend.write_checkpoints(session_id, rows, synced))

    async def checkpoints(self, session_id: str, run_id: str) -> builtins.list[Checkpoint]:
        return await self._go(lambda: self._backend.checkpoints(session_id, run_id))

    async def insert(self, session: _Import) -> None:
        await self._go(lambda: self._backend.insert(session))

    async def delete(self, session_id: str) -> None:
        await self._go(lambda: self._backend.delete(session_id))

    async def close(self) -> None:
        await self._go(self._backend.close)


class _StoreBase:
    """The async API over an `_AsyncBackend`."""

    #: How long a follower of a session waits for a signal before it reads the store again.
    _follow_poll: float = EVENTS_POLL_SECONDS

    def __init__(self, backend: _AsyncBackend, where: str) -> None:
        self._backend = backend
        self._where = where
        self._closed = False
        self._changes = _Changes()
        # One lock per session serializes this store's writes of it, so that each plans
        # against the state it last saved; writes of different sessions go on side by side
        # (on PostgreSQL, over several pooled connections). A lock lives while someone holds
        # or awaits it.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._tracked: dict[str, _Tracked] = {}

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _run(
        self, fn: Callable[_P, Awaitable[_R]], *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        if self._closed:
            raise StoreError(f"the session store {self._where} is closed; open a new one")
        return await fn(*args, **kwargs)

    # -- sessions ------------------------------------------------------------------------

    async def create(
        self,
        *,
        session_id: str | None = None,
        agent: str = "agent",
        title: str = "",
        metadata: JsonObject | None = None,
        task: str | None = None,
        owner: str | None = None,
    ) -> SessionInfo:
        """Create an empty session (status ``active``) and return its description.

        Args:
            session_id: The id to use; a new random one (12 hex digits) if None.
            agent: The name of the agent that runs it.
            title: A human title.
            metadata: Free JSON to keep with it.
            task: The task it is created for, kept whole (`SessionInfo.task`).
            owner: The user who creates it (`SessionInfo.owner`); None without users.

        Raises:
            UserError: `session_id` is not a valid id, `metadata` is not JSON, or `owner` is
                longer than 200 characters.
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
                task=task,
                owner=owner,
            )
        except ValidationError as err:
            raise UserError(f"cannot create session {sid!r}: {_problem(err)}") from err
        revision = uuid4().hex
        async with self._lock(sid):
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
        checkpoints: Sequence[Checkpoint] = (),
    ) -> SessionInfo:
        """Save one step in one transaction: the history and environment now, the new events.

        Call it at a step boundary (every tool call of the history answered). It writes what
        changed since this store's last save of the session (see the package doc); the first
        save after `load`, after another store wrote the session, or with another history
        object compares against what is stored first.

        Args:
            session_id: The session.
            history: The whole history as it is now.
            environment: The environment as it is now.
            events: The events published since the last save (appended).
            status: The new status, or None to keep it.
            checkpoints: A durable run's checkpoints made in the step (`Checkpoint`).

        Returns:
            The session's description after the step.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: `status` is not a `SessionStatus`.
            SessionConflictError: Other writers changed the session under every attempt.
            StoreError: The store failed, or a checkpoint at one of those positions of the
                run is stored already (another execution of the run wrote it).
        """
        if status is not None and status not in _STATUSES:
            raise UserError(
                f"status {status!r} is not a session status; use one of {sorted(_STATUSES)}"
            )
        event_rows = tuple(_EventRow(e.run_id, e.seq, e.kind, event_to_json(e)) for e in events)
        async with self._lock(session_id):
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
                    checkpoints=tuple(checkpoints),
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
                if event_rows:
                    self._changes.signal(session_id)
                return info
        raise SessionConflictError(
            f"session {session_id!r} changed under every one of {_RETRIES} attempts to save a "
            "step; let one process at a time write a session"
        )

    async def save_checkpoints(
        self, session_id: str, checkpoints: Sequence[Checkpoint], *, synced: bool = True
    ) -> None:
        """Store a durable run's checkpoints now, in one transaction of their own.

        For a checkpoint that must be stored before what it announces happens (a call to a
        tool that is not idempotent); the others go with their step (`save_step`).

        With ``synced=False`` the commit does not wait for the database to sync it to disk
        (PostgreSQL: ``synchronous_commit`` off; SQLite: ``synchronous`` NORMAL for it): no
        crash of this process can lose it, a crash of the database server or the machine can.

        Raises:
            SessionNotFoundError: No session has that id.
            StoreError: A checkpoint at one of those positions of the run is stored already.
        """
        if checkpoints:
            await self._run(self._backend.write_checkpoints, session_id, tuple(checkpoints), synced)

    async def checkpoints(self, session_id: str, run_id: str) -> builtins.list[Checkpoint]:
        """Return the checkpoints stored for `run_id` in the session, by position.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        return await self._run(self._backend.checkpoints, session_id, run_id)

    async def load(self, session_id: str) -> SessionState:
        """Return the session as saved at its last step.

        Raises:
            SessionNotFoundError: No session has that id.
            StoreError: The stored data cannot be read back.
        """
        async with self._lock(session_id):
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

    async def list(
        self, *, limit: int = 50, owner: str | None = None
    ) -> builtins.list[SessionInfo]:
        """Return up to `limit` sessions, the most recently updated first.

        Args:
            limit: At most this many sessions.
            owner: Only the sessions whose `SessionInfo.owner` is exactly this (never those
                without an owner); every session if None.

        Raises:
            UserError: `limit` is less than 1.
        """
        if limit < 1:
            raise UserError(f"limit={limit} lists nothing; pass 1 or more")
        return await self._run(self._backend.sessions, limit, owner)

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

    async def wait_for_events(
        self, session_id: str, *, offset: int = 0, wait: float
    ) -> builtins.list[AgentEvent]:
        """Return the session's events from position `offset` on, waiting for some if none.

        Returns at once when events are stored past `offset`; otherwise when one is saved (by
        this store, or by any process: a PostgreSQL store is notified, the others re-read
        every `EVENTS_POLL_SECONDS`), or with ``[]`` when `wait` seconds passed.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `wait`.
        """
        if wait < 0:
            raise UserError(f"wait={wait} is negative; pass 0 or more seconds")
        await self._listen()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            waiter = self._changes.waiter(session_id)  # before the read: see _changes
            events = await self.events(session_id, offset=offset)
            remaining = deadline - loop.time()
            if events or remaining <= 0:
                return events
            await self._changes.wait(waiter, min(remaining, self._follow_poll))

    async def follow_events(self, session_id: str, *, offset: int = 0) -> AsyncIterator[AgentEvent]:
        """Yield the session's events from position `offset` on, then each one as it is saved.

        Every event once, in the stored order, with no gap, whichever process saves it. It
        never ends by itself: stop iterating (or cancel) when done, e.g. at the `RunFinished`
        of the run you watch. Events arrive when their step is saved, not as published.

        Raises:
            SessionNotFoundError: No session has that id (or it was deleted meanwhile).
        """
        while True:
            events = await self.wait_for_events(session_id, offset=offset, wait=60.0)
            offset += len(events)
            for event in events:
                yield event

    async def _listen(self) -> None:
        """Start hearing of other processes' saves (a PostgreSQL store's LISTEN); else none."""

    async def delete(self, session_id: str) -> None:
        """Delete the session and everything stored with it.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        async with self._lock(session_id):
            await self._run(self._backend.delete, session_id)
            self._tracked.pop(session_id, None)

    # -- export and import -----------------------------------------------------------------

    async def export(self, session_id: str, target: str | Path | IO[str]) -> None:
        """Write the session as JSON lines (`agent_flow.sessions.export`) to a path or a stream.

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
        transaction. It keeps the exported `SessionInfo.owner` (None from an export written
        before owners existed).

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
        async with self._lock(session.info.id):
            await self._run(self._backend.insert, session)
        self._changes.signal(session.info.id)
        return session.info

    # -- lifetime ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release the store; later calls raise `StoreError`. Closing twice is harmless."""
        if self._closed:
            return
        try:
            await self._backend.close()
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
        await self.aclose()
