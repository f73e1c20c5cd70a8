"""What an agent run tells the world: the `AgentEvent` union and the `EventBus` that fans it out.

Every event is a frozen pydantic model tagged by ``kind`` and stamped with the run id, a
sequence number (gap-free per run, starting at 0) and a UTC timestamp, so it serializes to
one JSON line and back (`event_to_json`, `event_from_json`).

The `EventBus` gives each subscriber its own bounded queue, consumed with ``async for``.
When a subscriber falls behind, its own policy decides, explicitly:

- ``"wait"``: the publisher waits for room (back-pressure; the agent slows to the reader);
- ``"drop_oldest"``: the oldest queued events are dropped and the subscriber later receives
  one `EventsDropped` event counting them, so a gap is never silent.

A subscriber that raises or stops reading affects nobody else: it only ever touches its own
queue, and it leaves the bus when the task reading it fails, when it leaves an ``async for``
early and drops the subscription, or at once with ``async with`` / `Subscription.aclose`.

A bus is closed only by whoever created it (`EventBus.close` ends every subscription; queued
events can still be read). An agent that made its own bus closes it when each run ends; a bus
given to agents is shared and no agent closes it, so one finishing never ends another's
subscribers. On a shared bus, ``bus.subscribe()`` sees every agent's events (told apart by
``run_id``) until the creator closes the bus; ``agent.subscribe()`` sees that agent's events
only and ends with its run, as on a bus of its own.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import typing
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from types import TracebackType
from typing import Annotated, Literal, TypeAlias

from pydantic import Field, TypeAdapter

from agent_flow._event_base import _Event
from agent_flow._model_call_events import ModelOutputDiscarded, ModelRetrying
from agent_flow._types import JsonValue
from agent_flow.environment import EnvironmentChange, PlanStep
from agent_flow.errors import UserError
from agent_flow.history import PruneReport
from agent_flow.prompt import PromptBreakdown

__all__ = [
    "EVENT_ADAPTER",
    "EVENT_KINDS",
    "AgentEvent",
    "ApprovalRequired",
    "ApprovalResolved",
    "BackpressurePolicy",
    "ContextBuilt",
    "EnvironmentUpdated",
    "EventBus",
    "EventHook",
    "EventKind",
    "EventsDropped",
    "ExecutionError",
    "HistoryPruned",
    "IterationStarted",
    "ModelOutputDiscarded",
    "ModelResponded",
    "ModelRetrying",
    "PlanUpdated",
    "RunFinished",
    "RunStarted",
    "Subscription",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallCompleted",
    "ToolCallFailed",
    "ToolCallStarted",
    "WarningRaised",
    "event_from_json",
    "event_to_json",
]

logger = logging.getLogger(__name__)


class RunStarted(_Event):
    """A run began with this user message, for this agent and model (at `base_url`)."""

    kind: Literal["run_started"] = "run_started"
    task: str
    agent: str
    model: str
    base_url: str | None = None


class IterationStarted(_Event):
    """The loop began iteration `iteration` (1-based)."""

    kind: Literal["iteration_started"] = "iteration_started"
    iteration: int


class ContextBuilt(_Event):
    """A prompt was assembled; `breakdown` says where its tokens went."""

    kind: Literal["context_built"] = "context_built"
    iteration: int
    breakdown: PromptBreakdown


class ThinkingDelta(_Event):
    """The model streamed reasoning text (not part of its answer)."""

    kind: Literal["thinking_delta"] = "thinking_delta"
    text: str


class TextDelta(_Event):
    """The model streamed answer text."""

    kind: Literal["text_delta"] = "text_delta"
    text: str


class ToolCallArgumentsDelta(_Event):
    """The model streamed part of a tool call's arguments."""

    kind: Literal["tool_call_arguments_delta"] = "tool_call_arguments_delta"
    index: int
    call_id: str | None
    name: str | None
    delta: str


class ModelResponded(_Event):
    """A model call finished: its finish reason, token usage and cost.

    ``source`` says who made it: the agent's own step, or the summarizer while pruning the
    history (its tokens count in the run's usage and limits too). ``model`` is the model
    that answered, as the server named it (``None``: not reported); ``cost_usd`` the call's
    price in US dollars (``None``: unknown, see `agent_flow.pricing`).
    """

    kind: Literal["model_responded"] = "model_responded"
    iteration: int
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    tool_calls: int
    duration_ms: float
    source: Literal["agent", "summarizer"] = "agent"
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    model: str | None = None
    cost_usd: float | None = None


class ToolCallStarted(_Event):
    """A tool call began executing."""

    kind: Literal["tool_call_started"] = "tool_call_started"
    call_id: str
    name: str
    arguments: str


class ToolCallCompleted(_Event):
    """A tool call returned a result (`is_error` when the tool reported a failure itself)."""

    kind: Literal["tool_call_completed"] = "tool_call_completed"
    call_id: str
    name: str
    content: str
    is_error: bool = False
    truncated: bool = False
    duration_ms: float


class ToolCallFailed(_Event):
    """A tool call could not produce a result; the model receives `error` as its result.

    Causes: unknown tool, invalid arguments, the tool raised or timed out, or it was denied;
    ``error_kind`` names which (`agent_flow.tools.ErrorKind`).
    """

    kind: Literal["tool_call_failed"] = "tool_call_failed"
    call_id: str
    name: str
    error: str
    duration_ms: float
    error_kind: str | None = None


class EnvironmentUpdated(_Event):
    """The environment changed; `changes` lists every pointer written or deleted."""

    kind: Literal["environment_updated"] = "environment_updated"
    source: str
    version: int
    changes: tuple[EnvironmentChange, ...]


class HistoryPruned(_Event):
    """The history was pruned; `report` says what was dropped, elided or summarized."""

    kind: Literal["history_pruned"] = "history_pruned"
    report: PruneReport


class PlanUpdated(_Event):
    """The plan in ``environment.task`` changed."""

    kind: Literal["plan_updated"] = "plan_updated"
    plan: tuple[PlanStep, ...]
    current_step: str | None


class ApprovalRequired(_Event):
    """A tool call waits for approval."""

    kind: Literal["approval_required"] = "approval_required"
    call_id: str
    name: str
    arguments: str
    reason: str


class ApprovalResolved(_Event):
    """An approval request was answered."""

    kind: Literal["approval_resolved"] = "approval_resolved"
    call_id: str
    name: str
    approved: bool
    reason: str = ""


class WarningRaised(_Event):
    """Something went wrong that the run survived (a fallback, a handler error, a retry)."""

    kind: Literal["warning_raised"] = "warning_raised"
    message: str
    source: str = ""


class ExecutionError(_Event):
    """An error occurred; `fatal` when it ends the run."""

    kind: Literal["execution_error"] = "execution_error"
    error_type: str
    message: str
    fatal: bool


class RunFinished(_Event):
    """The run ended: why, with what answer, at what cost."""

    kind: Literal["run_finished"] = "run_finished"
    stop_reason: str
    final_text: str
    output: JsonValue = None
    iterations: int
    prompt_tokens: int
    completion_tokens: int
    duration_ms: float
    cost_usd: float | None = None


class EventsDropped(_Event):
    """This subscriber fell behind and `count` events were dropped (``drop_oldest`` policy).

    It carries the sequence numbers of the gap; `seq` is that of the event that follows it.
    """

    kind: Literal["events_dropped"] = "events_dropped"
    count: int
    first_seq: int
    last_seq: int


AgentEvent: TypeAlias = Annotated[
    RunStarted
    | IterationStarted
    | ContextBuilt
    | ThinkingDelta
    | TextDelta
    | ToolCallArgumentsDelta
    | ModelResponded
    | ModelRetrying
    | ModelOutputDiscarded
    | ToolCallStarted
    | ToolCallCompleted
    | ToolCallFailed
    | EnvironmentUpdated
    | HistoryPruned
    | PlanUpdated
    | ApprovalRequired
    | ApprovalResolved
    | WarningRaised
    | ExecutionError
    | RunFinished
    | EventsDropped,
    Field(discriminator="kind"),
]
EVENT_ADAPTER: TypeAdapter[AgentEvent] = TypeAdapter(AgentEvent)
#: Every value of ``kind``.
EVENT_KINDS: frozenset[str] = frozenset(
    member.model_fields["kind"].default
    for member in typing.get_args(typing.get_args(AgentEvent)[0])
)
EventKind: TypeAlias = str


def event_to_json(event: AgentEvent) -> str:
    """Serialize an event to one JSON line (no newline inside)."""
    return event.model_dump_json()


def event_from_json(line: str) -> AgentEvent:
    """Parse an event from the JSON line `event_to_json` wrote."""
    return EVENT_ADAPTER.validate_json(line)


BackpressurePolicy = Literal["wait", "drop_oldest"]
EventHook: TypeAlias = Callable[[AgentEvent], Awaitable[None] | None]


class Subscription:
    """One subscriber's bounded queue of events; iterate it with ``async for``.

    Created by `EventBus.subscribe`. Iteration ends when the bus closes, `end` is called
    (queued events are read first), or `aclose` is called (at once).
    """

    def __init__(
        self,
        bus: EventBus,
        *,
        maxsize: int,
        policy: BackpressurePolicy,
        kinds: frozenset[str] | None,
        where: Callable[[AgentEvent], bool] | None = None,
    ) -> None:
        self._bus = weakref.ref(bus)
        self.maxsize = maxsize
        self.policy: BackpressurePolicy = policy
        self.kinds = kinds
        self._where = where
        self._queue: deque[AgentEvent] = deque()
        self._closed = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        weakref.finalize(self, self._writable.set)
        self._consumer: asyncio.Task[object] | None = None
        self._dropped = 0
        self._dropped_first = 0
        self._dropped_last = 0
        self.dropped_total = 0

    @property
    def closed(self) -> bool:
        """Whether no more events will arrive (queued ones may still be read)."""
        return self._closed

    def _wants(self, event: AgentEvent) -> bool:
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if self._where is None:
            return True
        try:
            return self._where(event)
        # A user's filter may fail in any way; it must not end the run that publishes.
        except Exception:
            logger.exception("subscription filter %r failed on %s event", self._where, event.kind)
            return False

    def _offer(self, event: AgentEvent) -> bool:
        """Queue `event` if there is room (dropping the oldest under that policy)."""
        if self._closed:
            return True
        if len(self._queue) >= self.maxsize:
            if self.policy == "wait":
                self._writable.clear()
                return False
            dropped = self._queue.popleft()
            if self._dropped == 0:
                self._dropped_first = dropped.seq
            self._dropped += 1
            self.dropped_total += 1
            self._dropped_last = dropped.seq
        self._queue.append(event)
        self._readable.set()
        return True

    def _close(self) -> None:
        self._closed = True
        self._readable.set()
        self._writable.set()

    def end(self) -> None:
        """Stop receiving events and leave the bus; events already queued can still be read.

        Iteration ends once they are read (`aclose` instead drops them and ends at once).
        """
        bus = self._bus()
        if bus is not None:
            bus._unsubscribe(self)
        self._close()

    async def aclose(self) -> None:
        """Stop receiving events and leave the bus."""
        self._abandon()

    def __aiter__(self) -> AsyncIterator[AgentEvent]:
        return self

    async def __anext__(self) -> AgentEvent:
        if self._consumer is not asyncio.current_task():
            self._watch_consumer()
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            self._readable.clear()
            await self._readable.wait()
        if self._dropped:
            gap = EventsDropped(
                run_id=self._queue[0].run_id,
                seq=self._queue[0].seq,
                count=self._dropped,
                first_seq=self._dropped_first,
                last_seq=self._dropped_last,
            )
            self._dropped = 0
            return gap
        event = self._queue.popleft()
        self._writable.set()
        return event

    def _watch_consumer(self) -> None:
        """Leave the bus when the reading task fails.

        A reader that raised keeps its frame (and so this subscription) alive in the
        exception's traceback; without this, a ``"wait"`` publisher would wait on it forever.
        """
        task = asyncio.current_task()
        if task is None:
            return
        self._consumer = task
        task.add_done_callback(functools.partial(_reader_finished, weakref.ref(self)))

    def _abandon(self) -> None:
        bus = self._bus()
        if bus is not None:
            bus._unsubscribe(self)
        self._close()
        self._queue.clear()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _reader_finished(ref: weakref.ref[Subscription], task: asyncio.Task[object]) -> None:
    # Only a reader that failed is abandoned: a task that ended normally may have been a
    # throwaway one (``wait_for(anext(sub))``), and the subscription lives on elsewhere.
    if task.cancelled() or task.exception() is None:
        return
    subscription = ref()
    if subscription is not None:
        subscription._abandon()


class EventBus:
    """Fans each published event out to every subscriber and hook.

    Closed only by whoever created it; several agents may share one (see the module doc).

    Subscriptions are held weakly: one its reader dropped (an ``async for`` left early)
    disappears with it, so a waiting publisher is never stuck on a queue nobody reads.

    Args:
        default_maxsize: Queue size of subscriptions that do not choose one.
    """

    def __init__(self, *, default_maxsize: int = 10_000) -> None:
        self.default_maxsize = default_maxsize
        self._subscriptions: list[weakref.ref[Subscription]] = []
        self._hooks: list[tuple[frozenset[str] | None, EventHook]] = []

    @property
    def subscriber_count(self) -> int:
        """How many subscriptions are open."""
        return sum(1 for ref in self._subscriptions if ref() is not None)

    def subscribe(
        self,
        *,
        maxsize: int | None = None,
        policy: BackpressurePolicy = "wait",
        kinds: Iterable[str] | None = None,
        where: Callable[[AgentEvent], bool] | None = None,
    ) -> Subscription:
        """Open a subscription that receives every event published from now on.

        Args:
            maxsize: Bound of this subscriber's queue.
            policy: What happens when the queue is full: ``"wait"`` makes the publisher wait,
                ``"drop_oldest"`` drops the oldest events and reports the gap.
            kinds: Only receive events of these kinds (all when None).
            where: Only receive events for which this returns True (e.g. one run's, by
                ``run_id``, on a shared bus). It runs in the publisher's task; one that
                raises is logged and the event is not delivered to this subscription.
        """
        size = self.default_maxsize if maxsize is None else maxsize
        if size < 1:
            raise UserError(f"maxsize must be at least 1, got {size}")
        if kinds is not None:
            kinds = frozenset(kinds)
            unknown = sorted(kinds - EVENT_KINDS)
            if unknown:
                known = ", ".join(sorted(EVENT_KINDS))
                raise UserError(f"unknown event kind(s) {unknown}; known kinds: {known}")
        subscription = Subscription(
            self,
            maxsize=size,
            policy=policy,
            kinds=frozenset(kinds) if kinds is not None else None,
            where=where,
        )
        self._subscriptions.append(weakref.ref(subscription, self._forget))
        return subscription

    def _forget(self, dead: weakref.ref[Subscription]) -> None:
        self._subscriptions = [ref for ref in self._subscriptions if ref is not dead]

    def _unsubscribe(self, subscription: Subscription) -> None:
        self._subscriptions = [ref for ref in self._subscriptions if ref() is not subscription]

    def on(self, kind: str | Iterable[str] | None, hook: EventHook) -> None:
        """Call `hook(event)` for every event of `kind` (a kind, kinds, or None for all).

        Hooks run in the publisher's task, in order; an async hook is awaited. A hook that
        raises is logged and skipped; it never stops the run.
        """
        kinds = None if kind is None else frozenset([kind] if isinstance(kind, str) else kind)
        self._hooks.append((kinds, hook))

    async def publish(self, event: AgentEvent) -> None:
        """Deliver `event` to every subscriber and hook (waiting for ``"wait"`` subscribers)."""
        for ref in list(self._subscriptions):
            subscription = ref()
            if subscription is None or not subscription._wants(event):
                continue
            if subscription._offer(event):
                continue
            # Wait for room holding only a weak reference: if the reader drops its
            # subscription meanwhile, it is collected and its finalizer wakes us.
            writable = subscription._writable
            del subscription
            while True:
                await writable.wait()
                subscription = ref()
                if subscription is None or subscription._offer(event):
                    break
                del subscription
        for kinds, hook in self._hooks:
            if kinds is not None and event.kind not in kinds:
                continue
            try:
                result = hook(event)
                if inspect.isawaitable(result):
                    await result
            # A user's hook may fail in any way; it must not end the run it observes.
            except Exception:
                logger.exception("event hook %r failed on %s event", hook, event.kind)

    def close(self) -> None:
        """End every open subscription; queued events can still be read.

        Only the bus's creator should call it (see the module doc): an agent closes the bus it
        made at the end of each run, never one it was given. New subscriptions may be opened
        afterwards; they receive the events published later.
        """
        for ref in self._subscriptions:
            subscription = ref()
            if subscription is not None:
                subscription._close()
        self._subscriptions = []
