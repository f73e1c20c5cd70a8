"""`SessionRecorder`: the save policy of a run, a `StepRecorder` over any `SessionStore`.

The agent loop calls it at step boundaries and nowhere else (see `StepRecorder`). It owns:

- creating the session when the first run starts (titled by that run's first message),
  unless it was given one (`AgentExecutor.resume` passes the resumed session's id);
- the run's claim on the session (`SessionStore.claim`): taken before the run's first
  write (or earlier, by `claim`, so that a server can refuse a second run at once), renewed
  every third of its time to live while the run goes, carried as the fencing number of every
  write, and released by the run's final save. A claim that cannot be renewed (the store says
  another run holds the session, or it is unreachable until the claim expires) stops the run
  through `on_lease_lost`; its later writes are refused by the store anyway;
- the save after every completed step, with status ``active``;
- the final save of a run, with the status its `RunFinished` event implies (completed,
  waiting, cancelled, or failed for limits and errors);
- a durable run's checkpoints (`checkpoint`), written with the next save, or at once
  (`save_checkpoints`) when one must be stored before its effect;
- the order and shielding of writes: one write at a time, each allowed to finish when the run
  is cancelled meanwhile (the cancellation is re-raised once it has), and recorded events are
  forgotten only once a write that holds them succeeded. So a cancelled run still saves its
  step and its end, a failed write loses no event (the next save carries it), and no write
  is ever half-done from the recorder's side (the store makes each one a transaction). A
  write that failed may still have committed (a connection lost at COMMIT): the next save
  first drops the events and checkpoints the store holds already (`_reconcile`).
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time
from collections.abc import Callable, Coroutine, Sequence

from agent_flow._defaults import SESSION_LEASE_SECONDS
from agent_flow._eager import start_eagerly, to_the_end
from agent_flow._utils import cancel_and_wait, weak_method
from agent_flow.agent.outcome import StopReason
from agent_flow.environment import Environment
from agent_flow.errors import (
    LeaseLostError,
    StoreError,
    UserError,
)
from agent_flow.events import AgentEvent, RunFinished
from agent_flow.history import History
from agent_flow.sessions._claims import claim_session, default_holder, end_claim
from agent_flow.sessions.models import (
    Checkpoint,
    Lease,
    SessionStatus,
    event_id,
    numbering_run,
)
from agent_flow.sessions.protocol import SessionStore

__all__ = [
    "SessionRecorder",
    "claim_session",
    "default_holder",
    "end_claim",
    "session_status",
]

logger = logging.getLogger("agent_flow.sessions")


_STATUS_OF_REASON: dict[StopReason, SessionStatus] = {
    StopReason.COMPLETED: "completed",
    StopReason.ANSWERED: "completed",
    StopReason.CONVERSE: "completed",
    StopReason.WAITING_FOR_USER: "waiting",
    StopReason.DEFERRED: "waiting",
    StopReason.CANCELLED: "cancelled",
    StopReason.INTERRUPTED: "interrupted",
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
        holder: Who holds the run's claim (default: ``pid@host:pidns``).
        lease_seconds: How long a claim lasts unless renewed.
    """

    def __init__(
        self,
        store: SessionStore,
        session_id: str | None = None,
        *,
        holder: str | None = None,
        lease_seconds: float = SESSION_LEASE_SECONDS,
    ) -> None:
        self.store = store
        self._session_id = session_id
        self._pending: list[AgentEvent] = []
        self._checkpoints: list[Checkpoint] = []
        # Writes happen one at a time and in the order the loop asked for them.
        self._lock = asyncio.Lock()
        self.holder = holder or default_holder()
        self.lease_seconds = lease_seconds
        self._lease: Lease | None = None
        # The fences of this recorder's runs whose events may still wait for a save.
        self._fences: dict[str, int] = {}
        self._renewing: asyncio.Task[None] | None = None
        #: Called when the run's claim is lost (the loop cancels the run; see `cancels`).
        self.on_lease_lost: Callable[[], None] | None = None
        # The claim it could not renew in time: writes under it are refused from then on.
        self._lost_lease: Lease | None = None
        # A write failed: it may have committed all the same (a connection lost at COMMIT).
        # The next write first drops what the store holds already (`_reconcile`).
        self._unsure = False

    def cancels(self, run: Callable[[], None]) -> None:
        """Call `run` (a bound method: an agent's ``cancel``) when the run's claim is lost.

        It is held weakly: the agent owns this recorder, and a strong bound method back would
        make the agent a reference cycle, freed only by a full collection of the cycle
        collector, with everything its runs built. A freed agent has no run to cancel.
        """
        self.on_lease_lost = weak_method(run, None)

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

    @property
    def lease(self) -> Lease | None:
        """The claim of the run under way (None between runs)."""
        return self._lease

    async def start(self, *, agent: str, task: str, run_id: str = "") -> None:
        """Create the session for a run of `agent` on `task` unless there is one; claim it.

        Raises:
            StoreError: The store cannot create it.
            SessionBusyError: Another run holds the session.
        """
        if self._session_id is None:
            # The session's task and title are copies for lists and search (the history keeps
            # the message whole): PostgreSQL's text columns take no NUL, so none goes there.
            task = task.replace("\x00", "\ufffd")
            title = textwrap.shorten(task, width=80, placeholder=" …")
            async with self._lock:
                creating = start_eagerly(self.store.create(agent=agent, title=title, task=task))
                try:
                    await to_the_end(creating)
                finally:
                    # Kept also when the caller was cancelled meanwhile: the next run writes to
                    # the session made for this one instead of leaving it empty and making one.
                    done = creating.done() and not creating.cancelled()
                    if done and creating.exception() is None:
                        self._session_id = creating.result().id
        if run_id and (self._lease is None or self._lease.run_id != run_id):
            await self.claim(run_id)

    async def claim(self, run_id: str, *, unique_run: bool = True) -> Lease:
        """Claim the session for the run `run_id` now (before it starts, for a server).

        ``unique_run=False``: other executions of the run share its id (a durable run's); see
        `claim_session`.

        Raises:
            UserError: The recorder has no session yet.
            SessionBusyError: Another run holds the session (its id is in the error).
        """
        session_id = self._session_id
        if session_id is None:
            raise UserError("claim needs a session: pass session_id, or start a run first")
        if self._lease is not None:
            await self.release()
        lease = await claim_session(
            self.store,
            session_id,
            run_id=run_id,
            holder=self.holder,
            ttl=self.lease_seconds,
            unique_run=unique_run,
        )
        self._hold(lease)
        return lease

    def adopt(self, lease: Lease) -> None:
        """Hold `lease`, claimed by the caller for this recorder's session, as `claim` would.

        For a server that claims before it builds the agent (so that it builds it from what
        the last writer left).

        Raises:
            UserError: `lease` is for another session, or this recorder holds a claim.
        """
        if lease.session_id != self._session_id or self._lease is not None:
            raise UserError(
                f"cannot adopt the claim on session {lease.session_id!r}: this recorder writes "
                f"{self._session_id!r} and holds {self._lease!r}"
            )
        self._hold(lease)

    def _hold(self, lease: Lease) -> None:
        self._lease = lease
        self._lost_lease = None
        self._fences[lease.run_id] = lease.fence
        self._renewing = asyncio.get_running_loop().create_task(
            self._renew(), name=f"agent_flow.lease:{lease.session_id}"
        )

    async def release(self) -> None:
        """Give up the claim (the run ended, or never started); stop renewing it."""
        lease, self._lease = self._lease, None
        renewing, self._renewing = self._renewing, None
        try:
            if renewing is not None:
                await cancel_and_wait(renewing)
        finally:  # (a caller cancelled meanwhile still gives the claim back)
            if lease is not None:
                try:
                    await self.store.release(lease)
                except StoreError as err:
                    # It expires by itself; the next claim then finds the run ended (saved).
                    logger.warning("releasing session %s failed: %s", lease.session_id, err)

    async def _renew(self) -> None:
        """Renew the claim every third of its life; stop the run once it is surely lost."""
        every = self.lease_seconds / 3
        while (lease := self._lease) is not None:
            await asyncio.sleep(every)
            deadline = time.monotonic() + every * 2  # before it can expire anywhere
            while self._lease is lease:
                try:
                    self._lease = await self.store.renew(lease, ttl=self.lease_seconds)
                    break
                except LeaseLostError as err:
                    logger.warning(
                        "run %s lost session %s: %s", lease.run_id, lease.session_id, err
                    )
                    self._lost(lease)
                    return
                except StoreError as err:
                    if time.monotonic() >= deadline:
                        logger.warning(
                            "run %s could not renew its claim on session %s in time: %s",
                            lease.run_id,
                            lease.session_id,
                            err,
                        )
                        self._lost(lease)
                        return
                    await asyncio.sleep(min(1.0, every / 10))

    def _lost(self, lease: Lease) -> None:
        # Another execution may claim the session once the claim expired: this one writes
        # nothing more under it, even where the store would still take the stale fence.
        self._lost_lease = lease
        if self.on_lease_lost is not None:
            self.on_lease_lost()

    def _held(self) -> Lease | None:
        """The lease this recorder writes under (None: none)."""
        lost = self._lost_lease
        if lost is not None and self._lease is lost:
            raise LeaseLostError(
                f"run {lost.run_id} could not renew its claim on session {lost.session_id!r} "
                "in time; it writes nothing more"
            )
        return self._lease

    def _number(self, event: AgentEvent) -> int | None:
        """The id `event` gets when saved (None: it has none, or the store will say why)."""
        fence = self._fences.get(numbering_run(event))
        if fence is None:
            return None
        try:
            return event_id(fence, event.seq)
        except UserError:
            return None

    def _late_fences(self) -> dict[str, int]:
        """The fences of earlier runs whose events wait for this save (a failed save's)."""
        current = self._lease.run_id if self._lease is not None else None
        waiting = {numbering_run(event) for event in self._pending}
        for run_id in [run for run in self._fences if run not in waiting and run != current]:
            del self._fences[run_id]
        return {run: fence for run, fence in self._fences.items() if run != current}

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
            taken = [0]

            def save() -> Coroutine[object, object, object]:
                taken[0] = len(self._checkpoints)
                if not taken[0]:  # all stored already (`_reconcile`)
                    return _nothing()
                rows = self._checkpoints[: taken[0]]
                held = self._held()
                return self.store.save_checkpoints(
                    session_id,
                    rows,
                    synced=synced,
                    fence=held.fence if held is not None else None,
                    lease_run=held.run_id if held is not None else None,
                )

            def forget() -> None:
                del self._checkpoints[: taken[0]]

            await self._written(session_id, save, forget)

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
        try:
            await self._save(history, environment, (final,), session_status(final.stop_reason))
        finally:
            await self.release()

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
            taken = [0, 0]

            def save() -> Coroutine[object, object, object]:
                taken[:] = len(self._pending), len(self._checkpoints)
                held = self._held()
                return self.store.save_step(
                    session_id,
                    history=history,
                    environment=environment,
                    events=[*self._pending, *extra],
                    status=status,
                    checkpoints=self._checkpoints[: taken[1]],
                    fence=held.fence if held is not None else None,
                    lease_run=held.run_id if held is not None else None,
                    event_fences=self._late_fences(),
                )

            def forget() -> None:
                del self._pending[: taken[0]]
                del self._checkpoints[: taken[1]]

            await self._written(session_id, save, forget)

    async def _written(
        self,
        session_id: str,
        save: Callable[[], Coroutine[object, object, object]],
        forget: Callable[[], None],
    ) -> None:
        """Reconcile if unsure, then make the write `save` makes, both to their end (`_write`).

        The recorder is unsure of what is stored after a write that failed (or was refused
        before it was sent: a lost claim) until the next one has reconciled.
        """

        async def reconciled_then_saved() -> object:
            if self._unsure:
                await self._reconcile(session_id)
            return await save()

        try:
            await _write(reconciled_then_saved(), forget)
        except BaseException:
            self._unsure = True
            raise

    async def _reconcile(self, session_id: str) -> None:
        """After a failed write, drop what the store holds already, or can never hold.

        A write that failed may have committed (the connection lost at COMMIT): sent again,
        its events would be refused for their ids and its checkpoints as another execution's,
        at every save from then on. An event whose id is not above the session's last id is
        stored already, or was overtaken (its run was ended as ``interrupted`` meanwhile) and
        can never be: either way it goes. A checkpoint stored alike goes too. (Events written
        without a claim have no id to tell: they are sent again.)

        Raises:
            StoreError: The store cannot be read (the recorder stays unsure).
        """
        last = (await self.store.info(session_id)).last_event_id
        current = self._lease.run_id if self._lease is not None else None
        keep: list[AgentEvent] = []
        overtaken = 0
        for event in self._pending:
            number = self._number(event)
            if number is None or number > last:
                keep.append(event)
            elif numbering_run(event) != current:
                # An earlier run's (its own fence): stored by the write that failed, or
                # overtaken by that run's end. The run's own events below `last` are stored
                # (only its fence numbers them), or never will be once its claim is lost.
                found = await self.store.events_with_ids(session_id, after_id=number - 1, limit=1)
                overtaken += not found or found[0][0] != number
        if overtaken:
            logger.warning(
                "%d events of session %s could not be saved before their run was ended; dropped",
                overtaken,
                session_id,
            )
        self._pending[:] = keep
        runs = {c.run_id for c in self._checkpoints}
        written = {
            (c.run_id, c.position, c.name, c.result)
            for run in runs
            for c in await self.store.checkpoints(session_id, run)
        }
        self._checkpoints[:] = [
            c for c in self._checkpoints if (c.run_id, c.position, c.name, c.result) not in written
        ]
        self._unsure = False


async def _nothing() -> None:
    return None


async def _write(write: Coroutine[object, object, object], forget: Callable[[], None]) -> None:
    """Run the store write `write` to its end (`to_the_end`), then `forget` what it held.

    `forget` is called once the write succeeded, also when a cancellation that came meanwhile
    is re-raised: what the write held is stored. A failed write forgets nothing.
    """
    future = start_eagerly(write)
    try:
        await to_the_end(future)
    finally:
        if future.done() and not future.cancelled() and future.exception() is None:
            forget()
