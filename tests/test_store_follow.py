"""Following a session's events as they are saved (`wait_for_events`, `follow_events`).

Conformance rules for every store, and across store objects on the same data (what two
processes sharing a store see): a follower gets every saved event once, in the stored order,
with no gap, whoever saves it. On PostgreSQL the follower's re-read safety net is switched off
(`_follow_poll`), so only the NOTIFY of each save can wake it: a missing notification would
hang the test (bounded by its timeout) instead of passing slowly.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.environment import Environment
from agent_flow.errors import SessionNotFoundError, UserError
from agent_flow.events import AgentEvent, TextDelta
from agent_flow.history import History
from agent_flow.sessions import SessionStore
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.backing import Backing

COUNTER = ApproxCounter()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_backing(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backing]:
    made = Backing(typing.cast(str, request.param), tmp_path, prefix="af_follow")
    try:
        yield made
    finally:
        made.drop()


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backing]:
    made = Backing(typing.cast(str, request.param), tmp_path, prefix="af_follow")
    try:
        yield made
    finally:
        made.drop()


@pytest.fixture
async def store(any_backing: Backing) -> AsyncIterator[SessionStore]:
    async with any_backing.open() as made:
        yield made


def step_events(run: str, first: int, count: int) -> list[AgentEvent]:
    return [TextDelta(run_id=run, seq=first + i, text=f"{run}:{first + i}") for i in range(count)]


async def save(store: SessionStore, session_id: str, events: list[AgentEvent]) -> None:
    history, environment = History(counter=COUNTER), Environment()
    await store.save_step(session_id, history=history, environment=environment, events=events)


async def collect(store: SessionStore, session_id: str, offset: int, count: int) -> list[str]:
    texts: list[str] = []
    if count == 0:
        return texts
    async for event in store.follow_events(session_id, offset=offset):
        assert isinstance(event, TextDelta)
        texts.append(event.text)
        if len(texts) == count:
            break
    return texts


async def test_wait_for_events_returns_stored_events_at_once(store: SessionStore) -> None:
    info = await store.create()
    await save(store, info.id, step_events("r", 0, 3))
    events = await store.wait_for_events(info.id, offset=1, wait=30)
    assert [e.seq for e in events] == [1, 2]


async def test_wait_for_events_times_out_empty(store: SessionStore) -> None:
    info = await store.create()
    assert await store.wait_for_events(info.id, offset=0, wait=0.05) == []
    assert await store.wait_for_events(info.id, offset=0, wait=0) == []


async def test_wait_for_events_wakes_on_a_save(store: SessionStore) -> None:
    info = await store.create()
    waiting = asyncio.create_task(store.wait_for_events(info.id, wait=30))
    await asyncio.sleep(0.05)
    await save(store, info.id, step_events("r", 0, 2))
    events = await asyncio.wait_for(waiting, 10)
    assert [e.seq for e in events] == [0, 1]


async def test_bad_arguments_and_unknown_sessions_are_refused(store: SessionStore) -> None:
    info = await store.create()
    with pytest.raises(UserError, match="wait=-1"):
        await store.wait_for_events(info.id, wait=-1)
    with pytest.raises(UserError, match="offset"):
        await store.wait_for_events(info.id, offset=-1, wait=0)
    with pytest.raises(SessionNotFoundError):
        await store.wait_for_events("nope", wait=0)
    with pytest.raises(SessionNotFoundError):
        await anext(aiter(store.follow_events("nope")))


async def test_a_follower_on_another_store_object_sees_every_save(shared: Backing) -> None:
    async with shared.open() as writer, shared.open(notified_only=True) as follower:
        info = await writer.create()
        following = asyncio.create_task(collect(follower, info.id, 0, 12))
        for step in range(4):
            await save(writer, info.id, step_events(f"run{step % 2}", step * 3, 3))
            await asyncio.sleep(0.01)
        texts = await asyncio.wait_for(following, 20)
        stored = [typing.cast(TextDelta, e).text for e in await writer.events(info.id)]
        assert texts == stored and len(stored) == 12


# Each example creates its own session, so sharing the backing between examples is safe.
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    writers=st.integers(1, 3),
    start=st.integers(0, 5),
)
def test_followers_get_every_event_once_in_stored_order(
    shared: Backing, steps: list[int], writers: int, start: int
) -> None:
    """Writers (store objects) taking turns at one session; followers from any offset.

    (Writers racing for one session is the conflict rule, tested in the conformance suite.)
    """

    async def scenario() -> None:
        stores = [shared.open() for _ in range(writers)]
        follower = shared.open(notified_only=True)
        try:
            for made in [*stores, follower]:
                await made.__aenter__()
            info = await stores[0].create()
            total = sum(steps) * writers
            offset = min(start, total)
            followers = [
                asyncio.create_task(collect(follower, info.id, offset, total - offset))
                for _ in range(2)
            ]

            turn = asyncio.Lock()

            async def write(index: int) -> None:
                for step, count in enumerate(steps):
                    async with turn:
                        events = step_events(f"w{index}", step * 10, count)
                        await save(stores[index], info.id, events)
                    await asyncio.sleep(0)

            await asyncio.gather(*(write(index) for index in range(writers)))
            results = await asyncio.wait_for(asyncio.gather(*followers), 30)
            stored = [typing.cast(TextDelta, e).text for e in await follower.events(info.id)]
            assert len(stored) == total
            for texts in results:
                assert texts == stored[offset:]
        finally:
            for made in [*stores, follower]:
                await made.aclose()

    asyncio.run(scenario())
