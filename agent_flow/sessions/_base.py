"""The async store shared by every implementation: `_StoreBase` over an `_AsyncBackend`.

`_StoreBase` implements every `SessionStore` method once (the event reads in `_follow`, the
lease rules in `_lease`); `SQLiteSessionStore` and `InMemorySessionStore` give it a synchronous
`_Backend` wrapped in `_OnWorker` (which says where the backend runs), `PostgresSessionStore` an
asynchronous backend of its own.
"""

from __future__ import annotations

import asyncio
import builtins
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, ParamSpec, Protocol, Self, TypeVar
from uuid import uuid4

from pydantic import ValidationError

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
    _EntryRow,
    _EventQuery,
    _EventRow,
    _Import,
    _problem,
    _StaleError,
    _StepWrite,
    _Stored,
)
from agent_flow.sessions._changes import _Changes
from agent_flow.sessions._follow import _EventReads
from agent_flow.sessions._lease import _check_ttl
from agent_flow.sessions._planner import _environment_write, _kept_entries, _Tracked
from agent_flow.sessions.export import (
    _export_lines,
    _parse_export,
    _write_lines,
    read_export_lines,
)
from agent_flow.sessions.models import (
    _STATUSES,
    Checkpoint,
    Lease,
    SessionInfo,
    SessionState,
    SessionStatus,
    _check_id,
    event_id,
    numbering_run,
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

    async def claim(self, session_id: str, run_id: str, holder: str, ttl: float) -> Lease:
        return await self._go(lambda: self._backend.claim(session_id, run_id, holder, ttl))

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        return await self._go(lambda: self._backend.renew(lease, ttl))

    async def release(self, lease: Lease) -> None:
        await self._go(lambda: self._backend.release(lease))

    async def events(self, session_id: str, query: _EventQuery) -> builtins.list[tuple[int, str]]:
        return await self._go(lambda: self._backend.events(session_id, query))

    async def write_checkpoints(
        self,
        session_id: str,
        rows: tuple[Checkpoint, ...],
        synced: bool,
        fence: int | None,
        lease_run: str | None,
    ) -> None:
        await self._go(
            lambda: self._backend.write_checkpoints(session_id, rows, synced, fence, lease_run)
        )

    async def checkpoints(self, session_id: str, run_id: str) -> builtins.list[Checkpoint]:
        return await self._go(lambda: self._backend.checkpoints(session_id, run_id))

    async def insert(self, session: _Import) -> None:
        await self._go(lambda: self._backend.insert(session))

    async def delete(self, session_id: str) -> None:
        await self._go(lambda: self._backend.delete(session_id))

    async def close(self) -> None:
        await self._go(self._backend.close)


class _StoreBase(_EventReads):
    """The async API over an `_AsyncBackend`."""

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
        fence: int | None = None,
        event_fences: Mapping[str, int] | None = None,
        lease_run: str | None = None,
    ) -> SessionInfo:
        """Save one step in one transaction: the history and environment now, the new events.

        Call it at a step boundary (every tool call of the history answered). It writes what
        changed since this store's last save of the session (see the package doc); the first
        save after `load`, after another store wrote the session, or with another history
        object compares against what is stored first.

        A run that holds the session's lease passes its fencing number (`Lease.fence`): the
        step is written only if that lease is still the session's, checked in the step's
        transaction, and its events get the ids `event_id` gives. Without a fence (imports,
        tools, callers that do not claim) the step is refused while another run's lease is
        live; an expired lease is ended first, as `claim` ends it.

        Args:
            session_id: The session.
            history: The whole history as it is now.
            environment: The environment as it is now.
            events: The events published since the last save (appended).
            status: The new status, or None to keep it.
            checkpoints: A durable run's checkpoints made in the step (`Checkpoint`).
            fence: The writer's `Lease.fence`; None for a writer without a lease.
            lease_run: The writer's `Lease.run_id`: with it, the step is written only if the
                session's lease is that run's too (a session deleted and created again
                numbers its fences from 1 again, so a fence alone may match another run's).
            event_fences: The fences of the writer's earlier runs, by run id, for events of
                theirs saved late (a failed save's, carried by the next one): such an event
                keeps the id its own run gave it.

        Returns:
            The session's description after the step.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: `status` is not a `SessionStatus`, or (with a fence) an event's ``seq``
                has no id (negative, or 2**32 or more).
            LeaseLostError: `fence` is not the fence of the session's lease any more (or
                `lease_run` not its run): nothing was written.
            SessionBusyError: No `fence`, and another run holds a live lease.
            SessionConflictError: Other writers changed the session under every attempt.
            StoreError: The store failed, a checkpoint at one of those positions of the run is
                stored already (another execution of the run wrote it), or (with a fence) the
                events' ids would not be above the session's last id (a ``seq`` saved twice or
                out of order).
        """
        if status is not None and status not in _STATUSES:
            raise UserError(
                f"status {status!r} is not a session status; use one of {sorted(_STATUSES)}"
            )
        fences = event_fences or {}
        if fence is not None:
            for event in events:
                # Refuses what has no id before anything is written.
                event_id(fences.get(numbering_run(event), fence), event.seq)
        event_rows = tuple(
            _EventRow(e.run_id, e.seq, e.kind, event_to_json(e), fences.get(numbering_run(e)))
            for e in events
        )
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
                    fence=fence,
                    lease_run=lease_run,
                )
                try:
                    # The fence is checked in every attempt's transaction, before the revision:
                    # a retry refreshes what this store thought was stored, never the lease.
                    info = await self._run(self._backend.write_step, write)
                except _StaleError:
                    # Written by another store (or by a save of ours that was cancelled while
                    # it committed): forget what we thought was stored and compare again.
                    self._tracked.pop(session_id, None)  # (or its history is gone meanwhile)
                    continue
                del tracked.entries[keep:]
                tracked.entries.extend(new)
                tracked.revision = write.revision
                if tracked.history is None or tracked.history() is not history:
                    # Kept while the writer's history lives: gone with it (an agent closed,
                    # a server's session evicted), the next save compares with the store.
                    tracked.history = weakref.ref(history, self._forget(session_id, tracked))
                tracked.history_version = history_version
                tracked.environment = weakref.ref(environment)
                tracked.environment_version = env_version
                # Even without events of its own: ending an expired lease appends one.
                self._changes.signal(session_id)
                return info
        raise SessionConflictError(
            f"session {session_id!r} changed under every one of {_RETRIES} attempts to save a "
            "step; let one process at a time write a session"
        )

    async def save_checkpoints(
        self,
        session_id: str,
        checkpoints: Sequence[Checkpoint],
        *,
        synced: bool = True,
        fence: int | None = None,
        lease_run: str | None = None,
    ) -> None:
        """Store a durable run's checkpoints now, in one transaction of their own.

        For a checkpoint that must be stored before what it announces happens (a call to a
        tool that is not idempotent); the others go with their step (`save_step`).

        With ``synced=False`` the commit does not wait for the database to sync it to disk
        (PostgreSQL: ``synchronous_commit`` off; SQLite: ``synchronous`` NORMAL for it): no
        crash of this process can lose it, a crash of the database server or the machine can.

        `fence` (and `lease_run`) are the writer's `Lease`'s, checked in the transaction as by
        `save_step`;
        without one, the write is refused while another run's lease is live (an expired lease
        is left to the next claim or step: checkpoints take no event id).

        Raises:
            SessionNotFoundError: No session has that id.
            LeaseLostError: `fence` is not the fence of the session's lease (or `lease_run`
                not its run): nothing written.
            SessionBusyError: No `fence`, and another run holds a live lease.
            StoreError: A checkpoint at one of those positions of the run is stored already.
        """
        if checkpoints:
            await self._run(
                self._backend.write_checkpoints,
                session_id,
                tuple(checkpoints),
                synced,
                fence,
                lease_run,
            )

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
            # Kept for the writer that resumes from this state, as long as it holds the
            # environment it was given (a reader that only looks keeps nothing here).
            if environment is not None:
                tracked = _Tracked(revision=stored.revision, entries=list(entries))
                tracked.environment = weakref.ref(environment, self._forget(session_id, tracked))
                tracked.environment_version = environment.version
                self._tracked[session_id] = tracked
            else:
                self._tracked.pop(session_id, None)
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

    async def _event_rows(
        self, session_id: str, query: _EventQuery
    ) -> builtins.list[tuple[int, str]]:
        return await self._run(self._backend.events, session_id, query)

    # -- leases ------------------------------------------------------------------------------

    async def claim(self, session_id: str, *, run_id: str, holder: str, ttl: float) -> Lease:
        """Make run `run_id` the session's one writer for `ttl` seconds; return its `Lease`.

        One transaction: a live lease (another's, or this run's own) refuses the claim;
        otherwise the claim takes the next fencing number. If the previous lease was never
        released (it expired: its holder died) and its run, another than `run_id`, has no
        `RunFinished` stored, the claim stores one for it (stop reason ``interrupted``), sets
        the session's status to ``interrupted`` and names that run in
        `Lease.interrupted_run`. The same run claiming again (a durable run recovered by
        another worker) goes on: nothing is ended.

        Args:
            session_id: The session.
            run_id: The run that will write it.
            holder: Who runs it (``pid@host:pidns``, an executor id): shown to whoever finds
                it busy.
            ttl: Seconds until the lease expires unless renewed (by the store's clock;
                PostgreSQL's for a PostgreSQL store). 0 makes a lease that has expired
                already: a test's way to act out a holder that died.

        Raises:
            SessionNotFoundError: No session has that id.
            SessionBusyError: Another live lease is held (`SessionBusyError.run_id` names
                its run).
            UserError: `ttl` is negative or not a number.
        """
        _check_ttl(ttl)
        lease: Lease = await self._run(self._backend.claim, session_id, run_id, holder, ttl)
        if lease.interrupted_run is not None:
            self._changes.signal(session_id)
        return lease

    async def renew(self, lease: Lease, *, ttl: float) -> Lease:
        """Extend `lease` to `ttl` seconds from now; return the renewed lease.

        It succeeds while `lease` is the session's lease (same fence and run), even expired,
        as long as nobody claimed the session since.

        Raises:
            LeaseLostError: The session was claimed since, or `lease` was released.
            SessionNotFoundError: No session has that id.
            UserError: `ttl` is negative or not a number.
        """
        _check_ttl(ttl)
        return await self._run(self._backend.renew, lease, ttl)

    async def release(self, lease: Lease) -> None:
        """End `lease`: the session is free to claim at once (its next fence is one more).

        Releasing a stale lease (claimed since, or released already) does nothing.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        await self._run(self._backend.release, lease)

    def _forget(self, session_id: str, tracked: _Tracked) -> Callable[[object], None]:
        """A callback that stops tracking `session_id` when its writer's history is gone."""
        store = weakref.ref(self)

        def forget(_: object) -> None:
            owner = store()
            if owner is not None and owner._tracked.get(session_id) is tracked:
                del owner._tracked[session_id]

        return forget

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
        lines = await asyncio.to_thread(read_export_lines, source, label)
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
