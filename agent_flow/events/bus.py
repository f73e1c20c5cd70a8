"""The `EventBus`: every event of a run, fanned out to any number of subscribers.

Each subscriber has its own bounded queue, consumed with ``async for``; its policy decides
what happens when it falls behind (see the package docstring).

A queue holds events and, where events were dropped, one gap marker per run of dropped
events, in place: the reader gets an `EventsDropped` exactly where the missing events would
have been, counting them, before the event that follows. Under ``"drop_oldest"`` the gap is
always at the front; under ``"drop_deltas_first"`` the dropped deltas may sit between kept
lifecycle events, and each run of them becomes its own gap. Nothing is counted per event for
it: when the queue is full, the oldest delta is found by a scan that starts past the items
already known not to be deltas, so each item is looked at about once however long it waits.

A ``"wait"`` subscription may bound the back-pressure it applies (``max_wait``): it counts
as *behind* from the moment an event is queued for it with nothing else queued until its
queue is empty again, and once it has been behind for ``max_wait`` seconds a publisher no
longer waits for it: it is treated as ``"drop_oldest"`` (the oldest events are dropped and
the reader later gets one `EventsDropped` for the gap) until it has read everything queued.
A reader that stops reading so holds a publisher for at most ``max_wait`` seconds in all; one
that reads slowly but catches up now and then still slows it down (that is what ``"wait"``
asks for), by at most ``max_wait`` per time it falls behind. Without ``max_wait`` (the
default) a publisher waits as long as it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, TypeAlias, cast

from agent_flow.errors import UserError
from agent_flow.events.models import EVENT_KINDS, AgentEvent, EventsDropped

__all__ = [
    "DELTA_KINDS",
    "BackpressurePolicy",
    "EventBus",
    "EventHook",
    "Subscription",
]

logger = logging.getLogger("agent_flow.events")

BackpressurePolicy = Literal["wait", "drop_oldest", "drop_deltas_first"]
EventHook: TypeAlias = Callable[[AgentEvent], Awaitable[None] | None]

#: What ``"drop_deltas_first"`` drops first: the streamed fragments of one model answer.
#: Everything else is a lifecycle event (a call completed, the environment changed, ...).
DELTA_KINDS: Final = frozenset({"text_delta", "thinking_delta", "tool_call_arguments_delta"})


@dataclass(slots=True)
class _Gap:
    """Where events were dropped from a queue: how many, and their first and last seq."""

    count: int
    first_seq: int
    last_seq: int


class Subscription:
    """One subscriber's bounded queue of events; iterate it with ``async for``.

    Created by `EventBus.subscribe`. Iteration ends when the bus closes, `end` is called
    (queued events are read first), or `aclose` is called (at once).

    Attributes:
        push: A receiver tried first, in the publisher's task, whenever nothing is queued:
            it returns True when it took the event (which is then not queued) and False to
            have it queued as usual. It must not raise. A reader that can take an event at
            once (an HTTP stream writing to its socket) saves the hop through the queue.
        max_wait: Under ``"wait"``, seconds this subscriber may stay behind before
            publishers stop waiting for it and drop its oldest events instead (see the
            module doc); None waits without bound.
    """

    def __init__(
        self,
        bus: EventBus,
        *,
        maxsize: int,
        policy: BackpressurePolicy,
        kinds: frozenset[str] | None,
        where: Callable[[AgentEvent], bool] | None = None,
        max_wait: float | None = None,
    ) -> None:
        self._bus = weakref.ref(bus)
        self.maxsize = maxsize
        self.policy: BackpressurePolicy = policy
        self._deltas_first = policy == "drop_deltas_first"
        self.max_wait = max_wait
        #: Loop time at which an event was last queued with nothing else queued.
        self._behind_since = 0.0
        self.kinds = kinds
        self._where = where
        # Events, and a `_Gap` in place of each run of dropped ones (never two in a row, never
        # last; `_gaps` of them). Under "drop_deltas_first" no delta sits before `_scan`,
        # which is 0 whenever there is no gap.
        self._queue: deque[AgentEvent | _Gap] = deque()
        self._gaps = 0
        self._scan = 0
        self._closed = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        weakref.finalize(self, self._writable.set)
        self._consumer: asyncio.Task[object] | None = None
        self.dropped_total = 0
        self.push: Callable[[AgentEvent], bool] | None = None

    @property
    def queued(self) -> int:
        """How many items wait to be read now (reading them does not suspend).

        Events, and a gap notice (`EventsDropped`) where events were dropped.
        """
        return len(self._queue)

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
        """Queue `event` if there is room (dropping under the lossy policies)."""
        if self._closed:
            return True
        # Only with nothing queued, so a pushed event never overtakes a queued one.
        if self.push is not None and not self._queue and self.push(event):
            return True
        queued = len(self._queue)
        # The second test only when the first passes: a queue with room costs one comparison.
        if queued >= self.maxsize and queued - self._gaps >= self.maxsize:
            if self.policy == "wait" and not self._waited_enough():
                self._writable.clear()
                return False
            self._drop_one()
        if not self._queue and self.max_wait is not None:
            self._behind_since = asyncio.get_running_loop().time()
        self._queue.append(event)
        self._readable.set()
        return True

    def _drop_one(self) -> None:
        """Make room for one event: drop the oldest delta (under that policy), else the oldest."""
        queue = self._queue
        if not self._deltas_first:
            # Dropped from the front only: the one gap there is, if any, is at the front.
            if self._gaps:
                gap = cast(_Gap, queue[0])
                event = cast(AgentEvent, queue[1])
                del queue[1]
                gap.count += 1
                gap.last_seq = event.seq
            else:
                event = cast(AgentEvent, queue.popleft())
                gap = _Gap(1, event.seq, event.seq)
                queue.appendleft(gap)
                self._gaps = 1
            self.dropped_total += 1
            return
        for index in range(self._scan, len(queue)):
            item = queue[index]
            if not isinstance(item, _Gap) and item.kind in DELTA_KINDS:
                self._drop(index, delta=True)
                return
        self._drop(1 if isinstance(queue[0], _Gap) else 0, delta=False)

    def _drop(self, index: int, *, delta: bool) -> None:
        """Drop the event at `index`: it joins the gap before or after it, or becomes one."""
        queue = self._queue
        event = queue[index]
        assert not isinstance(event, _Gap)
        self.dropped_total += 1
        before = queue[index - 1] if index else None
        after = queue[index + 1] if index + 1 < len(queue) else None
        if isinstance(before, _Gap):
            before.last_seq = event.seq
            before.count += 1
            gap = before
            del queue[index]
            unknown = index  # the first item not known to be a lifecycle event or a gap
        else:
            gap = queue[index] = _Gap(1, event.seq, event.seq)
            self._gaps += 1
            unknown = index + 1
        if isinstance(after, _Gap):
            gap.last_seq = after.last_seq
            gap.count += after.count
            del queue[unknown]
            self._gaps -= 1
        if delta:
            # Everything before it was a lifecycle event or a gap: the next scan starts after.
            self._scan = unknown
        elif self._deltas_first:
            # The scan found no delta at all: the next one will be an event appended later.
            self._scan = len(queue)

    def wait_deadline(self) -> float | None:
        """Loop time after which a publisher stops waiting for room here (None: never)."""
        if self.max_wait is None or self.policy != "wait":
            return None
        return self._behind_since + self.max_wait

    def _waited_enough(self) -> bool:
        """Whether this full queue has been behind for its `max_wait` (publishers drop)."""
        deadline = self.wait_deadline()
        return deadline is not None and asyncio.get_running_loop().time() >= deadline

    def _close(self) -> None:
        self._closed = True
        self.push = None
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
        item = self._queue.popleft()
        # Only a queue with a gap needs more (`_scan` > 0 only then): one test otherwise.
        if self._gaps:
            if self._scan:
                self._scan -= 1
            if not isinstance(item, _Gap):
                self._writable.set()
                return item
            self._gaps -= 1
            if not self._gaps:
                self._scan = 0
            follows = self._queue[0]  # a gap is never last: an event was queued after it
            assert not isinstance(follows, _Gap)
            return EventsDropped(
                run_id=follows.run_id,
                seq=follows.seq,
                count=item.count,
                first_seq=item.first_seq,
                last_seq=item.last_seq,
            )
        self._writable.set()
        return item  # type: ignore[return-value]  # no gap is queued (a cast costs a call)

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
        self._gaps = self._scan = 0

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
        policy: BackpressurePolicy | None = None,
        kinds: Iterable[str] | None = None,
        where: Callable[[AgentEvent], bool] | None = None,
        max_wait: float | None = None,
    ) -> Subscription:
        """Open a subscription that receives every event published from now on.

        Args:
            maxsize: Bound of this subscriber's queue (default the bus's
                ``default_maxsize``).
            policy: What happens when the queue is full: ``"wait"`` makes the publisher wait,
                ``"drop_oldest"`` drops the oldest events and ``"drop_deltas_first"`` the
                oldest delta (`DELTA_KINDS`) while one is queued, else the oldest event; both
                report each gap where it was. Default: ``"drop_deltas_first"`` when you ask
                for a `maxsize` (a bounded queue is asking not to hold the agent up),
                ``"wait"`` otherwise.
            kinds: Only receive events of these kinds (all when None).
            where: Only receive events for which this returns True (e.g. one run's, by
                ``run_id``, on a shared bus). It runs in the publisher's task; one that
                raises is logged and the event is not delivered to this subscription.
            max_wait: Under ``"wait"``, bounds the waiting: once this subscriber has been
                behind for that many seconds, its oldest events are dropped (and the gap
                reported) instead, until it catches up (see the module doc). None (the
                default) waits without bound; ignored under ``"drop_oldest"``.
        """
        size = self.default_maxsize if maxsize is None else maxsize
        if policy is None:
            policy = "wait" if maxsize is None else "drop_deltas_first"
        if size < 1:
            raise UserError(f"maxsize must be at least 1, got {size}")
        if max_wait is not None and not max_wait >= 0:
            raise UserError(f"max_wait must be at least 0 seconds (or None), got {max_wait}")
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
            max_wait=max_wait,
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
        """Deliver `event` to every subscriber and hook (waiting for ``"wait"`` subscribers).

        A ``"wait"`` subscriber with a ``max_wait`` is waited for only until it has been
        behind that long (see the module doc).
        """
        for ref in list(self._subscriptions):
            subscription = ref()
            if subscription is None or not subscription._wants(event):
                continue
            if subscription._offer(event):
                continue
            # Wait for room holding only a weak reference: if the reader drops its
            # subscription meanwhile, it is collected and its finalizer wakes us.
            writable = subscription._writable
            while True:
                # Read again each time: the reader may have caught up and fallen behind anew.
                deadline = subscription.wait_deadline()
                del subscription
                if deadline is None:
                    await writable.wait()
                else:
                    # Past the deadline `_offer` drops instead of waiting: one more try does.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout_at(deadline):
                            await writable.wait()
                subscription = ref()
                if subscription is None or subscription._offer(event):
                    break
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
