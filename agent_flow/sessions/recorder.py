"""`SessionRecorder`: the save policy of a run, a `StepRecorder` over any `SessionStore`.

The agent loop calls it at step boundaries and nowhere else (see `StepRecorder`). It owns:

- creating the session when the first run starts (titled by that run's first message),
  unless it was given one (`AgentExecutor.resume` passes the resumed session's id);
- the save after every completed step, with status ``active``;
- the final save of a run, with the status its `RunFinished` event implies (completed,
  waiting, cancelled, or failed for limits and errors);
- a durable run's checkpoints (`checkpoint`), written with the next save, or at once
  (`save_checkpoints`) when one must be stored before its effect;
- the order and shielding of writes: one write at a time, each allowed to finish when the run
  is cancelled meanwhile (the cancellation is re-raised once it has), and recorded events are
  forgotten only once a write that holds them succeeded. So a cancelled run still saves its
  step and its end, a failed write loses no event (the next save carries it), and no write
  is ever half-done from the recorder's side (the store makes each one a transaction).
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable, Coroutine, Sequence
from typing import TypeVar

from agent_flow._eager import start_eagerly
from agent_flow.agent.outcome import StopReason
from agent_flow.environment import Environment
from agent_flow.events import AgentEvent, RunFinished
from agent_flow.history import History
from agent_flow.sessions.models import Checkpoint, SessionStatus
from agent_flow.sessions.protocol import SessionStore

__all__ = ["SessionRecorder", "session_status"]

_T = TypeVar("_T")

_STATUS_OF_REASON: dict[StopReason, SessionStatus] = {
    StopReason.COMPLETED: "completed",
    StopReason.ANSWERED: "completed",
    StopReason.CONVERSE: "completed",
    StopReason.WAITING_FOR_USER: "waiting",
    StopReason.CANCELLED: "cancelled",
}


def session_status(stop_reason: str) -> SessionStatus:
    """The status a session is left in by a run that stopped for `stop_reason`.

    A `StopReason` value: completed answers are ``completed``, a question ``waiting``, a
    cancellation ``cancelled``; limits, a stuck model and errors (the task did not get done)
    are ``failed``.
    """
    try:
        reason = StopReason(stop_reason)
    except ValueError:
        return "failed"
    return _STATUS_OF_REASON.get(reason, "failed")


class SessionRecorder:
    """Saves an agent's session in `store` at step boundaries (see the module doc).

    Args:
        store: Where the session lives.
        session_id: The session to write to; created when the first run starts if None.
    """

    def __init__(self, store: SessionStore, session_id: str | None = None) -> None:
        self.store = store
        self._session_id = session_id
        self._pending: list[AgentEvent] = []
        self._checkpoints: list[Checkpoint] = []
        # Writes happen one at a time and in the order the loop asked for them.
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return (
            f"SessionRecorder({self.store!r}, session_id={self._session_id!r}, "
            f"{len(self._pending)} event(s) not saved yet)"
        )

    @property
    def session_id(self) -> str | None:
        """The session written to (None until the first run created one)."""
        return self._session_id

    @property
    def unsaved_events(self) -> Sequence[AgentEvent]:
        """Events recorded and not saved yet (kept after a failed write for the next one)."""
        return tuple(self._pending)

    async def start(self, *, agent: str, task: str) -> None:
        """Create the session for a run of `agent` on `task`, unless there is one.

        Raises:
            StoreError: The store cannot create it.
        """
        if self._session_id is not None:
            return
        title = textwrap.shorten(task, width=80, placeholder=" …")
        async with self._lock:
            info = await _to_the_end(
                start_eagerly(self.store.create(agent=agent, title=title, task=task))
            )
        self._session_id = info.id

    def record(self, event: AgentEvent) -> None:
        """Keep `event` for the next save."""
        self._pending.append(event)

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Keep a durable run's `checkpoint` for the next save (written in its transaction)."""
        self._checkpoints.append(checkpoint)

    async def save_checkpoints(self, *, synced: bool = True) -> None:
        """Write the checkpoints kept so far now, in a transaction of their own.

        For a checkpoint that must be stored before what it announces happens; kept ones stay
        kept when the write fails, like events. `synced`: see `SessionStore.save_checkpoints`.

        Raises:
            StoreError: The store failed, or another execution of the run wrote one of them.
        """
        session_id = self._session_id
        if session_id is None or not self._checkpoints:
            return
        async with self._lock:
            saved = len(self._checkpoints)

            def forget() -> None:
                del self._checkpoints[:saved]

            write = self.store.save_checkpoints(
                session_id, self._checkpoints[:saved], synced=synced
            )
            await _write(write, forget)

    async def step(self, history: History, environment: Environment) -> None:
        """Save a completed step with status ``active``.

        Raises:
            StoreError: The store failed; the events stay recorded for the next save.
        """
        await self._save(history, environment, (), "active")

    async def finish(self, history: History, environment: Environment, final: RunFinished) -> None:
        """Save the run's end: the state, the recorded events and `final`, with its status.

        Raises:
            StoreError: The store failed; `final` is dropped, other events stay recorded.
        """
        await self._save(history, environment, (final,), session_status(final.stop_reason))

    async def _save(
        self,
        history: History,
        environment: Environment,
        extra: tuple[AgentEvent, ...],
        status: SessionStatus,
    ) -> None:
        session_id = self._session_id
        if session_id is None:
            # The session could not be created (that failure ended the run and was reported):
            # nothing to write to; the events wait for the session the next run creates.
            return
        async with self._lock:
            saved, kept = len(self._pending), len(self._checkpoints)

            def forget() -> None:
                del self._pending[:saved]
                del self._checkpoints[:kept]

            write = self.store.save_step(
                session_id,
                history=history,
                environment=environment,
                events=[*self._pending, *extra],
                status=status,
                checkpoints=self._checkpoints[:kept],
            )
            await _write(write, forget)


async def _write(write: Coroutine[object, object, object], forget: Callable[[], None]) -> None:
    """Run the store write `write` to its end (`_to_the_end`), then `forget` what it held.

    `forget` is called once the write succeeded, also when a cancellation that came meanwhile
    is re-raised: what the write held is stored. A failed write forgets nothing.
    """
    future = start_eagerly(write)
    try:
        await _to_the_end(future)
    finally:
        if future.done() and not future.cancelled() and future.exception() is None:
            forget()


async def _to_the_end(future: asyncio.Future[_T]) -> _T:
    """Await `future` (a started write) to its end even when the caller is cancelled meanwhile.

    A cancellation that arrives while it runs is held until it is done, then re-raised (its
    result or failure then goes unseen: the caller is being cancelled). Writes are started in
    the caller's task (`start_eagerly`): a new task would wait for the loop's next turn.
    """
    interrupted: asyncio.CancelledError | None = None
    while not future.done():
        try:
            # `wait` never cancels what it waits for: the write goes on when we are cancelled.
            await asyncio.wait((future,))
        except asyncio.CancelledError as err:
            interrupted = err
    if interrupted is not None:
        if not future.cancelled():
            future.exception()  # seen: no "exception was never retrieved" log
        raise interrupted
    return future.result()
