"""A session keeps the task it was created for, so one stopped before its first step resumes.

A process killed after the session was created but before its first step was saved used to
leave the task only in the (shortened) title, and the session resumed with an empty history.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import agent_flow.sessions._sqlite_schema as sqlite_schema
import agent_flow.sessions.sqlite as sqlite_module
from agent_flow import AgentConfig, AgentExecutor
from agent_flow.history import UserMessage
from agent_flow.llm.base import LLMRequest
from agent_flow.sessions import InMemorySessionStore, SessionStore, SQLiteSessionStore
from agent_flow.sessions.recorder import SessionRecorder
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM

TASK = "Rename every `fetch_user` to `load_user` in src/, " + "keeping the tests green. " * 8


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    opened: SessionStore = (
        SQLiteSessionStore(tmp_path / "s.db")
        if request.param == "sqlite"
        else InMemorySessionStore()
    )
    async with opened:
        yield opened


async def test_the_task_is_stored_whole_with_the_session_and_travels_with_it(
    store: SessionStore,
) -> None:
    info = await store.create(title="short", task=TASK)
    assert info.task == TASK
    assert (await store.info(info.id)).task == TASK
    assert (await store.load(info.id)).info.task == TASK
    assert [s.task for s in await store.list()] == [TASK]
    exported = io.StringIO()
    await store.export(info.id, exported)
    exported.seek(0)
    copy = await store.import_(exported, session_id="copy")
    assert copy.task == TASK
    assert (await store.create(session_id="plain")).task is None


async def test_a_store_file_from_before_the_task_column_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        sqlite_schema._create_v1(raw)
        raw.execute(
            "INSERT INTO sessions VALUES ('old', 'agent', 'old one', 'active', "
            "'2025-01-01T00:00:00.000000+00:00', '2025-01-01T00:00:00.000000+00:00', '{}', "
            "0, 0, 0, 0, NULL, 'r1')"
        )
        raw.execute("PRAGMA user_version = 1")
    async with SQLiteSessionStore(path) as store:
        await store.create(session_id="new", task="a new task")
        assert {s.id: s.task for s in await store.list()} == {"old": None, "new": "a new task"}
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (sqlite_module.SCHEMA_VERSION,)


async def test_a_session_stopped_before_its_first_step_resumes_with_its_task(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    called = asyncio.Event()
    never = asyncio.Event()

    async def hang(request: LLMRequest) -> Reply:
        called.set()  # the session exists; its first step is not saved yet
        await never.wait()
        return "unreachable"

    async with SQLiteSessionStore(db) as first:
        agent = AgentExecutor(FunctionLLM(hang), config=AgentConfig(), store=first)
        run = asyncio.create_task(agent.run(TASK))
        await called.wait()
        session_id = agent.session_id
        assert session_id is not None
        # What a process killed now leaves behind, read by another process's store: its
        # claim on the session expires (a dead process renews nothing).
        recorder = agent.recorder
        assert isinstance(recorder, SessionRecorder) and recorder.lease is not None
        await first.renew(recorder.lease, ttl=0)
        async with SQLiteSessionStore(db) as other:
            left = await other.load(session_id)
            assert left.entries == ()
            assert left.info.title != TASK  # shortened
            assert left.info.task == TASK
            llm = ScriptedLLM(["Renamed 12 call sites; the tests pass."])
            resumed = await AgentExecutor.resume(other, session_id, llm, config=AgentConfig())
            assert [type(e) for e in resumed.history.entries] == [UserMessage]
            assert resumed.history.entries[0].content == TASK  # type: ignore[union-attr]
            assert resumed.environment.task.objective == TASK
            outcome = await resumed.send("go on")
            assert outcome.final_text == "Renamed 12 call sites; the tests pass."
            sent = [m.content for m in llm.requests[0].messages if m.role == "user"]
            assert sent == [TASK, "go on"]
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
