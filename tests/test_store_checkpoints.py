"""The store's durable-run checkpoints, on every store (memory, SQLite, PostgreSQL).

A checkpoint is written with its step (`save_step`) or alone (`save_checkpoints`); either way
it is written whole or not at all, a position of a run is written once, and what is read back
(`checkpoints`) is exactly what was written, by position, from any store object.
"""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.environment import Environment
from agent_flow.errors import SessionNotFoundError, StoreError
from agent_flow.history import History
from agent_flow.sessions import Checkpoint, SessionStore
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.backing import Backing
from tests.store_helpers.fixtures import any_backing, backing, kind, store
from tests.store_helpers.session_writer import add_step

__all__ = ["any_backing", "backing", "kind", "store"]  # fixtures

COUNTER = ApproxCounter()


def fresh() -> tuple[History, Environment]:
    return History(counter=COUNTER), Environment(max_changes=5)


def marks(run: str, first: int, count: int) -> list[Checkpoint]:
    return [
        Checkpoint(run, p, f"step:{p}", f'{{"n":{p},"text":"é\\n"}}')
        for p in range(first, first + count)
    ]


async def test_checkpoints_saved_with_steps_or_alone_read_back_by_position(
    store: SessionStore,
) -> None:
    history, environment = fresh()
    info = await store.create()
    add_step(history, environment, 0)
    await store.save_step(
        info.id, history=history, environment=environment, checkpoints=marks("r1", 0, 2)
    )
    await store.save_checkpoints(info.id, marks("r1", 2, 1), synced=False)
    await store.save_checkpoints(info.id, marks("r2", 0, 1))  # another run of the session
    add_step(history, environment, 1)
    await store.save_step(
        info.id, history=history, environment=environment, checkpoints=marks("r1", 3, 2)
    )
    assert await store.checkpoints(info.id, "r1") == marks("r1", 0, 5)
    assert await store.checkpoints(info.id, "r2") == marks("r2", 0, 1)
    assert await store.checkpoints(info.id, "r3") == []
    await store.save_checkpoints(info.id, [])  # nothing to write is no write


async def test_a_position_is_written_once_and_a_refused_step_writes_nothing(
    store: SessionStore,
) -> None:
    history, environment = fresh()
    info = await store.create()
    await store.save_checkpoints(info.id, marks("r1", 0, 2))
    with pytest.raises(StoreError, match=r"already holds a checkpoint.*two executions of one run"):
        await store.save_checkpoints(info.id, marks("r1", 1, 2))
    add_step(history, environment, 0)
    events_before = await store.events(info.id)
    with pytest.raises(StoreError, match=r"already holds a checkpoint"):
        await store.save_step(
            info.id, history=history, environment=environment, checkpoints=marks("r1", 1, 1)
        )
    # The step's transaction was refused whole: no entry, no environment, no checkpoint.
    state = await store.load(info.id)
    assert (state.info.steps, state.entries, state.environment) == (0, (), None)
    assert await store.events(info.id) == events_before
    assert await store.checkpoints(info.id, "r1") == marks("r1", 0, 2)
    # The position is free in another run, and the step saves once its checkpoints are new.
    await store.save_step(
        info.id, history=history, environment=environment, checkpoints=marks("r1", 2, 1)
    )
    assert [c.position for c in await store.checkpoints(info.id, "r1")] == [0, 1, 2]


async def test_checkpoints_of_a_missing_session_and_of_a_deleted_one(store: SessionStore) -> None:
    with pytest.raises(SessionNotFoundError):
        await store.checkpoints("nowhere", "r1")
    with pytest.raises(SessionNotFoundError):
        await store.save_checkpoints("nowhere", marks("r1", 0, 1))
    info = await store.create(session_id="again")
    await store.save_checkpoints(info.id, marks("r1", 0, 3))
    await store.delete(info.id)
    await store.create(session_id="again")
    assert await store.checkpoints("again", "r1") == []
    await store.save_checkpoints("again", marks("r1", 0, 1))  # the positions are free again


async def test_checkpoints_are_not_part_of_an_export(store: SessionStore) -> None:
    history, environment = fresh()
    info = await store.create()
    add_step(history, environment, 0)
    await store.save_step(
        info.id, history=history, environment=environment, checkpoints=marks("r1", 0, 2)
    )
    out = io.StringIO()
    await store.export(info.id, out)
    assert "step:0" not in out.getvalue()
    imported = await store.import_(io.StringIO(out.getvalue()), session_id="copy")
    assert await store.checkpoints(imported.id, "r1") == []


async def test_two_store_objects_see_each_others_checkpoints(backing: Backing) -> None:
    async with backing.open() as first, backing.open() as second:
        info = await first.create()
        history, environment = fresh()
        add_step(history, environment, 0)
        await first.save_step(
            info.id, history=history, environment=environment, checkpoints=marks("r", 0, 2)
        )
        assert await second.checkpoints(info.id, "r") == marks("r", 0, 2)
        # Two executions of one run racing for the same positions: exactly one wins.
        outcomes = await asyncio.gather(
            first.save_checkpoints(info.id, marks("r", 2, 3)),
            second.save_checkpoints(info.id, marks("r", 2, 3)),
            return_exceptions=True,
        )
        assert sorted(type(o).__name__ for o in outcomes) == ["NoneType", "StoreError"]
        assert await first.checkpoints(info.id, "r") == marks("r", 0, 5)
        # Unsynced writes (no wait for the disk) are as visible, and as exclusive.
        await second.save_checkpoints(info.id, marks("r", 5, 1), synced=False)
        with pytest.raises(StoreError, match="already holds"):
            await first.save_checkpoints(info.id, marks("r", 5, 1), synced=False)
        assert await first.checkpoints(info.id, "r") == marks("r", 0, 6)
        with pytest.raises(SessionNotFoundError):
            await first.save_checkpoints("nowhere", marks("r", 0, 1), synced=False)


# Each write: (with a step?, how many checkpoints).
writes = st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=8)


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=writes, texts=st.lists(st.text(max_size=30), min_size=30, max_size=30))
def test_any_mix_of_writes_reads_back_exactly_from_another_store_object(
    any_backing: Backing, plan: list[tuple[bool, int]], texts: list[str]
) -> None:
    async def scenario() -> None:
        written: list[Checkpoint] = []
        async with any_backing.open() as store:
            info = await store.create()
            history, environment = fresh()
            for number, (with_step, count) in enumerate(plan):
                batch = [
                    Checkpoint(
                        "run", len(written) + i, f"n{number}", json.dumps(texts[len(written) + i])
                    )
                    for i in range(count)
                ]
                if with_step:
                    add_step(history, environment, number)
                    await store.save_step(
                        info.id, history=history, environment=environment, checkpoints=batch
                    )
                else:
                    await store.save_checkpoints(info.id, batch)
                written += batch
            if any_backing.kind == "memory":
                assert await store.checkpoints(info.id, "run") == written
                return
            async with any_backing.open() as other:
                assert await other.checkpoints(info.id, "run") == written

    asyncio.run(scenario())
