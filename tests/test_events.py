from __future__ import annotations

import asyncio
import gc
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import EnvironmentChange
from agent_flow.errors import UserError
from agent_flow.events import (
    DELTA_KINDS,
    EVENT_ADAPTER,
    AgentEvent,
    EnvironmentUpdated,
    EventBus,
    EventsDropped,
    HistoryPruned,
    RunFinished,
    Subscription,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    event_from_json,
    event_to_json,
)
from agent_flow.history import PruneReport
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.testing.strategies import json_values


def text(seq: int, value: str = "x") -> TextDelta:
    return TextDelta(run_id="r1", seq=seq, text=value)


async def collect(subscription: typing.AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    return [event async for event in subscription]


def event_classes() -> list[type]:
    annotated = typing.get_args(AgentEvent)[0]
    return list(typing.get_args(annotated))


def test_every_event_class_is_in_the_union_and_has_a_distinct_kind() -> None:
    import agent_flow.events.models as module

    members = set(event_classes())
    defined = {
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, module._Event) and obj is not module._Event
    }
    assert defined == members
    kinds = [cls.model_fields["kind"].default for cls in members]
    assert len(kinds) == len(set(kinds))


# One class per test: drawing every class in one example overran Hypothesis's buffer now
# and then (a "filter_too_much" health-check failure).
@pytest.mark.parametrize("cls", event_classes(), ids=lambda cls: cls.__name__)
@settings(max_examples=30)
@given(data=st.data())
def test_every_event_kind_round_trips_through_one_json_line(
    cls: type[AgentEvent], data: st.DataObject
) -> None:
    finite = {
        name: st.floats(0, 1e9)
        for name, field in cls.model_fields.items()
        if field.annotation in (float, "float")
    }
    json_fields = {
        name: json_values()
        for name, field in cls.model_fields.items()
        if "JsonValue" in str(field.annotation)
    }
    if cls is EnvironmentUpdated:
        json_fields["changes"] = st.lists(
            st.builds(
                EnvironmentChange,
                version=st.integers(0, 100),
                op=st.sampled_from(["set", "delete"]),
                pointer=st.text(),
                old=json_values(),
                new=json_values(),
            ),
            max_size=3,
        ).map(tuple)
    if cls is HistoryPruned:
        # PruneReport nests reports (a chain's steps): left to st.builds the recursion now and
        # then overran Hypothesis's buffer. One level of steps covers the shape.
        leaf = st.builds(PruneReport, steps=st.just(()))
        json_fields["report"] = st.builds(PruneReport, steps=st.lists(leaf, max_size=2).map(tuple))
    event = data.draw(
        st.builds(cls, run_id=st.text(), seq=st.integers(0, 10**9), **finite, **json_fields)
    )
    line = event_to_json(event)
    assert "\n" not in line
    assert event_from_json(line) == event
    assert EVENT_ADAPTER.validate_python(event.model_dump()) == event


async def test_every_subscriber_receives_every_event_in_order() -> None:
    bus = EventBus()
    subs = [bus.subscribe() for _ in range(3)]
    readers = [asyncio.create_task(collect(s)) for s in subs]
    for seq in range(50):
        await bus.publish(text(seq))
    bus.close()
    results = await asyncio.gather(*readers)
    for received in results:
        assert [e.seq for e in received] == list(range(50))


async def test_a_wait_subscriber_applies_back_pressure_without_losing_events() -> None:
    bus = EventBus()
    slow = bus.subscribe(maxsize=2, policy="wait")
    fast = bus.subscribe(maxsize=100)
    published: list[int] = []

    async def producer() -> None:
        for seq in range(10):
            await bus.publish(text(seq))
            published.append(seq)
        bus.close()

    task = asyncio.create_task(producer())
    # Let the producer run as far as it can: it stops when the slow queue is full.
    for _ in range(20):
        await asyncio.sleep(0)
    assert published == [0, 1]
    assert not task.done()
    received = await collect(slow)
    await task
    assert [e.seq for e in received] == list(range(10))
    assert [e.seq for e in await collect(fast)] == list(range(10))


async def test_a_drop_oldest_subscriber_never_blocks_and_reports_the_gap() -> None:
    bus = EventBus()
    lossy = bus.subscribe(maxsize=3, policy="drop_oldest")
    for seq in range(10):
        await bus.publish(text(seq))
    bus.close()
    received = await collect(lossy)
    assert isinstance(received[0], EventsDropped)
    assert received[0].count == 7
    assert (received[0].first_seq, received[0].last_seq) == (0, 6)
    assert [e.seq for e in received[1:]] == [7, 8, 9]
    assert lossy.dropped_total == 7


async def test_a_subscriber_that_breaks_out_early_does_not_stall_the_publisher() -> None:
    bus = EventBus()

    async def reads_two(subscription: Subscription) -> list[int]:
        seen = []
        async for event in subscription:
            seen.append(event.seq)
            if len(seen) == 2:
                break
        return seen

    other = bus.subscribe()
    # Subscribe before publishing; only the reader's task holds the subscription.
    reader = asyncio.create_task(reads_two(bus.subscribe(maxsize=1, policy="wait")))
    for seq in range(20):
        await bus.publish(text(seq))
        if seq == 5:
            assert await reader == [0, 1]
            gc.collect()
    bus.close()
    assert [e.seq for e in await collect(other)] == list(range(20))
    assert bus.subscriber_count == 0


async def test_a_subscriber_that_raises_does_not_affect_others() -> None:
    bus = EventBus()

    async def crashes(subscription: Subscription) -> None:
        async for _event in subscription:
            raise RuntimeError("subscriber bug")

    healthy = bus.subscribe()
    crashing = asyncio.create_task(crashes(bus.subscribe(maxsize=1, policy="wait")))
    for seq in range(5):
        await bus.publish(text(seq))
    with pytest.raises(RuntimeError, match="subscriber bug"):
        await crashing
    gc.collect()
    for seq in range(5, 10):
        await bus.publish(text(seq))
    bus.close()
    assert [e.seq for e in await collect(healthy)] == list(range(10))


async def test_subscriptions_can_join_late_and_filter_by_kind() -> None:
    bus = EventBus()
    await bus.publish(text(0))
    late = bus.subscribe(kinds={"tool_call_started"})
    await bus.publish(text(1))
    await bus.publish(ToolCallStarted(run_id="r1", seq=2, call_id="c", name="t", arguments="{}"))
    bus.close()
    assert [e.seq for e in await collect(late)] == [2]


async def test_async_with_leaves_the_bus_and_close_ends_iteration() -> None:
    bus = EventBus()
    async with bus.subscribe() as sub:
        assert bus.subscriber_count == 1
    assert bus.subscriber_count == 0
    assert sub.closed
    kept = bus.subscribe()
    bus.close()
    assert await collect(kept) == []
    again = bus.subscribe()
    await bus.publish(text(3))
    bus.close()
    assert [e.seq for e in await collect(again)] == [3]


async def test_a_where_filter_picks_events_and_one_that_raises_only_skips_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    mine = bus.subscribe(where=lambda event: event.run_id == "mine")

    def broken(event: AgentEvent) -> bool:
        raise ValueError("filter bug")

    skipped = bus.subscribe(where=broken)
    everything = bus.subscribe()
    await bus.publish(TextDelta(run_id="mine", seq=0, text="a"))
    await bus.publish(TextDelta(run_id="other", seq=0, text="b"))
    bus.close()
    assert [e.run_id for e in await collect(mine)] == ["mine"]
    assert await collect(skipped) == []
    assert [e.run_id for e in await collect(everything)] == ["mine", "other"]
    assert "filter bug" in caplog.text


async def test_ending_a_subscription_keeps_its_queued_events_and_leaves_the_bus() -> None:
    bus = EventBus()
    ended = bus.subscribe()
    other = bus.subscribe()
    await bus.publish(text(0))
    ended.end()
    await bus.publish(text(1))
    assert bus.subscriber_count == 1
    assert [e.seq for e in await collect(ended)] == [0]
    bus.close()
    assert [e.seq for e in await collect(other)] == [0, 1]


async def test_hooks_run_per_kind_and_a_failing_hook_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    seen: list[str] = []

    async def async_hook(event: AgentEvent) -> None:
        seen.append(f"async:{event.kind}")

    def broken(event: AgentEvent) -> None:
        raise ValueError("hook bug")

    bus.on("text_delta", lambda e: seen.append(f"sync:{e.kind}"))
    bus.on(None, async_hook)
    bus.on(["tool_call_started"], broken)
    await bus.publish(text(0))
    await bus.publish(ToolCallStarted(run_id="r1", seq=1, call_id="c", name="t", arguments="{}"))
    assert seen == ["sync:text_delta", "async:text_delta", "async:tool_call_started"]
    assert "hook bug" in caplog.text


def test_subscribing_to_an_unknown_kind_is_refused_with_the_known_kinds() -> None:
    bus = EventBus()
    with pytest.raises(UserError, match=r"unknown event kind\(s\) \['tool_call_complete'\]"):
        bus.subscribe(kinds={"tool_call_complete"})
    with pytest.raises(UserError, match="maxsize"):
        bus.subscribe(maxsize=0)


async def _run_until_blocked() -> None:
    """Let other tasks run as far as they can without time passing."""
    for _ in range(20):
        await asyncio.sleep(0)


# Far longer than the twenty turns of the loop in which a publisher is seen waiting.
BOUND = 0.25


async def test_a_bounded_wait_subscriber_that_stops_reading_holds_the_publisher_only_once() -> None:
    bus = EventBus()
    stalled = bus.subscribe(maxsize=2, policy="wait", max_wait=BOUND)
    published: list[int] = []

    async def producer() -> None:
        for seq in range(10):
            await bus.publish(text(seq))
            published.append(seq)

    task = asyncio.create_task(producer())
    await _run_until_blocked()
    assert published == [0, 1]  # it waits for room first, as under "wait"
    await task  # past the bound it drops instead, without waiting again
    bus.close()
    received = await collect(stalled)
    assert isinstance(received[0], EventsDropped)
    assert (received[0].count, received[0].first_seq, received[0].last_seq) == (8, 0, 7)
    assert [e.seq for e in received[1:]] == [8, 9]
    assert stalled.dropped_total == 8


async def test_a_bounded_wait_subscriber_that_caught_up_is_waited_for_again() -> None:
    bus = EventBus()
    sub = bus.subscribe(maxsize=2, policy="wait", max_wait=BOUND)
    for seq in range(3):  # the third waits out the bound, then drops the first
        await bus.publish(text(seq))
    assert [type(e).__name__ for e in [await anext(sub), await anext(sub), await anext(sub)]] == [
        "EventsDropped",
        "TextDelta",
        "TextDelta",
    ]
    assert sub.queued == 0  # caught up: back-pressure applies again
    published: list[int] = []

    async def producer() -> None:
        for seq in range(3, 8):
            await bus.publish(text(seq))
            published.append(seq)
        bus.close()

    task = asyncio.create_task(producer())
    await _run_until_blocked()
    assert published == [3, 4]
    assert [e.seq for e in await collect(sub)] == [3, 4, 5, 6, 7]
    await task
    assert sub.dropped_total == 1


def test_a_negative_max_wait_is_refused() -> None:
    with pytest.raises(UserError, match="max_wait must be at least 0 seconds"):
        EventBus().subscribe(max_wait=-1.0)


@settings(max_examples=60)
@given(
    total=st.integers(min_value=1, max_value=60),
    maxsize=st.integers(min_value=1, max_value=8),
    max_wait=st.sampled_from([0.0, 0.001]),
    stall_after=st.integers(min_value=0, max_value=70),
    turns=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=20),
)
def test_a_bounded_wait_subscriber_sees_each_event_or_counts_it_dropped_in_order(
    total: int, maxsize: int, max_wait: float, stall_after: int, turns: list[int]
) -> None:
    """Events seen plus events reported dropped are exactly the events published, in order."""

    async def scenario() -> tuple[list[int], int, int]:
        bus = EventBus()
        sub = bus.subscribe(maxsize=maxsize, policy="wait", max_wait=max_wait)
        published = asyncio.Event()
        order: list[int] = []  # seqs seen, and the seqs of each reported gap, as they come
        seen = 0

        async def reader() -> None:
            nonlocal seen
            count = 0
            async for event in sub:
                if isinstance(event, EventsDropped):
                    assert event.count == event.last_seq - event.first_seq + 1
                    order.extend(range(event.first_seq, event.last_seq + 1))
                else:
                    order.append(event.seq)
                    seen += 1
                count += 1
                if count == stall_after:
                    await published.wait()  # stops reading until everything is published
                for _ in range(turns[count % len(turns)]):
                    await asyncio.sleep(0)

        reading = asyncio.create_task(reader())
        for seq in range(total):
            await bus.publish(text(seq))
        published.set()
        bus.close()
        await reading
        return order, seen, sub.dropped_total

    order, seen, dropped = asyncio.run(scenario())
    assert seen + dropped == total
    assert order == list(range(total))


# -- drop_deltas_first: lifecycle events kept, every gap in its place ---------------------------

_LIFECYCLE = ("tool_call_completed", "environment_updated", "run_finished")


def event_of(kind: str, seq: int) -> AgentEvent:
    """A small event of `kind` (deltas and a few lifecycle kinds)."""
    if kind == "text_delta":
        return text(seq)
    if kind == "thinking_delta":
        return ThinkingDelta(run_id="r1", seq=seq, text="hm")
    if kind == "tool_call_arguments_delta":
        return ToolCallArgumentsDelta(
            run_id="r1", seq=seq, index=0, call_id=None, name=None, delta="{"
        )
    if kind == "tool_call_completed":
        return ToolCallCompleted(
            run_id="r1", seq=seq, call_id="c", name="t", content="ok", duration_ms=1.0
        )
    if kind == "environment_updated":
        return EnvironmentUpdated(run_id="r1", seq=seq, source="t", version=seq, changes=())
    return RunFinished(
        run_id="r1",
        seq=seq,
        stop_reason="completed",
        final_text="",
        iterations=1,
        prompt_tokens=0,
        completion_tokens=0,
        duration_ms=1.0,
    )


class QueueModel:
    """What a lossy subscriber must deliver, kept the naive way: every published event with a
    flag, the victim found by a scan, each run of dropped events one notice."""

    def __init__(self, maxsize: int, policy: str) -> None:
        self.maxsize = maxsize
        self.policy = policy
        self.pending: list[tuple[AgentEvent, bool]] = []  # (event, dropped), publish order

    def publish(self, event: AgentEvent) -> None:
        kept = [i for i, (_, dropped) in enumerate(self.pending) if not dropped]
        if len(kept) >= self.maxsize:
            deltas = [i for i in kept if self.pending[i][0].kind in DELTA_KINDS]
            victim = deltas[0] if deltas and self.policy == "drop_deltas_first" else kept[0]
            self.pending[victim] = (self.pending[victim][0], True)
        self.pending.append((event, False))

    def read(self) -> tuple[str, int, int, int] | AgentEvent:
        run = 0
        while self.pending[run][1]:
            run += 1
        if run:
            gone = [event for event, _ in self.pending[:run]]
            del self.pending[:run]
            return ("gap", len(gone), gone[0].seq, gone[-1].seq)
        return self.pending.pop(0)[0]


def as_model(item: AgentEvent) -> tuple[str, int, int, int] | AgentEvent:
    if isinstance(item, EventsDropped):
        return ("gap", item.count, item.first_seq, item.last_seq)
    return item


_KINDS = st.sampled_from(sorted(DELTA_KINDS) + list(_LIFECYCLE))
_STEPS = st.lists(st.one_of(_KINDS, st.integers(1, 4)), max_size=60)


@settings(max_examples=150)
@given(
    maxsize=st.integers(1, 6),
    policy=st.sampled_from(["drop_deltas_first", "drop_oldest"]),
    steps=_STEPS,
)
def test_a_lossy_subscriber_delivers_what_it_kept_in_order_with_every_gap_in_its_place(
    maxsize: int, policy: str, steps: list[str | int]
) -> None:
    """A step publishes an event of a kind, or reads up to n items, in any interleaving."""

    async def scenario() -> None:
        bus = EventBus()
        subscription = bus.subscribe(maxsize=maxsize, policy=policy)  # type: ignore[arg-type]
        model = QueueModel(maxsize, policy)
        seq = 0
        dropped = 0

        async def read() -> None:
            nonlocal dropped
            item = await anext(subscription)
            expected = model.read()
            assert as_model(item) == expected
            if isinstance(item, EventsDropped):
                dropped += item.count
                assert item.seq == next(e for e, gone in model.pending if not gone).seq

        for step in [*steps, 10**6]:
            if isinstance(step, str):
                event = event_of(step, seq)
                seq += 1
                await bus.publish(event)
                model.publish(event)
                assert subscription.queued <= 2 * maxsize
                continue
            for _ in range(step):
                if not model.pending:
                    assert subscription.queued == 0
                    break
                await read()
        assert dropped == subscription.dropped_total

    asyncio.run(scenario())


async def test_a_bounded_subscriber_keeps_the_runs_lifecycle_events_by_default() -> None:
    """An agent streams a long answer to subscribers that read only after the run, with room
    for 16 events: by default every delta may go, no lifecycle event does (drop_oldest, the
    previous choice, loses the run's start among others)."""
    words = " ".join(f"word{i}" for i in range(200))
    llm = ScriptedLLM(
        [reply(words, tool_calls=[call("task_completion", summary="done")])], chunk_size=4
    )
    agent = AgentExecutor(llm, config=AgentConfig(context=ContextConfig(max_tokens=8000)))
    slow = agent.subscribe(maxsize=16)
    oldest = agent.subscribe(maxsize=16, policy="drop_oldest")
    everything = agent.subscribe()
    assert (slow.policy, everything.policy) == ("drop_deltas_first", "wait")
    run = asyncio.create_task(agent.run("Say many words, then finish."))
    published = await collect(everything)
    await run
    lifecycle = [e for e in published if e.kind not in DELTA_KINDS]
    assert len(lifecycle) <= 16 < len(published)
    received = await collect(slow)
    kept = [e for e in received if not isinstance(e, EventsDropped)]
    assert [e for e in kept if e.kind not in DELTA_KINDS] == lifecycle
    gaps = [e for e in received if isinstance(e, EventsDropped)]
    assert sum(g.count for g in gaps) + len(kept) == len(published)
    lossy = [e for e in await collect(oldest) if not isinstance(e, EventsDropped)]
    assert published[0] not in lossy


async def test_bounded_subscribers_still_get_the_policy_they_ask_for() -> None:
    bus = EventBus()
    assert bus.subscribe(maxsize=3, policy="wait").policy == "wait"
    assert bus.subscribe(maxsize=3, policy="drop_oldest").policy == "drop_oldest"
    assert bus.subscribe().policy == "wait"
    assert bus.subscribe(maxsize=3).policy == "drop_deltas_first"
