"""One session as the server holds it: its bus, its agent, its run, its pending approvals.

The numbering of the event stream lives here. An event's SSE id is its id in the store
(`agent_flow.sessions.models.event_id`): ``fence * 2**32 + seq``, where ``fence`` is the
fencing number of the run's claim on the session (one more for every run, across every process
and crash) and ``seq`` the event's number in its run. So an id handed to a client is never
handed out again, not even after a crash lost events the client saw: the next run's ids are
all above it. Events stored before ids existed keep their positions as ids (all below
``2**32``). The events of the latest run are
also kept in memory, recorded *before* they are published (through `_BufferingRecorder`, the
agent's `StepRecorder`), so a watcher that takes a copy of them and subscribes to the bus in
one synchronous step misses nothing: an event is either in its copy, or published after its
subscription opened (or both, and it is sent once: ids only ever grow).

A session whose runs execute in other processes (``runs_elsewhere``: durable runs, on
`agent_flow.durable` workers) is watched by tailing the store (`SessionStore.follow_events`):
its events arrive as each step is saved, with the same ids.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field

from agent_flow.agent import AgentExecutor
from agent_flow.environment import Environment
from agent_flow.errors import SessionBusyError, SessionNotFoundError
from agent_flow.events import (
    AgentEvent,
    BackpressurePolicy,
    ContextBuilt,
    EventBus,
    RunFinished,
)
from agent_flow.history import History
from agent_flow.prompt import PromptBreakdown
from agent_flow.server.models import SessionOptions
from agent_flow.sessions._lease import INTERRUPTED_SEQ
from agent_flow.sessions.models import Lease, event_id, numbering_run
from agent_flow.sessions.protocol import SessionStore, StepRecorder
from agent_flow.sessions.recorder import SessionRecorder, claim_session, default_holder
from agent_flow.telemetry.propagation import attached_context
from agent_flow.tools import ApprovalRequest, ApprovalResponse

__all__ = [
    "BATCH",
    "DELETE_CLAIM",
    "RECOVER_CLAIM",
    "LiveSession",
    "Push",
    "brief_claim",
    "drive",
    "interrupted_end",
    "recover",
]

#: Takes one live event with its id at once (True), or declines it (False: it is queued).
Push = Callable[[int | None, AgentEvent], bool]
#: Most events one SSE write carries.
BATCH = 256
#: Seconds a tail of the store waits for new events per read when no keep-alive is asked for.
TAIL_WAIT = 60.0

logger = logging.getLogger("agent_flow.server")


@dataclass
class _Pending:
    request: ApprovalRequest
    answer: asyncio.Future[ApprovalResponse]


@dataclass
class LiveSession:
    """A session the server has loaded (its agent is built on its first message)."""

    id: str
    options: SessionOptions
    store: SessionStore
    approval_timeout: float
    bus: EventBus = field(default_factory=EventBus)
    agent: AgentExecutor | None = None
    task: asyncio.Task[object] | None = None
    run_id: str | None = None
    #: The stored position of each run's first event, by run id.
    bases: dict[str, int] = field(default_factory=dict)
    #: The latest run's events, each with its id, in order.
    buffer: list[tuple[int, AgentEvent]] = field(default_factory=list)
    last_prompt: PromptBreakdown | None = None
    approvals: dict[str, _Pending] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Its runs execute in other processes: `watch` tails the store, not this bus.
    runs_elsewhere: bool = False
    #: Closed by its owner (deleted or evicted): never handed out again.
    closed: bool = False
    #: When it was last used (``time.monotonic``), for eviction.
    last_used: float = 0.0
    #: The fencing number of this server's last claim on the session, or the store's when its
    #: agent was built: a claim whose fence is not the next one finds the agent out of date.
    fence: int = 0
    #: The store's recorder of its agent (the claim on the session lives there).
    recorder: SessionRecorder | None = None
    #: The user who created it (None: stored before owners existed, or made without users).
    owner: str | None = None

    @property
    def running(self) -> bool:
        """Whether a run is under way."""
        return self.task is not None and not self.task.done()

    def current_at(self, fence: int) -> bool:
        """Whether its agent (if any) is up to date for a claim of `fence`.

        Every claim takes the next fence: up to date when none came since the agent was built
        or last ran.
        """
        return self.agent is None or fence == self.fence + 1

    def event_id(self, event: AgentEvent) -> int | None:
        """The SSE id of `event` (None for one no run of this server numbered).

        A delegated child's event is numbered by its top-level run (`numbering_run`).
        """
        base = self.bases.get(numbering_run(event))
        return None if base is None else base + event.seq

    def remember(self, event: AgentEvent) -> None:
        """Keep an event of the latest run, before it is published."""
        event_id = self.event_id(event)
        if event_id is not None:
            self.buffer.append((event_id, event))
        if isinstance(event, ContextBuilt) and not event.path:  # a child's is not the session's
            self.last_prompt = event.breakdown

    async def approve(self, request: ApprovalRequest) -> ApprovalResponse:
        """The agent's approver: wait for `answer`, or deny after the approval timeout."""
        future: asyncio.Future[ApprovalResponse] = asyncio.get_running_loop().create_future()
        self.approvals[request.call_id] = _Pending(request, future)
        try:
            async with asyncio.timeout(self.approval_timeout):
                return await future
        except TimeoutError:
            if future.done() and not future.cancelled():
                # Answered as the time ran out: `answer` told its caller it was taken, so it is.
                return future.result()
            return ApprovalResponse(
                approved=False, reason=f"no answer over HTTP within {self.approval_timeout:g}s"
            )
        finally:
            self.approvals.pop(request.call_id, None)

    def answer(self, call_id: str, response: ApprovalResponse) -> bool:
        """Answer the approval `call_id` waits for; False when no call waits under that id."""
        pending = self.approvals.pop(call_id, None)
        if pending is None or pending.answer.done():
            return False
        pending.answer.set_result(response)
        return True

    def pending_approvals(self) -> list[ApprovalRequest]:
        """The calls waiting for an answer, oldest first."""
        return [pending.request for pending in self.approvals.values()]

    async def watch(
        self,
        after: int,
        *,
        policy: BackpressurePolicy,
        maxsize: int,
        follow: bool = True,
        idle: float | None = None,
        push: Push | None = None,
        max_wait: float | None = None,
    ) -> AsyncGenerator[Sequence[tuple[int | None, AgentEvent]], None]:
        """Yield the events after id `after` in batches: stored ones first, then live ones.

        Each event comes with its id; an `EventsDropped` (this watcher fell behind under
        ``drop_oldest``) comes with None. A live batch holds what was published while the
        previous one was being sent (at most `BATCH` events), so a busy stream is written in
        few large writes and a quiet one event at a time. With `idle`, an empty batch comes
        after that many seconds without an event (the caller's cue for a keep-alive).
        Without `follow`, it ends after what happened so far.

        With `push`, once the replay is through and nothing waits in this watcher's queue,
        each live event is first offered to `push` in the publisher's own task (the bus's
        `Subscription.push`), so it reaches the client without waiting for this watcher's
        turn on the event loop; only the events `push` declines come as batches. The ids
        stay one sequence across both ways: no gap, no duplicate, in order.

        With `max_wait`, a ``"wait"`` watcher holds the run's publisher for at most that many
        seconds each time it falls behind; past that its oldest events are dropped and an
        `EventsDropped` tells it so (`EventBus.subscribe`).
        """
        if self.runs_elsewhere:
            async for stored_batch in self._tail(after, follow=follow, idle=idle):
                yield stored_batch
            return
        # One synchronous step: the copy of the latest run's events and the subscription.
        recent = list(self.buffer)
        subscription = (
            self.bus.subscribe(maxsize=maxsize, policy=policy, max_wait=max_wait)
            if follow
            else None
        )
        try:
            # The stored events (ids are sparse: read by id): every run's since `after`, this
            # server's and other servers' alike (theirs may come after this server's latest).
            last = after
            stored = await self.store.events_with_ids(self.id, after_id=last)
            for batch in _batches(stored):
                yield batch
            if stored:
                last = stored[-1][0]
            # The latest run's events not saved yet (none, when a later run was elsewhere).
            fresh = [(event_id, event) for event_id, event in recent if event_id > last]
            for batch in _batches(fresh):
                yield batch
            if fresh:
                last = fresh[-1][0]
            if subscription is None:
                return

            def offer(event: AgentEvent) -> bool:
                nonlocal last
                live_id = self.event_id(event)
                if live_id is not None and live_id <= last:
                    return True  # sent with the replay
                if live_id is not None and _runs_between(last, live_id):
                    return False  # runs elsewhere may come first: read in this watcher's task
                assert push is not None  # installed only with one
                if not push(live_id, event):
                    return False
                if live_id is not None:
                    last = live_id
                return True

            while True:
                if push is not None and subscription.push is None and not subscription.queued:
                    subscription.push = offer
                try:
                    # The subscription is no generator: cancelling a wait for it loses nothing.
                    async with asyncio.timeout(idle):
                        event = await anext(subscription)
                except TimeoutError:
                    yield []
                    continue
                except StopAsyncIteration:
                    return
                events = [event]
                while subscription.queued and len(events) < BATCH:
                    events.append(await anext(subscription))
                ready: list[tuple[int | None, AgentEvent]] = []
                for event in events:
                    live_id = self.event_id(event)
                    if live_id is None:
                        ready.append((None, event))
                    elif live_id > last:
                        if _runs_between(last, live_id):
                            # The runs other servers made meanwhile, stored, come first.
                            stored = await self.store.events_with_ids(self.id, after_id=last)
                            ready.extend((i, e) for i, e in stored if i < live_id)
                        last = live_id
                        ready.append((live_id, event))
                for batch in _batches(ready):
                    yield batch
        finally:
            if subscription is not None:
                await subscription.aclose()

    async def _tail(
        self, after: int, *, follow: bool, idle: float | None
    ) -> AsyncIterator[Sequence[tuple[int | None, AgentEvent]]]:
        """The stored events after `after` in batches, then (with `follow`) each step's as saved."""
        last = after
        wait = idle if idle is not None else TAIL_WAIT
        while True:
            if follow:
                events = await self.store.wait_for_events_with_ids(
                    self.id, after_id=last, wait=wait
                )
            else:
                events = await self.store.events_with_ids(self.id, after_id=last)
            for batch in _batches(events):
                yield batch
            if events:
                last = events[-1][0]
            if not events and idle is not None:
                yield []  # the keep-alive cue
            if not follow:
                return


def _runs_between(last: int, event_id: int) -> bool:
    """Whether runs may lie between the ones of the ids `last` and `event_id` (by fences).

    Every claim takes the next fence, so a run next to the last one seen has the fence after
    its; a wider step may hide other servers' runs (or claims that stored nothing). Ids below
    ``2**32`` (stored before fences) are all taken as one run's.
    """
    return event_id >> 32 > (max(last, 0) >> 32) + 1


def _batches(
    numbered: Sequence[tuple[int | None, AgentEvent]],
) -> Iterator[Sequence[tuple[int | None, AgentEvent]]]:
    """`numbered` (events with their ids) in slices of at most `BATCH`."""
    for first in range(0, len(numbered), BATCH):
        yield numbered[first : first + BATCH]


class _BufferingRecorder:
    """The agent's `StepRecorder`: the store's recorder, telling the session of each event."""

    def __init__(self, inner: StepRecorder, live: LiveSession) -> None:
        self._inner = inner
        self._live = live

    @property
    def session_id(self) -> str | None:
        return self._inner.session_id

    async def start(self, *, agent: str, task: str, run_id: str = "") -> None:
        await self._inner.start(agent=agent, task=task, run_id=run_id)

    def record(self, event: AgentEvent) -> None:
        self._live.remember(event)
        self._inner.record(event)

    async def step(self, history: History, environment: Environment) -> None:
        await self._inner.step(history, environment)

    async def finish(self, history: History, environment: Environment, final: RunFinished) -> None:
        try:
            await self._inner.finish(history, environment, final)
        except asyncio.CancelledError:
            # The write finished first (see StepRecorder): `final` is saved and published.
            self._live.remember(final)
            raise
        self._live.remember(final)


def buffering_recorder(inner: StepRecorder, live: LiveSession) -> StepRecorder:
    """Wrap the agent's recorder so that `live` numbers and keeps each event first."""
    return _BufferingRecorder(inner, live)


async def interrupted_end(
    store: SessionStore, live: LiveSession, lease: Lease
) -> list[tuple[int, AgentEvent]]:
    """The ``interrupted`` end the claim `lease` stored for a dead run, with its id."""
    dead = lease.interrupted_run
    if dead is None:
        return []
    # The dead run held the fence before this one; its end is its last possible event.
    live.bases[dead] = event_id(lease.fence - 1, 0)
    last = event_id(lease.fence - 1, INTERRUPTED_SEQ)
    return [
        (found, event)
        for found, event in await store.events_with_ids(live.id, after_id=last - 1)
        if found == last
    ]


#: The run ids of a server's brief claims of its own: ending a dead run as it loads a session
#: (`recover`), deleting one (`agent_flow.server._delete`).
RECOVER_CLAIM, DELETE_CLAIM = "recover-", "delete-"


def brief_claim(run_id: str) -> bool:
    """Whether `run_id` names a server's brief claim (`RECOVER_CLAIM`, `DELETE_CLAIM`)."""
    return run_id.startswith((RECOVER_CLAIM, DELETE_CLAIM))


async def recover(store: SessionStore, live: LiveSession) -> None:
    """End a run a dead process left claimed, so that its watchers learn it ended.

    Only a claim of a process of this machine that is gone, or an expired one, is ended
    (`claim_session`); a live run elsewhere keeps its session.
    """
    try:
        lease = await claim_session(
            store,
            live.id,
            run_id=f"{RECOVER_CLAIM}{uuid.uuid4().hex}",
            holder=default_holder(),
            ttl=1.0,
        )
    except (SessionBusyError, SessionNotFoundError):
        return
    try:
        if live.current_at(lease.fence):  # else the agent stays behind, to be built again
            live.fence = lease.fence
        for found, event in await interrupted_end(store, live, lease):
            live.buffer = [(found, event)]
            await live.bus.publish(event)
    finally:
        await store.release(lease)


async def drive(
    session_id: str, coroutine: Awaitable[object], trace: Mapping[str, str] | None = None
) -> object:
    """Await a session's run (or a durable run's following), continuing the trace `trace`.

    Its failure is reported as events already: here it is logged (by type only) and None
    returned.
    """
    try:
        with attached_context(trace):
            return await coroutine
    except asyncio.CancelledError:
        raise
    except Exception as err:
        # The run reported its failure as events; the log keeps the type, never the config.
        logger.warning("run of session %s failed: %s", session_id, type(err).__name__)
        return None
