"""What a store keeps of a session between saves lives only as long as its writer's history.

A store remembers what it last saved of each session, so that the next save of the same
history appends only what is new. That memory goes when the history goes (an agent closed, a
server's session evicted): a server that served 10,000 sessions does not keep 10,000
histories. The next save, from a history loaded again, still stores exactly the session.
"""

from __future__ import annotations

import gc
from pathlib import Path

from agent_flow.environment import Environment
from agent_flow.history import History
from agent_flow.sessions import SQLiteSessionStore
from tests.store_helpers.session_writer import add_step


async def test_a_sessions_tracking_goes_with_its_history_and_saves_stay_exact(
    tmp_path: Path,
) -> None:
    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        info = await store.create()
        history, environment = History(), Environment()
        for step in range(3):
            events = add_step(history, environment, step)
            await store.save_step(info.id, history=history, environment=environment, events=events)
        assert info.id in store._tracked
        del history, environment
        gc.collect()
        gc.collect()
        assert info.id not in store._tracked
        # A writer that loads the session again goes on from exactly what is stored.
        state = await store.load(info.id)
        history = History()
        for entry in state.entries:
            history.add(entry)
        environment = state.environment or Environment()
        events = add_step(history, environment, 3)
        await store.save_step(info.id, history=history, environment=environment, events=events)
        again = await store.load(info.id)
        assert [e.id for e in again.entries] == [e.id for e in history.entries]
        assert len(await store.events(info.id)) == 8


async def test_a_load_that_is_only_looked_at_keeps_nothing(tmp_path: Path) -> None:
    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        info = await store.create()
        history, environment = History(), Environment()
        events = add_step(history, environment, 0)
        await store.save_step(info.id, history=history, environment=environment, events=events)
        del history, environment
        gc.collect()
        gc.collect()
        state = await store.load(info.id)  # GET /sessions/{id}, say: a reader, no writer
        assert info.id in store._tracked  # for a writer that resumes from it
        del state
        gc.collect()
        gc.collect()
        assert info.id not in store._tracked
