"""Step batches: the events a run publishes in one step reach an SSE client in one write.

`agent_flow.server._batching.batched_steps` wraps a run's coroutine; the SSE writer holds the
frames pushed in one of its steps and writes them together when the step ends. What must hold:
every frame is written once, in the order published; a batched step's frames go out before
the task lets anything else run (so nothing written later overtakes them); a push made
anywhere else goes out at once; an exception, a cancellation or a direct ``await`` changes
none of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import TextDelta
from agent_flow.server import create_app
from agent_flow.server._batching import batched_steps, current
from agent_flow.server._sse import HELD_BYTES, _frame, _Writer
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import ToolExecutor, tool
from tests.server_harness import BodyWrites, serving, stream


@functools.cache  # one event per seq: its frame (with its timestamp) is the same every time
def _event(seq: int) -> TextDelta:
    return TextDelta(run_id="r", seq=seq, text=f"t{seq}")


class _Socket:
    """A response's `send` that records each body it is given (one system call each)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.bodies.append(message["body"])


_POLICIES = st.sampled_from(["wait", "drop_oldest", "drop_deltas_first"])

# A plan: the run's steps, each the number of events it publishes before it waits; after
# some steps another task (not batched) publishes a few.
_PLANS = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 3)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(plan=_PLANS)
def test_each_step_is_one_write_and_every_frame_is_written_once_in_order(
    plan: list[tuple[int, int]],
) -> None:
    socket = _Socket()
    writer = _Writer(socket.send)
    published: list[int] = []
    expected: list[list[int]] = []  # the events of each write, as the writes should be

    def push(seq: int) -> None:
        published.append(seq)
        assert writer.push(seq, _event(seq))

    async def other(first: int, count: int) -> None:
        assert current() is None  # a task the run starts is not batched
        for seq in range(first, first + count):
            push(seq)
            expected.append([seq])

    async def run() -> None:
        seq = 0
        for in_step, by_other in plan:
            step = list(range(seq, seq + in_step))
            for n in step:
                push(n)
            seq += in_step
            if step:
                expected.append(step)
            await asyncio.create_task(other(seq, by_other))
            seq += by_other

    async def scenario() -> None:
        assert current() is None
        await asyncio.create_task(batched_steps(run()))
        assert current() is None

    asyncio.run(scenario())
    assert socket.bodies == [
        b"".join(_frame(seq, _event(seq)) for seq in events) for events in expected
    ]
    assert b"".join(socket.bodies) == b"".join(_frame(seq, _event(seq)) for seq in published)


def test_a_step_that_raises_or_is_cancelled_still_writes_what_it_held() -> None:
    socket = _Socket()
    writer = _Writer(socket.send)

    async def fails() -> None:
        writer.push(1, _event(1))
        await asyncio.sleep(0)
        writer.push(2, _event(2))
        raise ValueError("the run failed")

    async def cancelled(started: asyncio.Event) -> None:
        try:
            writer.push(3, _event(3))
            started.set()
            await asyncio.Event().wait()
        finally:
            writer.push(4, _event(4))  # written as the cancellation unwinds

    async def scenario() -> None:
        with pytest.raises(ValueError, match="the run failed"):
            await asyncio.create_task(batched_steps(fails()))
        started = asyncio.Event()
        task = asyncio.create_task(batched_steps(cancelled(started)))
        await started.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(scenario())
    assert socket.bodies == [_frame(n, _event(n)) for n in (1, 2, 3, 4)]


def test_awaited_directly_it_batches_the_awaiting_tasks_steps_and_returns_its_value() -> None:
    socket = _Socket()
    writer = _Writer(socket.send)

    async def steps() -> str:
        writer.push(1, _event(1))
        writer.push(2, _event(2))
        await asyncio.sleep(0)
        writer.push(3, _event(3))
        return "done"

    async def scenario() -> str:
        return await batched_steps(steps())

    assert asyncio.run(scenario()) == "done"
    assert socket.bodies == [
        _frame(1, _event(1)) + _frame(2, _event(2)),
        _frame(3, _event(3)),
    ]


def test_a_write_that_cannot_finish_declines_later_pushes_until_it_is_through() -> None:
    room = asyncio.Event()
    bodies: list[bytes] = []

    async def slow_send(message: dict[str, Any]) -> None:
        await room.wait()  # a client that reads slowly: the transport paused
        bodies.append(message["body"])

    writer = _Writer(slow_send)
    taken: list[bool] = []

    async def run() -> None:
        taken.append(writer.push(1, _event(1)))
        taken.append(writer.push(2, _event(2)))
        await asyncio.sleep(0)  # the step ends: its write starts and waits
        taken.append(writer.push(3, _event(3)))  # declined: the subscription queues it
        room.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        taken.append(writer.push(4, _event(4)))

    asyncio.run(batched_steps(run()))
    assert taken == [True, True, False, True]
    assert bodies == [_frame(1, _event(1)) + _frame(2, _event(2)), _frame(4, _event(4))]


@tool
def echo(text: str) -> str:
    """Say it back.

    Args:
        text: What to say.
    """
    return text


def _tools(config: AgentConfig) -> ToolExecutor:
    executor = ToolExecutor()
    executor.register(echo)
    return executor


async def test_over_http_a_runs_events_come_in_fewer_writes_than_events_in_order() -> None:
    store = InMemorySessionStore()
    model = ScriptedLLM(
        [reply("", tool_calls=[call("echo", text=f"step {n}")]) for n in range(5)] + [reply("done")]
    )
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx")),
        store=store,
        llm_factory=lambda config: model,
        tools_factory=_tools,
    )
    writes = BodyWrites(app, "/events")
    async with serving(writes) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        async with stream(client, f"/sessions/{sid}/events") as events:
            posted = await client.post(f"/sessions/{sid}/messages", json={"message": "go"})
            assert posted.status_code == 202, posted.text
            frames = await events.until("run_finished")
    ids = [int(frame.id) for frame in frames if frame.id is not None]
    stored = await store.events(sid)
    assert ids == list(range(ids[0], ids[0] + len(stored)))
    assert [frame.event for frame in frames] == [event.kind for event in stored]
    assert writes.count < len(frames)  # one write per event before step batches


def test_a_step_that_publishes_a_lot_writes_at_the_bound_and_then_meets_back_pressure() -> None:
    room = asyncio.Event()
    bodies: list[bytes] = []

    async def slow_send(message: dict[str, Any]) -> None:
        await room.wait()
        bodies.append(message["body"])

    writer = _Writer(slow_send)
    big = [TextDelta(run_id="r", seq=n, text="x" * 10_000) for n in range(20)]
    per_frame = len(_frame(0, big[0]))
    fit = -(-HELD_BYTES // per_frame)  # the frames up to and including the one at the bound
    taken: list[bool] = []

    async def run() -> None:
        taken.extend(writer.push(event.seq, event) for event in big)  # one step
        room.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(batched_steps(run()))
    assert taken == [True] * fit + [False] * (len(big) - fit)
    assert bodies == [b"".join(_frame(event.seq, event) for event in big[:fit])]


def test_a_flush_that_raises_is_logged_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flushed: list[str] = []

    async def run() -> str:
        batch = current()
        assert batch is not None
        batch.hold(lambda: flushed.append("first"))
        batch.hold(lambda: 1 / 0)  # type: ignore[func-returns-value]
        batch.hold(lambda: flushed.append("third"))
        await asyncio.sleep(0)
        return "finished"

    assert asyncio.run(batched_steps(run())) == "finished"
    assert flushed == ["first", "third"]
    assert "writing a step's events to a client failed" in caplog.text


class _Fatal(BaseException):
    """What no handler of `Exception` catches (a KeyboardInterrupt, say)."""


def test_every_flush_runs_even_when_one_raises_what_is_no_exception() -> None:
    from agent_flow.server._batching import StepBatch

    batch = StepBatch()
    flushed: list[str] = []

    def fatal() -> None:
        raise _Fatal

    batch.hold(lambda: flushed.append("first"))
    batch.hold(fatal)
    batch.hold(lambda: flushed.append("third"))
    with pytest.raises(_Fatal):
        batch.flush()
    assert flushed == ["first", "third"]
    batch.flush()  # started over: nothing is called twice
    assert flushed == ["first", "third"]


def test_a_write_cancelled_at_once_breaks_its_stream_not_the_run() -> None:
    async def cancelled_send(message: dict[str, Any]) -> None:
        raise asyncio.CancelledError  # before its first wait: in the publisher's step

    writer = _Writer(cancelled_send)

    async def run() -> str:
        writer.push(1, _event(1))
        await asyncio.sleep(0)  # the step ends: its write is cancelled
        assert writer.push(2, _event(2))  # taken and dropped: the stream is broken
        await asyncio.sleep(0)
        return "the run went on"

    async def scenario() -> None:
        assert await asyncio.create_task(batched_steps(run())) == "the run went on"
        with pytest.raises(RuntimeError, match="write was cancelled"):
            await writer.write(b"")  # the response's task ends the stream

    asyncio.run(scenario())


@tool
async def wait_a_little(text: str) -> str:
    """Wait a moment, then say it back (an async tool: its call gets a task of its own).

    Args:
        text: What to say.
    """
    await asyncio.sleep(0.001)
    return text


def _shape_tools(config: AgentConfig) -> ToolExecutor:
    executor = ToolExecutor()
    executor.register(echo)
    executor.register(wait_a_little)
    return executor


# A run: per model turn, the calls it makes (each to the sync or the async tool), then text.
_TURNS = st.lists(st.lists(st.sampled_from(["echo", "wait_a_little"]), max_size=3), max_size=4)


@settings(max_examples=12, deadline=None)
@given(turns=_TURNS, words=st.integers(1, 40), policies=st.lists(_POLICIES, min_size=1, max_size=3))
async def test_every_stream_gets_every_stored_event_once_in_order_whatever_the_runs_shape(
    turns: list[list[str]], words: int, policies: list[str]
) -> None:
    script = [
        reply(
            " ".join(["word"] * words),
            tool_calls=[call(name, text=f"{i}.{j}") for j, name in enumerate(names)],
        )
        for i, names in enumerate(turns)
    ]
    model = ScriptedLLM([*script, reply("done " * words)], chunk_size=3)
    store = InMemorySessionStore()
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx"), max_iterations=20),
        store=store,
        llm_factory=lambda config: model,
        tools_factory=_shape_tools,
    )
    async with serving(app) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        async with contextlib.AsyncExitStack() as streams:
            opened = [
                await streams.enter_async_context(
                    stream(client, f"/sessions/{sid}/events", policy=policy)
                )
                for policy in policies
            ]
            posted = await client.post(f"/sessions/{sid}/messages", json={"message": "go"})
            assert posted.status_code == 202, posted.text
            received = [await reading.until("run_finished") for reading in opened]
    stored = await store.events_with_ids(sid)
    expected = [(str(event_id), event.kind) for event_id, event in stored]
    for frames in received:
        assert [(frame.id, frame.event) for frame in frames] == expected
