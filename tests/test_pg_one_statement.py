"""The PostgreSQL store's one-statement writes: taken when they can be, never different.

A step under a lease whose session is as the store's last write left it (`_pg_step`), and
the usual claim, renewal and release (`_pg_lease`), are one statement each; everything else
goes the careful way (a transaction that locks the row and reads it). Two worlds, each two
stores on one session (two processes), run the same random operations: one with the
one-statement writes, one without. Every answer (lease, error) and the stored session after
every operation must be the same: the statement applies exactly where the careful way would
have written the same thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg import sql

import agent_flow.sessions._pg_lease as pg_lease
import agent_flow.sessions.postgres as postgres_module
from agent_flow.environment import Environment
from agent_flow.errors import LeaseLostError
from agent_flow.events import TextDelta
from agent_flow.history import History, UserMessage
from agent_flow.sessions import Checkpoint, Lease, PostgresSessionStore, SessionInfo
from agent_flow.sessions._pg_step import LastWrites
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.postgres import URL, drop_schema, require_postgres
from tests.store_helpers.usage import Drawn, drawn_calls, step_events

_T = TypeVar("_T")

COUNTER = ApproxCounter()
LIVE = 3600.0
WRITERS = ("a", "b")


@pytest.fixture
def schemas() -> Iterator[list[str]]:
    """Two schemas no other test uses, dropped after the test."""
    require_postgres()
    names = [f"af_test_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        yield names
    finally:
        for name in names:
            drop_schema(name)


def _store(schema: str, *, one_statement: bool) -> PostgresSessionStore:
    store = PostgresSessionStore(URL, schema=schema)
    store._backend._one_statement = one_statement  # type: ignore[attr-defined]
    return store


class _Writer:
    """One process writing the session: its store, its history and environment, its lease."""

    def __init__(self, store: PostgresSessionStore) -> None:
        self.store = store
        self.history = History(counter=COUNTER)
        self.environment = Environment()
        self.lease: Lease | None = None


async def _outcome(work: Coroutine[Any, Any, _T]) -> tuple[str, _T | None]:
    try:
        return "ok", await work
    except Exception as err:
        return type(err).__name__, None


async def _snapshot(
    store: PostgresSessionStore, session_id: str, runs: list[str]
) -> tuple[object, ...]:
    info = await store.info(session_id)
    events = await store.events_with_ids(session_id)
    state = await store.load(session_id)
    checkpoints = [c for run in runs for c in await store.checkpoints(session_id, run)]
    return (
        info.model_dump(exclude={"created_at", "updated_at"}),
        [(number, e.kind, e.run_id, e.seq) for number, e in events],
        [(e.kind, getattr(e, "content", None)) for e in state.entries],
        None if state.environment is None else state.environment.get("/extensions"),
        checkpoints,
    )


def one_statement_machine(schemas: list[str]) -> type[RuleBasedStateMachine]:
    class OneStatementMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.runner = asyncio.Runner()
            self.worlds: dict[bool, dict[str, _Writer]] = {
                quick: {name: _Writer(_store(schema, one_statement=quick)) for name in WRITERS}
                for quick, schema in zip((True, False), schemas, strict=True)
            }
            self.session_id = f"s-{uuid.uuid4().hex[:8]}"
            self.runs = itertools.count()
            self.next_seq: dict[str, int] = {}
            self.checkpoints: dict[str, int] = {}  # each run's next checkpoint position
            self.tried: set[str] = set()  # the runs that tried to store checkpoints

            async def start() -> None:
                for writers in self.worlds.values():
                    for writer in writers.values():
                        await writer.store.__aenter__()
                    await writers["a"].store.create(session_id=self.session_id)

            self.run(start())

        def run(self, coroutine: Coroutine[object, object, _T]) -> _T:
            return self.runner.run(coroutine)

        def teardown(self) -> None:
            async def close() -> None:
                for writers in self.worlds.values():
                    for writer in writers.values():
                        await writer.store.aclose()

            try:
                self.run(close())
            finally:
                self.runner.close()

        def both(self, act: Any) -> Any:
            """Do `act(writers)` in each world; both must answer alike. Return the answer."""
            answers = [self.run(_outcome(act(self.worlds[quick]))) for quick in (True, False)]
            assert answers[0] == answers[1], answers
            return answers[0]

        # -- rules ---------------------------------------------------------------------------

        @rule(who=st.sampled_from(WRITERS), ttl=st.sampled_from([0.0, LIVE]), again=st.booleans())
        def claim(self, who: str, ttl: float, again: bool) -> None:
            # `again`: the run the other writer claimed last claims anew from here (a durable
            # run recovered by another worker): the same run under a new fence.
            other = self.worlds[True][WRITERS[1 - WRITERS.index(who)]].lease
            run = other.run_id if again and other is not None else f"{who}-{next(self.runs)}"

            async def act(writers: dict[str, _Writer]) -> tuple[int, str | None]:
                writer = writers[who]
                lease = await writer.store.claim(self.session_id, run_id=run, holder=who, ttl=ttl)
                writer.lease = lease
                return lease.fence, lease.interrupted_run

            self.both(act)

        @rule(
            who=st.sampled_from(WRITERS),
            count=st.integers(0, 3),
            leased=st.booleans(),
            checkpoint=st.sampled_from(["none", "new", "taken"]),
            calls=st.lists(drawn_calls, min_size=3, max_size=3),
        )
        def step(
            self, who: str, count: int, leased: bool, checkpoint: str, calls: list[Drawn]
        ) -> None:
            lease = self.worlds[True][who].lease
            run = lease.run_id if leased and lease is not None else f"free-{next(self.runs)}"
            first = self.next_seq.get(run, 0)
            events = step_events(calls[:count], run, first)
            # A durable run's checkpoint with the step: a new position, or one already stored
            # (another execution of the run wrote it: the step is refused).
            taken = self.checkpoints.get(run, 0)
            position = taken if checkpoint == "new" else max(taken - 1, 0)
            checkpoints = (
                [Checkpoint(run_id=run, position=position, name="add", result="2")]
                if checkpoint != "none"
                else []
            )

            async def act(writers: dict[str, _Writer]) -> int:
                writer = writers[who]
                writer.history.add(UserMessage(content=f"{who} {run} {first}"))
                writer.environment.set("/extensions/last", f"{who} {run} {first}")
                fence = writer.lease.fence if leased and writer.lease is not None else None
                info = await writer.store.save_step(
                    self.session_id,
                    history=writer.history,
                    environment=writer.environment,
                    events=events,
                    checkpoints=checkpoints,
                    fence=fence,
                )
                # What the step says the session is, is what is stored.
                assert info == await writer.store.info(self.session_id)
                return info.event_count

            if checkpoints:
                self.tried.add(run)
            answer, _ = self.both(act)
            if answer == "ok":
                self.next_seq[run] = first + count
                if checkpoints:
                    self.checkpoints[run] = max(taken, position + 1)

        @rule(who=st.sampled_from(WRITERS), ttl=st.sampled_from([0.0, LIVE]))
        def renew(self, who: str, ttl: float) -> None:
            async def act(writers: dict[str, _Writer]) -> int | None:
                writer = writers[who]
                if writer.lease is None:
                    return None
                writer.lease = await writer.store.renew(writer.lease, ttl=ttl)
                return writer.lease.fence

            self.both(act)

        @rule(who=st.sampled_from(WRITERS))
        def release(self, who: str) -> None:
            async def act(writers: dict[str, _Writer]) -> None:
                writer = writers[who]
                if writer.lease is not None:
                    await writer.store.release(writer.lease)

            self.both(act)

        # -- invariants ----------------------------------------------------------------------

        @invariant()
        def both_worlds_store_the_same_session(self) -> None:
            quick, careful = (
                self.run(
                    _snapshot(self.worlds[world]["a"].store, self.session_id, sorted(self.tried))
                )
                for world in (True, False)
            )
            assert quick == careful

    return OneStatementMachine


def test_one_statement_writes_store_what_the_careful_way_stores(schemas: list[str]) -> None:
    run_state_machine_as_test(
        one_statement_machine(schemas),
        settings=settings(
            max_examples=20,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


async def test_a_runs_steps_and_its_lease_take_one_statement_each(
    schemas: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    careful: list[str] = []
    write_step = postgres_module._PostgresBackend._write_step
    locked = pg_lease._locked

    async def counted_write_step(self: Any, write: Any) -> Any:
        careful.append("step")
        return await write_step(self, write)

    async def counted_locked(*args: Any) -> Any:
        careful.append("lease")
        return await locked(*args)

    monkeypatch.setattr(postgres_module._PostgresBackend, "_write_step", counted_write_step)
    monkeypatch.setattr(pg_lease, "_locked", counted_locked)
    history, environment = History(counter=COUNTER), Environment()
    async with PostgresSessionStore(URL, schema=schemas[0]) as store:
        session = await store.create()
        lease = await store.claim(session.id, run_id="r", holder="h", ttl=LIVE)
        for step in range(5):
            history.add(UserMessage(content=f"step {step}"))
            environment.set("/extensions/step", step)
            events = [TextDelta(run_id="r", seq=2 * step + i, text="x") for i in range(2)]
            await store.save_step(
                session.id,
                history=history,
                environment=environment,
                events=events,
                fence=lease.fence,
            )
        lease = await store.renew(lease, ttl=LIVE)
        await store.release(lease)
        info = await store.info(session.id)
        ids = [number for number, _ in await store.events_with_ids(session.id)]
    # The first step starts the environment's change log afresh: a delete, the careful way.
    assert careful == ["step"]
    assert (info.steps, info.event_count, info.entry_count, info.lease_run) == (5, 10, 5, None)
    assert ids == sorted(set(ids)) and len(ids) == 10


def test_the_store_remembers_the_sessions_written_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LastWrites, "_MAX", 3)
    last = LastWrites()
    for name in ("s1", "s2", "s3"):
        last.wrote(f"rev-{name}", SessionInfo.model_construct(id=name))
    last.wrote("rev-s1b", SessionInfo.model_construct(id="s1"))  # written again: kept longest
    last.wrote("rev-s4", SessionInfo.model_construct(id="s4"))
    assert sorted(last._sessions) == ["s1", "s3", "s4"]
    assert last._sessions["s1"][0] == "rev-s1b"
    last.forget("s3")
    assert sorted(last._sessions) == ["s1", "s4"]


class _Writing:
    """What one process keeps between its steps of a session: its history and environment."""

    def __init__(self) -> None:
        self.history = History(counter=COUNTER)
        self.environment = Environment()


async def _step(
    store: PostgresSessionStore, session_id: str, lease: Lease, seq: int, kept: _Writing
) -> None:
    kept.history.add(UserMessage(content=f"{lease.run_id} {seq}"))
    kept.environment.set("/extensions/seq", seq)
    await store.save_step(
        session_id,
        history=kept.history,
        environment=kept.environment,
        events=[TextDelta(run_id=lease.run_id, seq=seq, text="x")],
        fence=lease.fence,
    )


@contextlib.asynccontextmanager
async def _two_processes(
    schema: str,
) -> AsyncIterator[tuple[PostgresSessionStore, PostgresSessionStore]]:
    """Two stores on one schema: this process's and another's."""
    async with (
        PostgresSessionStore(URL, schema=schema) as mine,
        PostgresSessionStore(URL, schema=schema) as other,
    ):
        yield mine, other


async def test_a_run_recovered_elsewhere_refuses_the_old_fence(schemas: list[str]) -> None:
    """The same run claimed again by another process: same run id, a new fence."""
    async with _two_processes(schemas[0]) as (mine, other):
        session = await mine.create()
        kept = _Writing()
        first = await mine.claim(session.id, run_id="r", holder="me", ttl=0.0)
        await _step(mine, session.id, first, 0, kept)
        recovered = await other.claim(session.id, run_id="r", holder="them", ttl=LIVE)
        assert recovered.fence == first.fence + 1
        with pytest.raises(LeaseLostError):
            await _step(mine, session.id, first, 1, kept)
        events = await mine.events_with_ids(session.id)
    assert [e.seq for _, e in events] == [0]


async def test_a_step_after_two_dead_runs_ended_elsewhere_is_written_where_it_belongs(
    schemas: list[str],
) -> None:
    """Another process ends this store's dead runs: the row's counts change, its revision not.

    The second time, the status is already ``interrupted``: only the counts tell.
    """
    async with _two_processes(schemas[0]) as (mine, other):
        session = await mine.create()
        kept = _Writing()
        for n in range(2):
            lease = await mine.claim(session.id, run_id=f"mine-{n}", holder="me", ttl=0.0)
            await _step(mine, session.id, lease, 0, kept)
            taken = await other.claim(session.id, run_id=f"other-{n}", holder="them", ttl=LIVE)
            assert taken.interrupted_run == f"mine-{n}"
            await other.release(taken)
        last = await mine.claim(session.id, run_id="mine-2", holder="me", ttl=LIVE)
        await _step(mine, session.id, last, 0, kept)
        events = await mine.events_with_ids(session.id)
        info = await mine.info(session.id)
    assert [(e.run_id, e.kind) for _, e in events] == [
        ("mine-0", "text_delta"),
        ("mine-0", "run_finished"),
        ("mine-1", "text_delta"),
        ("mine-1", "run_finished"),
        ("mine-2", "text_delta"),
    ]
    assert (info.event_count, info.last_event_id) == (5, events[-1][0])


async def test_a_step_that_waited_for_the_row_reads_it_again(schemas: list[str]) -> None:
    """Another transaction holds the row and changes it: the statement waits, finds the row
    changed, writes nothing, and the careful way writes the step on the row as it is now."""
    async with PostgresSessionStore(URL, schema=schemas[0]) as store:
        session = await store.create()
        kept = _Writing()
        lease = await store.claim(session.id, run_id="r", holder="me", ttl=LIVE)
        await _step(store, session.id, lease, 0, kept)
        async with await psycopg.AsyncConnection.connect(URL) as rival:
            await rival.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schemas[0])))
            await rival.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session.id,))
            await rival.execute(
                "UPDATE sessions SET status = 'interrupted' WHERE id = %s", (session.id,)
            )
            step = asyncio.create_task(_step(store, session.id, lease, 1, kept))
            await asyncio.sleep(0.3)
            assert not step.done()  # waiting for the row
            await rival.commit()
        await step
        info = await store.info(session.id)
        events = await store.events_with_ids(session.id)
    assert info.status == "interrupted"  # the careful way kept what the row said
    assert [e.seq for _, e in events] == [0, 1] and info.steps == 2
