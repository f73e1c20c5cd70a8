"""A write that failed but may have committed: the recorder's next save stores each thing once.

A connection lost at COMMIT leaves the client an error for a transaction the database kept.
The recorder keeps the events and checkpoints of a failed write for the next one; sent again
as they were, they were refused for their ids (a claimed run's events) or as another
execution's (checkpoints) at every save from then on, and the session stopped being saved.
The next save now first drops what the store holds already (`SessionRecorder._reconcile`).
"""

from __future__ import annotations

import asyncio
import logging
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_flow.agent import StopReason
from agent_flow.environment import Environment
from agent_flow.errors import StoreError
from agent_flow.events import RunFinished, TextDelta
from agent_flow.history import AgentMessage, History, UserMessage
from agent_flow.sessions import Checkpoint, InMemorySessionStore, open_store
from agent_flow.sessions.protocol import SessionStore
from agent_flow.sessions.recorder import SessionRecorder
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.backing import Backing
from tests.store_helpers.postgres import drop_schema, require_postgres

COUNTER = ApproxCounter()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backing(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backing]:
    made = Backing(typing.cast(str, request.param), tmp_path, prefix="af_unsure")
    try:
        yield made
    finally:
        made.drop()


def text(run: str, seq: int) -> TextDelta:
    return TextDelta(run_id=run, seq=seq, text=f"{run}:{seq}")


def finished(run: str, seq: int) -> RunFinished:
    return RunFinished(
        run_id=run,
        seq=seq,
        stop_reason=StopReason.COMPLETED.value,
        final_text="done",
        iterations=1,
        prompt_tokens=0,
        completion_tokens=0,
        duration_ms=1.0,
    )


def commit_then_fail(store: SessionStore, method: str) -> list[int]:
    """Make the store's next `method` call commit, then report a failure; the failures made."""
    real = getattr(store, method)
    armed: list[int] = [1]

    async def committed_but_failed(*args: Any, **kwargs: Any) -> Any:
        result = await real(*args, **kwargs)
        if armed[0]:
            armed[0] -= 1
            raise StoreError("the connection was lost at COMMIT")
        return result

    setattr(store, method, committed_but_failed)
    return armed


def turn(history: History, n: int) -> None:
    history.add(UserMessage(content=f"u{n}"))
    history.add(AgentMessage(content=f"a{n}"))


async def begun(
    store: SessionStore, run_id: str = "r", **options: Any
) -> tuple[SessionRecorder, History, Environment, str]:
    """A recorder on a new session of `store`, its run `run_id` started (claimed)."""
    recorder = SessionRecorder(store, **options)
    await recorder.start(agent="a", task="t", run_id=run_id)
    assert recorder.session_id is not None
    return recorder, History(counter=COUNTER), Environment(), recorder.session_id


async def step_then_hold(recorder: SessionRecorder, history: History, env: Environment) -> None:
    """Save a step with event 0, then record a turn and events 1 and 2 for the next save."""
    turn(history, 0)
    recorder.record(text("r", 0))
    await recorder.step(history, env)
    turn(history, 1)
    recorder.record(text("r", 1))
    recorder.record(text("r", 2))


async def test_a_step_committed_but_reported_failed_is_stored_once_and_saving_goes_on(
    backing: Backing,
) -> None:
    async with backing.open() as store:
        recorder, history, environment, session_id = await begun(store)
        await step_then_hold(recorder, history, environment)
        environment.set("/task/objective", "changed")
        armed = commit_then_fail(store, "save_step")
        with pytest.raises(StoreError, match="lost at COMMIT"):
            await recorder.step(history, environment)
        assert armed == [0] and len(recorder.unsaved_events) == 2  # kept: it may have failed
        for n in (2, 3):
            turn(history, n)
            recorder.record(text("r", n + 1))
            await recorder.step(history, environment)
        await recorder.finish(history, environment, finished("r", 5))
        assert recorder.unsaved_events == ()
        info = await store.info(session_id)
        assert [(e.run_id, e.seq) for e in await store.events(session_id)] == [
            ("r", seq) for seq in range(6)
        ]
        ids = [number for number, _ in await store.events_with_ids(session_id)]
        assert ids == sorted(set(ids)) and info.last_event_id == ids[-1]
        assert info.event_count == 6 and info.status == "completed"
        state = await store.load(session_id)
        assert list(state.entries) == list(history.entries)
        assert state.environment.to_json() == environment.to_json()
        # The next run of the recorder saves as usual.
        await recorder.start(agent="a", task="t", run_id="r2")
        turn(history, 4)
        recorder.record(text("r2", 0))
        await recorder.step(history, environment)
        await recorder.release()
        assert (await store.info(session_id)).event_count == 7


async def test_checkpoints_committed_but_reported_failed_are_not_written_twice(
    backing: Backing,
) -> None:
    async with backing.open() as store:
        recorder, history, environment, session_id = await begun(store)
        sent = Checkpoint("r", 0, "tool:send_mail", '"sent"')
        recorder.checkpoint(sent)
        commit_then_fail(store, "save_checkpoints")
        with pytest.raises(StoreError, match="lost at COMMIT"):
            await recorder.save_checkpoints()
        recorder.checkpoint(Checkpoint("r", 1, "model_call", "{}"))
        turn(history, 0)
        await recorder.step(history, environment)  # not refused as another execution's
        await recorder.release()
        stored = await store.checkpoints(session_id, "r")
        assert [(c.position, c.name) for c in stored] == [(0, "tool:send_mail"), (1, "model_call")]


class Outage(InMemorySessionStore):
    """An in-memory store that can be unreachable for writes and releases."""

    down = False

    async def save_step(self, session_id: str, **kwargs: Any) -> Any:
        if self.down:
            raise StoreError("the database is unreachable")
        return await super().save_step(session_id, **kwargs)

    async def release(self, lease: Any) -> None:
        if self.down:
            raise StoreError("the database is unreachable")
        await super().release(lease)


async def test_events_a_run_could_not_save_before_it_was_ended_are_dropped_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Outage()
    recorder, history, environment, session_id = await begun(store, "r1", lease_seconds=0.3)
    turn(history, 0)
    recorder.record(text("r1", 0))
    await recorder.step(history, environment)
    recorder.record(text("r1", 1))
    store.down = True
    with pytest.raises(StoreError):
        await recorder.step(history, environment)
    with pytest.raises(StoreError):
        await recorder.finish(history, environment, finished("r1", 2))
    await asyncio.sleep(0.4)  # its claim expires during the outage
    store.down = False
    await recorder.start(agent="a", task="t", run_id="r2")
    assert recorder.lease is not None and recorder.lease.interrupted_run == "r1"
    recorder.record(text("r2", 0))
    turn(history, 1)
    with caplog.at_level(logging.WARNING, logger="agent_flow.sessions.recorder"):
        await recorder.step(history, environment)
    assert "1 events of session" in caplog.text and "dropped" in caplog.text
    assert recorder.unsaved_events == ()
    kinds = [(e.run_id, e.kind) for e in await store.events(session_id)]
    assert kinds == [("r1", "text_delta"), ("r1", "run_finished"), ("r2", "text_delta")]
    await recorder.release()


# -- a real connection, cut after the database answered --------------------------------------


class CuttingProxy:
    """A TCP proxy to PostgreSQL that, once armed, drops the server's next answer and the
    connection with it: the statement ran (and committed), the client never hears so."""

    def __init__(self) -> None:
        self.armed = False
        self.cuts = 0

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                if answers and self.armed:
                    self.armed = False
                    self.cuts += 1
                    return
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def serve(self, port: int) -> asyncio.Server:
        async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.gather(
                self._pipe(client_r, server_w, answers=False),
                self._pipe(server_r, client_w, answers=True),
            )

        return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.timeout(60)
async def test_a_postgres_connection_cut_after_its_commit_loses_and_doubles_nothing() -> None:
    url = require_postgres()
    if not url.startswith("postgresql://") or "@127.0.0.1:5432/" not in url:
        pytest.skip("the proxy test needs the local server on 127.0.0.1:5432")
    schema = f"af_unsure_{uuid.uuid4().hex[:12]}"
    proxy = CuttingProxy()
    server = await proxy.serve(5432)
    port = server.sockets[0].getsockname()[1]
    try:
        store = open_store(f"{url.replace(':5432/', f':{port}/')}?schema={schema}")
        async with store:
            recorder, history, environment, session_id = await begun(store)
            await step_then_hold(recorder, history, environment)
            proxy.armed = True
            with pytest.raises(StoreError):
                await recorder.step(history, environment)
            assert proxy.cuts == 1
            assert (await store.info(session_id)).steps == 2  # it did commit
            for n in (2, 3):
                turn(history, n)
                recorder.record(text("r", n + 1))
                await recorder.step(history, environment)
            await recorder.release()
            assert [e.seq for e in await store.events(session_id)] == [0, 1, 2, 3, 4]
            info = await store.info(session_id)
            assert info.steps == 4 and info.entry_count == len(history) == 8
    finally:
        server.close()
        drop_schema(schema)


class Slow(InMemorySessionStore):
    """An in-memory store whose writes can fail, and whose reads can be slow."""

    down = False
    slow = False

    async def save_step(self, session_id: str, **kwargs: Any) -> Any:
        if self.down:
            raise StoreError("the database is unreachable")
        return await super().save_step(session_id, **kwargs)

    async def info(self, session_id: str) -> Any:
        if self.slow:
            await asyncio.sleep(0.2)
        return await super().info(session_id)


async def test_a_run_cancelled_while_its_end_reconciles_still_saves_its_end() -> None:
    """Reconciling is part of the write: a cancel then is held until the end is saved."""
    store = Slow()
    recorder, history, environment, session_id = await begun(store)
    turn(history, 0)
    recorder.record(text("r", 0))
    store.down = True
    with pytest.raises(StoreError):
        await recorder.step(history, environment)
    store.down, store.slow = False, True
    finishing = asyncio.create_task(recorder.finish(history, environment, finished("r", 1)))
    await asyncio.sleep(0.05)  # reconciling: the store's answer is on its way
    finishing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await finishing
    store.slow = False
    info = await store.info(session_id)
    assert info.status == "completed" and info.lease_run is None
    assert [e.kind for e in await store.events(session_id)] == ["text_delta", "run_finished"]


class Unrenewable(InMemorySessionStore):
    """An in-memory store whose claims cannot be renewed or released while `down`."""

    down = False

    async def renew(self, lease: Any, **kwargs: Any) -> Any:
        if self.down:
            raise StoreError("the database is unreachable")
        return await super().renew(lease, **kwargs)

    async def release(self, lease: Any) -> None:
        if self.down:
            raise StoreError("the database is unreachable")
        await super().release(lease)


async def test_a_run_that_lost_its_claim_leaves_nothing_the_next_run_cannot_save() -> None:
    store = Unrenewable()
    recorder, history, environment, _ = await begun(store, "r1", lease_seconds=0.3)
    turn(history, 0)
    recorder.record(text("r1", 0))
    await recorder.step(history, environment)
    store.down = True
    recorder.record(text("r1", 1))
    await asyncio.sleep(0.5)  # not renewed in time: the claim is lost
    with pytest.raises(StoreError):
        await recorder.step(history, environment)  # refused before it is sent
    await recorder.release()  # fails, logged
    store.down = False
    await asyncio.sleep(0.4)
    await recorder.start(agent="a", task="t", run_id="r2")
    assert recorder.lease is not None and recorder.lease.interrupted_run == "r1"
    recorder.record(text("r2", 0))
    turn(history, 1)
    await recorder.step(history, environment)  # its first step: not refused for r1's event
    assert recorder.unsaved_events == ()
    await recorder.release()
