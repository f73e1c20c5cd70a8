"""The persistence protocols `SessionStore` and `StepRecorder`, and `default_store_path`.

`SessionStore` is what a store does; `StepRecorder` is what the agent loop calls at step
boundaries. The agent loop depends on `StepRecorder` only;
`agent_flow.sessions.recorder.SessionRecorder` implements it over any `SessionStore`.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, Self

from agent_flow._types import JsonObject
from agent_flow.environment import Environment
from agent_flow.events import AgentEvent, RunFinished
from agent_flow.history import History
from agent_flow.sessions._paths import default_store_path
from agent_flow.sessions.models import (
    Checkpoint,
    Lease,
    SessionInfo,
    SessionState,
    SessionStatus,
)

__all__ = ["SessionStore", "StepRecorder", "default_store_path"]


class SessionStore(Protocol):
    """Where sessions live; every method is a coroutine, every failure a `StoreError`.

    Implementations: `SQLiteSessionStore`, `PostgresSessionStore`, `InMemorySessionStore`
    (`open_store` picks one from a URL). Use one as an async context manager, or call `close`
    when done.

    One writer at a time: a run `claim`s the session (a `Lease`), `renew`s it while it runs,
    passes its ``fence`` and ``lease_run`` (its run id) to every `save_step` and
    `save_checkpoints`, and `release`s it at its end. A write with a stale lease stores
    nothing (`LeaseLostError`); a write without a fence is refused while a live lease is held
    (`SessionBusyError`). Every stored event has an id that is never reused
    (`agent_flow.sessions.models.event_id`): read on after the last id seen with
    `events_with_ids` or `follow_events_with_ids`.
    """

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

        `owner` is the user creating it (`SessionInfo.owner`); None when there is no user.

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
        checkpoints: Sequence[Checkpoint] = (),
        fence: int | None = None,
        event_fences: Mapping[str, int] | None = None,
        lease_run: str | None = None,
    ) -> SessionInfo:
        """Save one step in one transaction: history, environment, new events and checkpoints.

        `fence` is the writer's `Lease.fence` (None: a writer without a lease); see the class
        doc. `lease_run`, the writer's `Lease.run_id`, makes the write also require that the
        lease is that run's (fences restart at 1 when a session is deleted and created again).
        An un-leased write that finds an expired lease ends it first, as `claim` would.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: `status` is not a `SessionStatus`, or an event's ``seq`` has no id.
            LeaseLostError: `fence` is not the session's lease's any more (or `lease_run` not
                its run): nothing written.
            SessionBusyError: No `fence`, and another run holds a live lease.
            StoreError: A checkpoint at one of those positions of the run is stored already,
                or the events' ids would not be above the session's last id.
        """
        ...

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

        ``synced=False``: the commit does not wait for the disk (a database crash may lose it).
        `fence`, `lease_run`: as for `save_step`.

        Raises:
            SessionNotFoundError: No session has that id.
            LeaseLostError: `fence` is not the session's lease's any more: nothing written.
            SessionBusyError: No `fence`, and another run holds a live lease.
            StoreError: A checkpoint at one of those positions of the run is stored already.
        """
        ...

    async def claim(self, session_id: str, *, run_id: str, holder: str, ttl: float) -> Lease:
        """Make run `run_id` the session's one writer for `ttl` seconds; return its `Lease`.

        A live lease refuses the claim; otherwise the fence grows by one. If the previous
        lease expired unreleased and its run (another than `run_id`) has no `RunFinished`
        stored, the claim stores one (stop reason ``interrupted``), sets the status
        ``interrupted`` and names the run in `Lease.interrupted_run`. ``ttl=0`` makes a
        lease that has expired already (for tests).

        Raises:
            SessionNotFoundError: No session has that id.
            SessionBusyError: A live lease is held (its run: `SessionBusyError.run_id`).
            UserError: `ttl` is negative or not a number.
        """
        ...

    async def renew(self, lease: Lease, *, ttl: float) -> Lease:
        """Extend `lease` to `ttl` seconds from now, even expired if nobody claimed since.

        Raises:
            LeaseLostError: The session was claimed since, or `lease` was released.
            SessionNotFoundError: No session has that id.
        """
        ...

    async def release(self, lease: Lease) -> None:
        """End `lease` (the next claim gets the next fence); a stale lease: nothing happens.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def checkpoints(self, session_id: str, run_id: str) -> builtins.list[Checkpoint]:
        """Return the checkpoints stored for `run_id`, by position.

        Raises:
            SessionNotFoundError: No session has that id.
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

    async def list(
        self, *, limit: int = 50, owner: str | None = None
    ) -> builtins.list[SessionInfo]:
        """Return up to `limit` sessions, the most recently updated first.

        With `owner`, only the sessions whose `SessionInfo.owner` is exactly `owner` (never
        those without an owner); without it, every session.

        Raises:
            UserError: `limit` is less than 1.
        """
        ...

    async def events(
        self,
        session_id: str,
        *,
        offset: int = 0,
        run_id: str | None = None,
        after_seq: int = -1,
        limit: int | None = None,
        after_id: int | None = None,
    ) -> builtins.list[AgentEvent]:
        """Return the session's events in the order saved.

        Args:
            session_id: The session.
            offset: Skip the session's first `offset` events (to read on from where one left
                off, pass the number of events already read).
            run_id: Only the events of this run.
            after_seq: With `run_id`: only events with a larger ``seq``.
            limit: At most this many events.
            after_id: Only the events whose id is above this one, instead of `offset`.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `limit`, `after_seq` without `run_id`, or both
                `offset` and `after_id`.
        """
        ...

    async def events_with_ids(
        self, session_id: str, *, after_id: int = -1, limit: int | None = None
    ) -> builtins.list[tuple[int, AgentEvent]]:
        """Return (id, event) for the session's events whose id is above `after_id`, in order.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `limit`.
        """
        ...

    async def wait_for_events(
        self, session_id: str, *, offset: int = 0, wait: float
    ) -> builtins.list[AgentEvent]:
        """Return the session's events from position `offset` on; wait up to `wait` seconds.

        When none is stored past `offset` yet, it waits for one to be saved (by any process).

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `wait`.
        """
        ...

    async def wait_for_events_with_ids(
        self, session_id: str, *, after_id: int = -1, wait: float
    ) -> builtins.list[tuple[int, AgentEvent]]:
        """Return (id, event) for the events above id `after_id`; wait up to `wait` seconds.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `wait`.
        """
        ...

    def follow_events(
        self, session_id: str, *, offset: int = 0, after_id: int | None = None
    ) -> AsyncIterator[AgentEvent]:
        """Yield the session's events from position `offset` on, then each as it is saved.

        Every event once, in stored order, with no gap, whichever process saved it; it never
        ends by itself (stop iterating when done). With `after_id`, from the event after that
        id instead.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: Both `offset` and `after_id`.
        """
        ...

    def follow_events_with_ids(
        self, session_id: str, *, after_id: int = -1
    ) -> AsyncIterator[tuple[int, AgentEvent]]:
        """Yield (id, event) for the events above id `after_id`, then each as it is saved.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def export(self, session_id: str, target: str | Path | IO[str]) -> None:
        """Write the session as JSON lines to a file path or a text stream.

        The format is described in `agent_flow.sessions.export`.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def import_(
        self, source: str | Path | IO[str], *, session_id: str | None = None
    ) -> SessionInfo:
        """Store a session read from what `export` wrote, under `session_id` if given.

        It keeps the exported owner (`SessionInfo.owner`).

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

    async def aclose(self) -> None:
        """Release the store; later calls raise `StoreError`. Closing twice is harmless."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class StepRecorder(Protocol):
    """What the agent loop calls to persist a run, at step boundaries only.

    The loop calls `start` when a run starts, `record` for every event it publishes, `step`
    after every completed step (each tool call answered), and `finish` once at the end, with
    the run's `RunFinished` event, before publishing it. A recorder decides where and how;
    the loop only relies on this: once `step` or `finish` returned, what they were given is
    saved, and a cancellation delivered meanwhile waits for the write (then is re-raised).
    """

    @property
    def session_id(self) -> str | None:
        """The session written to (None until `start` created one)."""
        ...

    async def start(self, *, agent: str, task: str, run_id: str = "") -> None:
        """A run `run_id` of `agent` starts on the user message `task`.

        Create the session if there is none, and claim it for the run (`SessionStore.claim`)
        unless the run holds it already.

        Raises:
            StoreError: The session cannot be created.
            SessionBusyError: Another run holds the session.
        """
        ...

    def record(self, event: AgentEvent) -> None:
        """Keep `event`, published by the run, for the next save."""
        ...

    async def step(self, history: History, environment: Environment) -> None:
        """Save a completed step: the history and environment now and the recorded events.

        Raises:
            StoreError: The store failed; the events stay recorded for the next save.
        """
        ...

    async def finish(self, history: History, environment: Environment, final: RunFinished) -> None:
        """Save the run's end: the state, the recorded events, `final`, and the final status.

        Raises:
            StoreError: The store failed; `final` is dropped, the other events stay recorded.
        """
        ...
