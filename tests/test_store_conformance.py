"""The session-store conformance suite: one contract, run against every store.

In the style of LangGraph's checkpointer conformance tests: each test takes a `store` (memory,
SQLite, PostgreSQL) or a `backing` that opens several store objects on the same data (SQLite,
PostgreSQL: what two processes sharing a store see), and states one rule of the
`SessionStore` contract. Store-specific behavior (SQL traces, files, migrations) is tested in
tests/test_sessions.py and tests/test_sessions_postgres.py. More rules of the contract, each in
a module of its own with the same fixtures: owners (tests/test_store_owners.py), leases, fences
and event ids (tests/test_store_leases.py, tests/test_store_lease_machine.py), checkpoints
(tests/test_store_checkpoints.py) and following events (tests/test_store_follow.py).

The PostgreSQL cases use a fresh schema per test, dropped after; they skip when no server
answers (failing instead under ``CI=true``), see tests/store_helpers/postgres.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.environment import Environment
from agent_flow.errors import SessionConflictError, SessionNotFoundError, StoreError, UserError
from agent_flow.events import AgentEvent, RunFinished, TextDelta
from agent_flow.history import (
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    PruningStrategy,
)
from agent_flow.sessions import (
    EXPORT_LINE_ADAPTER,
    InMemorySessionStore,
    SessionStore,
)
from agent_flow.testing.strategies import entry_lists, pruning_strategies
from agent_flow.tokens import ApproxCounter
from tests.helpers import unit_groups
from tests.store_helpers.backing import Backing
from tests.store_helpers.fixtures import any_backing, backing, kind, store
from tests.store_helpers.session_writer import add_step
from tests.store_helpers.usage import Drawn, call_steps, expected_totals, step_events

__all__ = ["any_backing", "backing", "kind", "store"]  # fixtures

COUNTER = ApproxCounter()


def fresh() -> tuple[History, Environment]:
    return History(counter=COUNTER), Environment(max_changes=5)


# -- round trips ------------------------------------------------------------------------------


async def test_a_session_saved_in_memory_reads_back_as_fresh_objects(store: SessionStore) -> None:
    history, environment = fresh()
    info = await store.create()
    events = add_step(history, environment, 0)
    await store.save_step(info.id, history=history, environment=environment, events=events)
    state = await store.load(info.id)
    assert state.entries == tuple(history.entries)
    assert all(a is not b for a, b in zip(state.entries, history.entries, strict=True))
    assert state.environment is not None and state.environment is not environment
    assert state.environment.to_json() == environment.to_json()


async def test_a_new_session_has_no_environment_until_its_first_step(store: SessionStore) -> None:
    info = await store.create(session_id="fresh-1")
    assert (info.id, info.status, info.steps, info.entry_count) == ("fresh-1", "active", 0, 0)
    state = await store.load("fresh-1")
    assert state.entries == ()
    assert state.environment is None


async def test_a_summarized_history_reads_back_with_its_summary(store: SessionStore) -> None:
    history, environment = fresh()
    info = await store.create()
    for step in range(4):
        add_step(history, environment, step)
        await store.save_step(info.id, history=history, environment=environment)
    summary = await history.summarize(1, 9, ExtractiveSummarizer(counter=COUNTER))
    await store.save_step(info.id, history=history, environment=environment)
    state = await store.load(info.id)
    assert state.entries == tuple(history.entries)
    assert summary in state.entries


async def test_saving_another_history_object_stores_exactly_its_entries(
    store: SessionStore,
) -> None:
    history, environment = fresh()
    info = await store.create()
    for step in range(3):
        add_step(history, environment, step)
        await store.save_step(info.id, history=history, environment=environment)
    other, other_environment = fresh()
    add_step(other, other_environment, 7)
    saved = await store.save_step(info.id, history=other, environment=other_environment)
    state = await store.load(info.id)
    assert state.entries == tuple(other.entries)
    assert state.environment is not None
    assert state.environment.to_json() == other_environment.to_json()
    assert saved.environment_version == 2


async def _saved_session(store: SessionStore) -> tuple[str, History, Environment, list[AgentEvent]]:
    history, environment = fresh()
    info = await store.create(agent="coder", title="export me", metadata={"tags": ["a"]})
    events: list[AgentEvent] = []
    for step in range(3):
        step_events = add_step(history, environment, step)
        events += step_events
        await store.save_step(info.id, history=history, environment=environment, events=step_events)
    final = RunFinished(
        run_id="run-2",
        seq=2,
        stop_reason="completed",
        final_text="done",
        iterations=3,
        prompt_tokens=10,
        completion_tokens=5,
        duration_ms=2.5,
    )
    events.append(final)
    await store.save_step(
        info.id, history=history, environment=environment, events=[final], status="completed"
    )
    return info.id, history, environment, events


async def test_export_then_import_round_trips_a_session(
    store: SessionStore, tmp_path: Path
) -> None:
    session_id, history, environment, events = await _saved_session(store)
    target = tmp_path / "export.jsonl"
    await store.export(session_id, target)
    lines = [EXPORT_LINE_ADAPTER.validate_json(line) for line in target.read_text().splitlines()]
    assert [line.kind for line in lines] == (
        ["session"] + ["entry"] * len(history) + ["environment"] + ["event"] * len(events) + ["end"]
    )
    async with InMemorySessionStore() as other:
        imported = await other.import_(target)
        original = await store.info(session_id)
        assert imported == original
        state = await other.load(session_id)
        assert state.entries == tuple(history.entries)
        assert state.environment is not None
        assert state.environment.to_json() == environment.to_json()
        assert await other.events(session_id) == events
    # Into the same store, under another id, through a stream.
    stream = io.StringIO()
    await store.export(session_id, stream)
    stream.seek(0)
    copy = await store.import_(stream, session_id="copy")
    assert copy.id == "copy" and copy.status == "completed"
    assert (await store.load("copy")).entries == tuple(history.entries)
    again = io.StringIO()
    await store.export("copy", again)
    assert again.getvalue().splitlines()[1:] == stream.getvalue().splitlines()[1:]


async def test_import_refuses_a_partial_altered_or_foreign_file(
    store: SessionStore, tmp_path: Path
) -> None:
    session_id, _, _, _ = await _saved_session(store)
    stream = io.StringIO()
    await store.export(session_id, stream)
    lines = stream.getvalue().splitlines()

    async def refused(text: str, match: str) -> None:
        with pytest.raises(StoreError, match=match):
            await store.import_(io.StringIO(text), session_id="bad")

    await refused("\n".join(lines[:-1]), "no end line")
    await refused("\n".join(lines[:5]), "no end line")
    await refused("\n".join(lines[:3] + lines[4:]), "announces")
    await refused("\n".join([*lines[:2], "{not json", *lines[2:]]), "line 3 of")
    await refused("\n".join(lines[1:]), "starts with a 'entry' line")
    await refused("", "empty")
    # A tool result whose call was removed breaks the history's rules.
    call_line = next(i for i, line in enumerate(lines) if '"tool_call"' in line)
    end = json.loads(lines[-1])
    end["entries"] -= 1
    await refused(
        "\n".join(lines[:call_line] + lines[call_line + 1 : -1] + [json.dumps(end)]),
        "history in the stream is inconsistent",
    )
    with pytest.raises(StoreError, match="already stored"):
        await store.import_(io.StringIO(stream.getvalue()))
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(StoreError, match=r"missing\.jsonl"):
        await store.import_(missing)
    assert [s.id for s in await store.list()] == [session_id]


async def test_missing_sessions_raise_session_not_found(store: SessionStore) -> None:
    history, environment = fresh()
    calls: list[Callable[[], typing.Awaitable[object]]] = [
        lambda: store.load("nope"),
        lambda: store.info("nope"),
        lambda: store.events("nope"),
        lambda: store.delete("nope"),
        lambda: store.export("nope", io.StringIO()),
        lambda: store.save_step("nope", history=history, environment=environment),
    ]
    for call in calls:
        with pytest.raises(SessionNotFoundError, match="'nope'"):
            await call()


async def test_events_are_read_from_an_offset_or_within_one_run(store: SessionStore) -> None:
    history, environment = fresh()
    info = await store.create()
    for step in range(3):
        events = add_step(history, environment, step)
        await store.save_step(info.id, history=history, environment=environment, events=events)
    everything = await store.events(info.id)
    assert [(e.run_id, e.seq) for e in everything] == [
        (f"run-{step}", seq) for step in range(3) for seq in (0, 1)
    ]
    assert await store.events(info.id, offset=4) == everything[4:]
    assert await store.events(info.id, offset=1, limit=2) == everything[1:3]
    assert await store.events(info.id, run_id="run-1") == everything[2:4]
    assert await store.events(info.id, run_id="run-1", after_seq=0) == everything[3:4]
    assert await store.events(info.id, offset=9) == []
    with pytest.raises(UserError, match="after_seq"):
        await store.events(info.id, after_seq=0)
    with pytest.raises(UserError, match="negative"):
        await store.events(info.id, offset=-1)


async def test_sessions_are_listed_most_recently_updated_first(store: SessionStore) -> None:
    history, environment = fresh()
    first = await store.create(session_id="first")
    await store.create(session_id="second")
    await store.create(session_id="third")
    add_step(history, environment, 0)
    await store.save_step(first.id, history=history, environment=environment)
    assert [s.id for s in await store.list()] == ["first", "third", "second"]
    assert [s.id for s in await store.list(limit=2)] == ["first", "third"]
    with pytest.raises(UserError, match="limit=0"):
        await store.list(limit=0)


async def test_bad_ids_statuses_and_duplicates_are_refused(store: SessionStore) -> None:
    history, environment = fresh()
    for bad in ("", "has space", "-dash-first", "x" * 129, "slash/inside"):
        with pytest.raises(UserError, match="session id"):
            await store.create(session_id=bad)
    info = await store.create(session_id="taken")
    with pytest.raises(StoreError, match="'taken' is already stored"):
        await store.create(session_id="taken")
    with pytest.raises(UserError, match="'done' is not a session status"):
        await store.save_step(
            info.id,
            history=history,
            environment=environment,
            status="done",  # type: ignore[arg-type]
        )
    with pytest.raises(UserError, match="metadata"):
        await store.create(metadata={"x": object()})  # type: ignore[dict-item]


async def test_a_closed_store_refuses_further_calls(store: SessionStore) -> None:
    await store.create(session_id="s")
    await store.aclose()
    await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await store.list()


async def test_events_published_with_a_step_keep_their_types(store: SessionStore) -> None:
    info = await store.create()
    history, environment = fresh()
    events: list[AgentEvent] = [TextDelta(run_id="r", seq=0, text="héllo\nworld")]
    await store.save_step(info.id, history=history, environment=environment, events=events)
    assert await store.events(info.id) == events


# -- several store objects on the same data (what several processes see) ---------------------


# Each example creates its own session (a new random id), so sharing the backing is safe.
@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=entry_lists(max_units=10),
    cuts=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    prunes=st.lists(
        st.none() | st.tuples(pruning_strategies(), st.integers(0, 100)), min_size=4, max_size=4
    ),
    max_changes=st.integers(0, 4),
)
def test_any_sequence_of_steps_reads_back_exactly_from_another_store_object(
    backing: Backing,
    entries: list[HistoryEntry],
    cuts: list[int],
    prunes: list[tuple[PruningStrategy, int] | None],  # strategy, budget in % of the tokens
    max_changes: int,
) -> None:
    async def scenario() -> None:
        history = History(counter=COUNTER)
        environment = Environment(max_changes=max_changes)
        async with backing.open() as writer, backing.open() as reader:
            info = await writer.create()
            for step, group in enumerate(unit_groups(entries, cuts, COUNTER)):
                history.extend(group)
                prune = prunes[step % len(prunes)]
                if prune is not None:
                    strategy, percent = prune
                    history.prune(strategy, history.token_count() * percent // 100)
                environment.set(f"/extensions/step{step % 3}", step)
                await writer.save_step(info.id, history=history, environment=environment)
                state = await reader.load(info.id)
                assert state.entries == tuple(history.entries)
                assert state.environment is not None
                assert state.environment.to_json() == environment.to_json()
                assert state.info.entry_count == len(history)
                assert state.info.steps == step + 1

    asyncio.run(scenario())


async def test_two_store_objects_read_and_write_one_session_alternately(backing: Backing) -> None:
    history, environment = fresh()
    async with backing.open() as writer, backing.open() as reader:
        info = await writer.create(title="shared")
        for step in range(3):
            events = add_step(history, environment, step)
            await writer.save_step(info.id, history=history, environment=environment, events=events)
            seen = await reader.info(info.id)
            assert (seen.steps, seen.entry_count) == (step + 1, len(history))
            assert [s.id for s in await reader.list()] == [info.id]
            assert len(await reader.events(info.id)) == 2 * (step + 1)
        # The reader becomes a writer of the same session...
        state = await reader.load(info.id)
        assert state.environment is not None
        theirs = state.history(counter=COUNTER)
        add_step(theirs, state.environment, 100)
        await reader.save_step(info.id, history=theirs, environment=state.environment)
        # ...and the first writer, unaware, saves its own next step: it notices the session
        # changed, compares with what is stored and leaves exactly its own view, whole.
        add_step(history, environment, 3)
        saved = await writer.save_step(info.id, history=history, environment=environment)
        assert saved.steps == 5
        final = await reader.load(info.id)
        assert final.entries == tuple(history.entries)
        assert final.environment is not None
        assert final.environment.to_json() == environment.to_json()


async def test_concurrent_writers_of_one_session_never_mix_their_steps(backing: Backing) -> None:
    rounds = 6
    async with backing.open() as first, backing.open() as second:
        info = await first.create()
        # What each successful save left stored, by the step count it returned.
        committed: dict[int, tuple[tuple[HistoryEntry, ...], str]] = {}
        conflicts: list[str] = []

        async def write(store: SessionStore, name: str) -> None:
            history, environment = fresh()
            for step in range(rounds):
                events = add_step(history, environment, step)
                environment.set("/extensions/writer", name)
                try:
                    saved = await store.save_step(
                        info.id, history=history, environment=environment, events=events
                    )
                except SessionConflictError:
                    # It lost the race every time it tried: it stops, as a process would.
                    conflicts.append(name)
                    return
                committed[saved.steps] = (tuple(history.entries), environment.to_json())

        await asyncio.gather(write(first, "a"), write(second, "b"))
        async with backing.open() as reader:
            state = await reader.load(info.id)
            assert state.environment is not None
            # Every successful step was applied whole, its events appended once...
            assert state.info.steps == len(committed) == max(committed)
            assert len(committed) >= rounds  # the writer that never lost finished
            assert len(conflicts) <= 1
            assert len(await reader.events(info.id)) == state.info.event_count == 2 * len(committed)
            # ...and the session is exactly the last committed step, never a mixture.
            entries, environment_json = committed[state.info.steps]
            assert state.entries == entries
            assert state.environment.to_json() == environment_json
            assert state.info.entry_count == len(entries)


async def test_a_writer_that_keeps_losing_the_race_gets_a_conflict_error(
    backing: Backing,
) -> None:
    async with backing.open() as loser, backing.open() as winner:
        info = await loser.create()
        mine, my_environment = fresh()
        theirs, their_environment = fresh()
        add_step(mine, my_environment, 0)
        await loser.save_step(info.id, history=mine, environment=my_environment)
        backend = loser._backend  # type: ignore[attr-defined]
        real_write = backend.write_step
        raced = 0

        async def write_after_the_winner(write: typing.Any) -> typing.Any:
            # Another process commits a step just before each of this store's attempts.
            nonlocal raced
            raced += 1
            add_step(theirs, their_environment, raced)
            await winner.save_step(info.id, history=theirs, environment=their_environment)
            return await real_write(write)

        backend.write_step = write_after_the_winner
        add_step(mine, my_environment, 1)
        with pytest.raises(SessionConflictError, match="changed under every one") as caught:
            await loser.save_step(info.id, history=mine, environment=my_environment)
        assert isinstance(caught.value, StoreError)
        # Nothing half written: the session is the winner's last step, whole.
        state = await winner.load(info.id)
        assert state.entries == tuple(theirs.entries)
        assert state.environment is not None
        assert state.environment.to_json() == their_environment.to_json()
        assert state.info.steps == 1 + raced


async def test_saves_of_different_sessions_by_one_store_do_not_wait_for_each_other(
    store: SessionStore,
) -> None:
    first, second = await store.create(), await store.create()
    backend = store._backend  # type: ignore[attr-defined]
    real_write = backend.write_step
    second_entered = asyncio.Event()

    async def write(step: typing.Any) -> typing.Any:
        if step.session_id == first.id:
            # The first session's save holds its turn until the second's save has begun.
            await second_entered.wait()
        else:
            second_entered.set()
        return await real_write(step)

    backend.write_step = write
    (h1, e1), (h2, e2) = fresh(), fresh()
    add_step(h1, e1, 0)
    add_step(h2, e2, 0)
    saved = await asyncio.gather(
        store.save_step(first.id, history=h1, environment=e1),
        store.save_step(second.id, history=h2, environment=e2),
    )
    assert [info.steps for info in saved] == [1, 1]


async def test_a_deleted_session_leaves_nothing_behind_for_a_new_one_of_that_id(
    store: SessionStore,
) -> None:
    history, environment = fresh()
    gone = await store.create(session_id="gone")
    kept = await store.create(session_id="kept")
    for sid in (gone.id, kept.id):
        events = add_step(history, environment, 0)
        await store.save_step(sid, history=history, environment=environment, events=events)
    await store.delete(gone.id)
    with pytest.raises(SessionNotFoundError):
        await store.load(gone.id)
    assert (await store.load(kept.id)).entries == tuple(history.entries)
    recreated = await store.create(session_id="gone")
    assert recreated.entry_count == 0
    state = await store.load("gone")
    assert (state.entries, state.environment) == ((), None)
    assert await store.events("gone") == []


# -- usage and cost totals --------------------------------------------------------------------


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=call_steps)
def test_session_totals_are_the_sum_over_its_stored_model_calls(
    any_backing: Backing, steps: list[list[Drawn]]
) -> None:
    async def scenario() -> None:
        history, environment = fresh()
        async with any_backing.open() as store:
            info = await store.create()
            for number, drawn in enumerate(steps):
                add_step(history, environment, number)
                events = step_events(drawn, f"run-{number % 2}", first_seq=number * 10)
                saved = await store.save_step(
                    info.id, history=history, environment=environment, events=events
                )
                expected = expected_totals(await store.events(info.id))
                assert saved.model_dump(include=set(expected)) == expected
                # What a reader finds is what the step returned; an import recomputes the same.
                assert await store.info(info.id) == saved
                assert (await store.list())[0] == saved
            stream = io.StringIO()
            await store.export(info.id, stream)
            stream.seek(0)
            copy = await store.import_(stream, session_id=f"copy-{info.id}")
            assert copy.model_dump(include=set(expected)) == expected
        if any_backing.kind != "memory":
            async with any_backing.open() as reader:
                assert await reader.info(info.id) == saved

    asyncio.run(scenario())


async def test_one_unpriced_call_makes_the_session_cost_unknown_for_good(
    store: SessionStore,
) -> None:
    history, environment = fresh()
    info = await store.create()
    costs = [0.25, None, 0.5]
    for number, cost in enumerate(costs):
        add_step(history, environment, number)
        events = step_events([(10, 2, cost, "summarizer", False)], f"run-{number}")
        info = await store.save_step(
            info.id, history=history, environment=environment, events=events
        )
        known = number == 0
        assert info.cost_usd == (0.25 if known else None)
        assert info.unpriced_calls == (0 if known else 1)
    assert (info.model_calls, info.prompt_tokens, info.completion_tokens) == (3, 30, 6)
    assert (await store.create(session_id="idle")).cost_usd == 0.0
