"""`LiveSession.watch`: batched and pushed delivery keep every watcher's ids contiguous and unique.

A watcher may join at any point of a run, resume after any id, and read while the run keeps
publishing; whatever the interleaving, it sees each id after its resume point exactly once, in
order, and no batch is larger than `BATCH`. With a `push` that takes some live events in the
publisher's task and declines others (a write still under way), the two ways together still
deliver one gap-free sequence. `start_eagerly` runs a write in the caller's task when it can
finish at once and hands the rest to a task when it cannot.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow._eager import start_eagerly
from agent_flow.events import TextDelta
from agent_flow.server._live import BATCH, LiveSession
from agent_flow.server.models import SessionOptions
from agent_flow.sessions import InMemorySessionStore


async def _live() -> LiveSession:
    store = InMemorySessionStore()
    await store.create(session_id="s")
    return LiveSession(id="s", options=SessionOptions(), store=store, approval_timeout=1.0)


async def _publish(live: LiveSession, seq: int) -> None:
    event = TextDelta(run_id="r", seq=seq, text=f"t{seq}")
    live.remember(event)
    await live.bus.publish(event)


async def _publish_all(live: LiveSession, seqs: range, pauses: list[bool]) -> None:
    """Publish `seqs`, yielding to the reader after each one whose place in `pauses` is set."""
    for seq in seqs:
        await _publish(live, seq)
        if pauses[seq % len(pauses)]:
            await asyncio.sleep(0)


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(min_value=1, max_value=2 * BATCH + 40),
    joined=st.data(),
    pauses=st.lists(st.booleans(), min_size=1, max_size=50),
)
def test_a_watcher_joining_anywhere_sees_each_later_id_once_in_order(
    total: int, joined: st.DataObject, pauses: list[bool]
) -> None:
    published_before = joined.draw(st.integers(min_value=0, max_value=total), label="joined at")
    after = joined.draw(st.integers(min_value=-1, max_value=published_before), label="after")

    async def scenario() -> tuple[list[int], list[int]]:
        live = await _live()
        live.bases["r"] = 0
        for seq in range(published_before):
            await _publish(live, seq)
        ids: list[int] = []
        sizes: list[int] = []

        async def read() -> None:
            async for batch in live.watch(after, policy="wait", maxsize=10_000, idle=5.0):
                sizes.append(len(batch))
                ids.extend(event_id for event_id, _ in batch if event_id is not None)
                if ids and ids[-1] == total - 1:
                    return

        reader = asyncio.create_task(read())
        await asyncio.sleep(0)
        await _publish_all(live, range(published_before, total), pauses)
        if after < total - 1:
            await asyncio.wait_for(reader, 5)
        else:
            reader.cancel()
        return ids, sizes

    ids, sizes = asyncio.run(scenario())
    assert ids == list(range(after + 1, total))
    assert all(0 < size <= BATCH for size in sizes)


def test_an_idle_watcher_gets_an_empty_batch_as_its_keep_alive_cue() -> None:
    async def scenario() -> list[int]:
        live = await _live()
        sizes: list[int] = []
        async for batch in live.watch(-1, policy="wait", maxsize=10, idle=0.01):
            sizes.append(len(batch))
            if len(sizes) == 2:
                break
        return sizes

    assert asyncio.run(scenario()) == [0, 0]


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(min_value=1, max_value=BATCH + 40),
    joined=st.data(),
    takes=st.lists(st.booleans(), min_size=1, max_size=50),
    pauses=st.lists(st.booleans(), min_size=1, max_size=50),
)
def test_pushed_and_batched_events_form_one_sequence_without_gap_or_duplicate(
    total: int, joined: st.DataObject, takes: list[bool], pauses: list[bool]
) -> None:
    published_before = joined.draw(st.integers(min_value=0, max_value=total), label="joined at")
    after = joined.draw(st.integers(min_value=-1, max_value=published_before), label="after")

    async def scenario() -> tuple[list[int], int]:
        live = await _live()
        live.bases["r"] = 0
        for seq in range(published_before):
            await _publish(live, seq)
        received: list[int] = []  # in the order the client would read them, either way
        complete = asyncio.Event()
        offers = 0
        reading = False  # the watcher's reader is sending a batch: pushes must wait

        def push(event_id: int | None, event: object) -> bool:
            nonlocal offers
            assert event_id is not None
            take = not reading and takes[offers % len(takes)]
            offers += 1
            if take:
                received.append(event_id)
                if event_id == total - 1:
                    complete.set()
            return take

        async def read() -> None:
            nonlocal reading
            async for batch in live.watch(
                after, policy="wait", maxsize=10_000, idle=5.0, push=push
            ):
                reading = True
                received.extend(event_id for event_id, _ in batch if event_id is not None)
                await asyncio.sleep(0)  # the write of the batch takes a turn of the loop
                reading = False
                if received and received[-1] == total - 1:
                    complete.set()

        reader = asyncio.create_task(read())
        await asyncio.sleep(0)
        await _publish_all(live, range(published_before, total), pauses)
        if after < total - 1:
            await asyncio.wait_for(complete.wait(), 5)
        reader.cancel()
        return received, offers

    received, _ = asyncio.run(scenario())
    assert received == list(range(after + 1, total))


def test_an_eager_write_that_need_not_wait_is_done_before_start_eagerly_returns() -> None:
    async def scenario() -> tuple[object, list[str]]:
        log: list[str] = []

        async def write() -> None:
            log.append("written")

        started = start_eagerly(write())
        log.append("returned")
        return started, log

    started, log = asyncio.run(scenario())
    assert isinstance(started, asyncio.Future) and started.done()
    assert log == ["written", "returned"]


def test_an_eager_write_that_waits_goes_on_in_a_task_and_can_be_cancelled() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        room, never = asyncio.Event(), asyncio.Event()

        async def write(name: str, drained: asyncio.Event) -> None:
            log.append(f"{name} started")
            try:
                await drained.wait()  # a transport paused for flow control
                await asyncio.sleep(0)
                log.append(f"{name} written")
            except asyncio.CancelledError:
                log.append(f"{name} cancelled")
                raise

        first = start_eagerly(write("first", room))
        second = start_eagerly(write("second", never))
        assert not first.done() and not second.done()
        log.append("returned")
        room.set()
        await first
        second.cancel()  # reaches the wait the write stopped at
        with pytest.raises(asyncio.CancelledError):
            await second
        return log

    assert asyncio.run(scenario()) == [
        "first started",
        "second started",
        "returned",
        "first written",
        "second cancelled",
    ]
