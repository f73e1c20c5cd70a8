"""The SQLite and memory stores: round trips, what a step writes, several stores and processes,
failures (see tests/test_sessions_file.py for the file and its schema)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import sys
import tempfile
import threading
import typing
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.environment import Environment
from agent_flow.errors import PointerError, StoreError
from agent_flow.events import AgentEvent
from agent_flow.history import (
    DropOldest,
    ElideToolResults,
    History,
    HistoryEntry,
    PruningStrategy,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.sessions import (
    InMemorySessionStore,
    SessionState,
    SessionStore,
    SQLiteSessionStore,
)
from agent_flow.testing.strategies import entry_lists, pointer_writes, pruning_strategies
from agent_flow.tokens import ApproxCounter
from tests.helpers import unit_groups
from tests.store_helpers import session_writer
from tests.store_helpers.session_writer import add_step
from tests.store_helpers.trace import Trace

COUNTER = ApproxCounter()
WRITER = Path(session_writer.__file__)


def fresh() -> tuple[History, Environment]:
    return History(counter=COUNTER), Environment(max_changes=5)


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    made: SessionStore = (
        SQLiteSessionStore(tmp_path / "sessions.db", synchronous="normal")
        if request.param == "sqlite"
        else InMemorySessionStore()
    )
    async with made:
        yield made


def count(statements: list[str], prefix: str) -> int:
    return sum(s.startswith(prefix) for s in statements)


def assert_consistent(entries: typing.Sequence[HistoryEntry]) -> History:
    history = History(entries, counter=COUNTER)
    assert history.pending_calls() == []
    calls = {e.call_id for e in entries if isinstance(e, ToolCallEntry)}
    results = {e.call_id for e in entries if isinstance(e, ToolResultEntry)}
    assert calls == results
    return history


# -- round trips ------------------------------------------------------------------------------


async def test_a_multi_step_session_reads_back_identically_from_a_new_store_object(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    history, environment = fresh()
    events: list[AgentEvent] = []
    async with SQLiteSessionStore(path) as writer:
        info = await writer.create(agent="coder", title="fix the parser", metadata={"k": [1]})
        for step in range(4):
            step_events = add_step(history, environment, step)
            events += step_events
            saved = await writer.save_step(
                info.id, history=history, environment=environment, events=step_events
            )
            assert saved.steps == step + 1
    async with SQLiteSessionStore(path) as reader:
        state = await reader.load(info.id)
        assert state.entries == tuple(history.entries)
        assert state.environment is not None
        assert state.environment.to_json() == environment.to_json()
        assert await reader.events(info.id) == events
        assert state.info == saved
        assert (state.info.agent, state.info.title, state.info.metadata) == (
            "coder",
            "fix the parser",
            {"k": [1]},
        )
        assert state.info.entry_count == len(history) == 16
        assert state.info.event_count == 8
        assert state.info.environment_version == environment.version == 8
        rebuilt = state.history(counter=COUNTER)
        assert rebuilt.to_messages() == history.to_messages()


async def test_a_loaded_session_resumes_with_a_new_message_and_writes_only_that(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    history, environment = fresh()
    async with SQLiteSessionStore(path) as first:
        info = await first.create()
        for step in range(3):
            add_step(history, environment, step)
            await first.save_step(info.id, history=history, environment=environment)
    trace = Trace()
    async with SQLiteSessionStore(path, trace=trace) as second:
        state = await second.load(info.id)
        assert state.environment is not None
        resumed = state.history(counter=COUNTER)
        resumed.add(UserMessage(content="and now the tests"))
        state.environment.set("/task/objective", "run the tests")
        trace.take()
        after = await second.save_step(
            info.id, history=resumed, environment=state.environment, status="completed"
        )
        written = trace.take()
        assert count(written, "INSERT INTO entries") == 1
        assert count(written, "DELETE FROM entries") == 0
        assert count(written, "INSERT INTO environment_changes") == 1
        # Only the trim of changes that fell out of max_changes=5, never a reset of the log.
        deletes = [s for s in written if s.startswith("DELETE FROM environment_changes")]
        assert all("version <=" in s for s in deletes)
        assert (after.steps, after.status, after.entry_count) == (4, "completed", 13)
        reloaded = await second.load(info.id)
        assert reloaded.entries == tuple(resumed.entries)
        assert reloaded.entries[-1] == UserMessage(
            id=resumed.entries[-1].id,
            timestamp=resumed.entries[-1].timestamp,
            content="and now the tests",
        )


# -- cost of a step ---------------------------------------------------------------------------


async def test_a_step_writes_only_what_is_new_whatever_the_history_length(
    tmp_path: Path,
) -> None:
    trace = Trace()
    history, environment = History(counter=COUNTER), Environment()
    async with SQLiteSessionStore(tmp_path / "sessions.db", trace=trace) as store:
        info = await store.create()
        per_step: list[list[str]] = []
        for step in range(30):
            events = add_step(history, environment, step)
            trace.take()
            await store.save_step(info.id, history=history, environment=environment, events=events)
            per_step.append(trace.take())
        for statements in per_step[1:]:
            assert count(statements, "INSERT INTO entries") == 4
            assert count(statements, "INSERT INTO environment_changes") == 2
            assert count(statements, "INSERT INTO events") == 2
            assert not any(s.startswith("DELETE") for s in statements)
            # Nothing already stored is read back.
            assert not any("FROM entries" in s or "FROM events" in s for s in statements)
        assert len(per_step[1]) == len(per_step[-1])
        # The stored environment snapshot carries no change log: its size does not grow with
        # the number of changes made.
        update = next(s for s in per_step[-1] if s.startswith("UPDATE sessions"))
        assert update.count("fact ") == 30
        assert '"changes"' not in update


async def test_a_step_that_leaves_the_environment_alone_writes_none_of_it(tmp_path: Path) -> None:
    trace = Trace()
    history, environment = fresh()
    async with SQLiteSessionStore(tmp_path / "sessions.db", trace=trace) as store:
        info = await store.create()
        add_step(history, environment, 0)
        await store.save_step(info.id, history=history, environment=environment)
        history.add(UserMessage(content="more"))
        trace.take()
        saved = await store.save_step(info.id, history=history, environment=environment)
        statements = trace.take()
        assert not any("environment_changes" in s for s in statements)
        assert saved.environment_version == environment.version == 2


@pytest.mark.parametrize(
    "strategy",
    [DropOldest(), ElideToolResults(keep_last=0)],
    ids=["drop-oldest", "elide-results"],
)
async def test_a_pruned_history_is_rewritten_from_its_first_changed_entry(
    tmp_path: Path, strategy: PruningStrategy
) -> None:
    trace = Trace()
    history, environment = fresh()
    path = tmp_path / "sessions.db"
    async with SQLiteSessionStore(path, trace=trace) as store:
        info = await store.create()
        for step in range(4):
            add_step(history, environment, step)
            await store.save_step(info.id, history=history, environment=environment)
        before = tuple(history.entries)
        history.prune(strategy, history.token_count() // 2)
        first_change = next(
            i for i, (a, b) in enumerate(zip(history.entries, before, strict=False)) if a is not b
        )
        trace.take()
        saved = await store.save_step(info.id, history=history, environment=environment)
        statements = trace.take()
        assert count(statements, "DELETE FROM entries") == 1
        assert count(statements, "INSERT INTO entries") == len(history) - first_change
        assert saved.entry_count == len(history)
        # The next step is cheap again.
        add_step(history, environment, 4)
        await store.save_step(info.id, history=history, environment=environment)
        statements = trace.take()
        assert count(statements, "DELETE FROM entries") == 0
        assert count(statements, "INSERT INTO entries") == 4
    async with SQLiteSessionStore(path) as reader:
        state = await reader.load(info.id)
        assert state.entries == tuple(history.entries)
        assert_consistent(state.entries)


async def test_the_stored_change_log_is_trimmed_to_the_environments_limit(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    history, environment = History(counter=COUNTER), Environment(max_changes=3)
    async with SQLiteSessionStore(path) as store:
        info = await store.create()
        for step in range(5):
            add_step(history, environment, step)
            await store.save_step(info.id, history=history, environment=environment)
        state = await store.load(info.id)
    assert state.environment is not None
    assert state.environment.to_json() == environment.to_json()
    with sqlite3.connect(path) as raw:
        versions = [v for (v,) in raw.execute("SELECT version FROM environment_changes")]
    raw.close()
    assert sorted(versions) == [8, 9, 10]


@settings(max_examples=30)
@given(
    entries=entry_lists(max_units=12),
    cuts=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    prunes=st.lists(
        st.none() | st.tuples(pruning_strategies(), st.integers(0, 100)), min_size=6, max_size=6
    ),
    writes=st.lists(st.lists(pointer_writes(), max_size=3), min_size=6, max_size=6),
    max_changes=st.integers(0, 4),
)
def test_any_sequence_of_steps_pruning_and_environment_writes_reads_back_exactly(
    entries: list[HistoryEntry],
    cuts: list[int],
    prunes: list[tuple[PruningStrategy, int] | None],  # strategy, budget in % of the tokens
    writes: list[list[tuple[str, typing.Any]]],
    max_changes: int,
) -> None:
    async def scenario(path: Path) -> None:
        history = History(counter=COUNTER)
        environment = Environment(max_changes=max_changes)
        async with (
            SQLiteSessionStore(path, synchronous="normal") as writer,
            SQLiteSessionStore(path, synchronous="normal") as reader,
            InMemorySessionStore() as memory,
        ):
            info = await writer.create(session_id="s")
            await memory.create(session_id="s")
            for step, group in enumerate(unit_groups(entries, cuts, COUNTER)):
                history.extend(group)
                prune = prunes[step % len(prunes)]
                if prune is not None:
                    strategy, percent = prune
                    history.prune(strategy, history.token_count() * percent // 100)
                for pointer, value in writes[step % len(writes)]:
                    # A drawn path may run into an earlier scalar; such a write is refused.
                    with contextlib.suppress(PointerError):
                        environment.set(pointer, value)
                await writer.save_step(info.id, history=history, environment=environment)
                await memory.save_step(info.id, history=history, environment=environment)
                state = await reader.load(info.id)
                assert state.entries == tuple(history.entries)
                assert state.environment is not None
                assert state.environment.to_json() == environment.to_json()
                assert state.info.entry_count == len(history)
            state = await memory.load(info.id)
            assert state.entries == tuple(history.entries)
            assert state.environment is not None
            assert state.environment.to_json() == environment.to_json()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder) / "sessions.db"))


# -- several stores, processes and failures ----------------------------------------------------


async def test_readers_go_on_while_another_connection_holds_the_write_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    history, environment = fresh()
    async with (
        SQLiteSessionStore(path, busy_timeout=0.05) as writer,
        SQLiteSessionStore(path) as reader,
    ):
        info = await writer.create()
        add_step(history, environment, 0)
        await writer.save_step(info.id, history=history, environment=environment)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            state = await reader.load(info.id)
            assert state.entries == tuple(history.entries)
            assert len(await reader.list()) == 1
            add_step(history, environment, 1)
            with pytest.raises(StoreError, match="write lock"):
                await writer.save_step(info.id, history=history, environment=environment)
            other.execute("ROLLBACK")
        finally:
            other.close()
        saved = await writer.save_step(info.id, history=history, environment=environment)
        assert saved.steps == 2
        assert (await reader.load(info.id)).entries == tuple(history.entries)


async def test_a_save_cancelled_while_it_commits_is_reconciled_by_the_next_save(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    waiting = threading.Event()

    def trace(statement: str) -> None:
        if statement == "BEGIN IMMEDIATE":
            waiting.set()

    history, environment = fresh()
    async with SQLiteSessionStore(path, trace=trace, busy_timeout=30) as store:
        info = await store.create()
        add_step(history, environment, 0)
        await store.save_step(info.id, history=history, environment=environment)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        waiting.clear()
        add_step(history, environment, 1)
        task = asyncio.create_task(
            store.save_step(info.id, history=history, environment=environment)
        )
        assert await asyncio.to_thread(waiting.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The cancelled save still commits once the lock is free; the store does not know.
        other.execute("ROLLBACK")
        other.close()
        add_step(history, environment, 2)
        saved = await store.save_step(info.id, history=history, environment=environment)
        assert (saved.steps, saved.entry_count) == (3, len(history))
    async with SQLiteSessionStore(path) as reader:
        state = await reader.load(info.id)
        assert state.entries == tuple(history.entries)
        assert state.environment is not None
        assert state.environment.to_json() == environment.to_json()


async def _start_writer(path: Path, session_id: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(WRITER),
        str(path),
        session_id,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _read_until(process: asyncio.subprocess.Process, done: Callable[[str], bool]) -> int:
    """Read the writer's lines until `done(line)`; return the last step count it reported."""
    assert process.stdout is not None and process.stderr is not None
    reported = 0
    async with asyncio.timeout(60):
        while True:
            line = (await process.stdout.readline()).decode().strip()
            if not line:
                error = (await process.stderr.read()).decode()
                pytest.fail(f"the writer stopped after {reported} steps:\n{error}")
            if line.startswith("saved "):
                reported = int(line.split()[1])
            if done(line):
                return reported


async def _kill(process: asyncio.subprocess.Process) -> None:
    process.send_signal(signal.SIGKILL)
    await process.wait()
    assert process.returncode == -signal.SIGKILL


def _check_session(state: SessionState) -> None:
    steps = state.info.steps
    history = assert_consistent(state.entries)
    last_user = history.entries[-4]
    assert isinstance(last_user, UserMessage) and last_user.content == f"step {steps - 1}"
    environment = state.environment
    assert environment is not None
    assert environment.get("/extensions/progress") == {"step": steps - 1}
    assert environment.version == state.info.environment_version == 2 * steps
    assert [c.version for c in environment.changes()] == list(
        range(2 * steps - session_writer.MAX_CHANGES + 1, 2 * steps + 1)
    )
    assert state.info.entry_count == len(history)
    assert state.info.event_count == 2 * steps


async def test_a_writer_killed_with_sigkill_loses_at_most_the_step_in_flight(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    async with SQLiteSessionStore(path) as store:
        info = await store.create(session_id="killed")
    # Killed wherever it happens to be, some time after its 12th step.
    process = await _start_writer(path, info.id)
    try:
        reported = await _read_until(process, lambda line: line == "saved 12")
    finally:
        await _kill(process)
    async with SQLiteSessionStore(path) as reopened:
        state = await reopened.load(info.id)
        assert state.info.steps >= reported
        _check_session(state)
    # Resumed by a new process, which is killed inside the transaction of a step that prunes
    # (and so rewrites entries): exactly that step is lost.
    in_flight = (state.info.steps // 5 + 1) * 5 + 4  # a pruning step, a few steps on
    process = await _start_writer(path, info.id, str(in_flight))
    try:
        reported = await _read_until(process, lambda line: line == "inside")
    finally:
        await _kill(process)
    assert reported == in_flight
    async with SQLiteSessionStore(path) as reopened:
        state = await reopened.load(info.id)
        assert state.info.steps == in_flight
        _check_session(state)
        events = await reopened.events(info.id)
        assert [e.run_id for e in events[-2:]] == [f"run-{in_flight - 1}"] * 2
    # The store is still writable, by a new store object.
    async with SQLiteSessionStore(path) as store:
        state = await store.load(info.id)
        assert state.environment is not None
        history = state.history(counter=COUNTER)
        events = add_step(history, state.environment, state.info.steps)
        saved = await store.save_step(
            info.id, history=history, environment=state.environment, events=events
        )
        assert saved.steps == in_flight + 1
        _check_session(await store.load(info.id))
