"""The save policy of a run: `SessionRecorder` (sessions/recorder.py).

A recorder shields its writes: a cancelled run still saves its step and its end, and a write
that was cancelled or failed loses no event (the next write carries it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_flow.agent import StopReason
from agent_flow.environment import Environment
from agent_flow.errors import LeaseLostError, StoreError
from agent_flow.events import RunFinished, TextDelta
from agent_flow.history import AgentMessage, History, UserMessage
from agent_flow.sessions import InMemorySessionStore, SessionStatus, SQLiteSessionStore
from agent_flow.sessions.recorder import SessionRecorder, session_status
from agent_flow.tokens import ApproxCounter

COUNTER = ApproxCounter()


class GatedStore(InMemorySessionStore):
    """An in-memory store whose writes can be held at a gate, to cancel them mid-way."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.fail_with: Exception | None = None

    async def save_step(self, session_id: str, **kwargs: Any) -> Any:
        if self.fail_with is not None:
            raise self.fail_with
        if self.gate is not None:
            self.entered.set()
            await self.gate.wait()
        return await super().save_step(session_id, **kwargs)


def text(seq: int) -> TextDelta:
    return TextDelta(run_id="r", seq=seq, text=f"t{seq}")


def finished(seq: int, reason: StopReason) -> RunFinished:
    return RunFinished(
        run_id="r",
        seq=seq,
        stop_reason=reason.value,
        final_text="",
        iterations=1,
        prompt_tokens=0,
        completion_tokens=0,
        duration_ms=1.0,
    )


def one_step(history: History) -> None:
    history.add(UserMessage(content="go"))
    history.add(AgentMessage(content="done"))


async def stored_events(store: InMemorySessionStore, session_id: str) -> list[int]:
    return [event.seq for event in await store.events(session_id)]


# -- the recorder -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (StopReason.COMPLETED, "completed"),
        (StopReason.ANSWERED, "completed"),
        (StopReason.CONVERSE, "completed"),
        (StopReason.WAITING_FOR_USER, "waiting"),
        (StopReason.CANCELLED, "cancelled"),
        (StopReason.ERROR, "failed"),
        (StopReason.MAX_ITERATIONS, "failed"),
        (StopReason.OUTPUT_INVALID, "failed"),
    ],
)
def test_the_final_status_follows_the_stop_reason(reason: StopReason, status: str) -> None:
    assert session_status(reason.value) == status


def test_every_stop_reason_leaves_a_session_status() -> None:
    statuses: set[SessionStatus] = {session_status(reason.value) for reason in StopReason}
    assert statuses == {"completed", "waiting", "cancelled", "failed", "interrupted"}


async def test_the_recorder_creates_the_session_once_and_saves_steps_then_the_end() -> None:
    store = InMemorySessionStore()
    recorder = SessionRecorder(store)
    history, environment = History(counter=COUNTER), Environment()
    await recorder.start(agent="helper", task="a task " * 40)
    session_id = recorder.session_id
    assert session_id is not None
    await recorder.start(agent="helper", task="another")
    assert recorder.session_id == session_id
    one_step(history)
    recorder.record(text(0))
    await recorder.step(history, environment)
    assert (await store.info(session_id)).status == "active"
    recorder.record(text(1))
    await recorder.finish(history, environment, finished(2, StopReason.WAITING_FOR_USER))
    info = await store.info(session_id)
    assert (info.status, info.agent, len(info.title) <= 80) == ("waiting", "helper", True)
    assert await stored_events(store, session_id) == [0, 1, 2]
    assert recorder.unsaved_events == ()


async def test_a_step_write_cancelled_while_queued_completes_and_loses_no_event() -> None:
    """A save cancelled while it waits (behind another write, or inside the store) must not
    drop the step's events: the write is let finish, then the cancellation goes on.
    """
    store = GatedStore()
    recorder = SessionRecorder(store)
    history, environment = History(counter=COUNTER), Environment()
    await recorder.start(agent="a", task="t")
    assert recorder.session_id is not None
    one_step(history)
    recorder.record(text(0))
    recorder.record(text(1))
    store.gate = asyncio.Event()
    saving = asyncio.create_task(recorder.step(history, environment))
    await store.entered.wait()
    saving.cancel()
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await saving
    assert await stored_events(store, recorder.session_id) == [0, 1]
    assert (await store.load(recorder.session_id)).entries == tuple(history.entries)
    assert recorder.unsaved_events == ()


async def test_a_cancel_during_the_final_write_still_saves_the_final_status() -> None:
    store = GatedStore()
    recorder = SessionRecorder(store)
    history, environment = History(counter=COUNTER), Environment()
    await recorder.start(agent="a", task="t")
    assert recorder.session_id is not None
    one_step(history)
    store.gate = asyncio.Event()
    ending = asyncio.create_task(
        recorder.finish(history, environment, finished(0, StopReason.COMPLETED))
    )
    await store.entered.wait()
    ending.cancel()
    ending.cancel()  # a second cancel while the first one waits for the write
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await ending
    assert (await store.info(recorder.session_id)).status == "completed"


async def test_a_failed_write_keeps_its_events_for_the_next_one_but_drops_the_final_event() -> None:
    store = GatedStore()
    recorder = SessionRecorder(store)
    history, environment = History(counter=COUNTER), Environment()
    await recorder.start(agent="a", task="t")
    assert recorder.session_id is not None
    one_step(history)
    recorder.record(text(0))
    store.fail_with = StoreError("disk full")
    with pytest.raises(StoreError, match="disk full"):
        await recorder.step(history, environment)
    with pytest.raises(StoreError, match="disk full"):
        await recorder.finish(history, environment, finished(1, StopReason.COMPLETED))
    assert [e.seq for e in recorder.unsaved_events] == [0]
    store.fail_with = None
    await recorder.step(history, environment)
    assert await stored_events(store, recorder.session_id) == [0]


async def test_without_a_session_the_recorder_keeps_events_for_the_session_to_come() -> None:
    store = GatedStore()
    store.fail_with = StoreError("unreachable")
    recorder = SessionRecorder(store)
    history, environment = History(counter=COUNTER), Environment()
    recorder.record(text(0))
    await recorder.step(history, environment)  # nothing to write to: not a second failure
    await recorder.finish(history, environment, finished(1, StopReason.ERROR))
    store.fail_with = None
    await recorder.start(agent="a", task="t")
    assert recorder.session_id is not None
    one_step(history)
    await recorder.step(history, environment)
    assert await stored_events(store, recorder.session_id) == [0]


# -- cancelled while the store answers ----------------------------------------------------


class AnswerHeld(SQLiteSessionStore):
    """A SQLite store whose `create` and `claim` are done (committed) before their answer,
    which waits at a gate: the caller can be cancelled in between."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def _held(self, result: Any) -> Any:
        self.entered.set()
        await self.gate.wait()
        return result

    async def create(self, **kwargs: Any) -> Any:
        return await self._held(await super().create(**kwargs))

    async def claim(self, session_id: str, **kwargs: Any) -> Any:
        return await self._held(await super().claim(session_id, **kwargs))


async def _cancelled_at_the_answer(store: AnswerHeld, work: Any) -> None:
    task = asyncio.create_task(work)
    await store.entered.wait()
    task.cancel()
    await asyncio.sleep(0.01)  # cancelled while the store's answer is on its way
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    store.entered.clear()


async def test_a_claim_made_as_its_run_is_cancelled_is_given_back(tmp_path: Path) -> None:
    async with AnswerHeld(tmp_path / "s.db") as store:
        store.gate.set()
        session_id = (await store.create(agent="a")).id
        store.gate.clear()
        store.entered.clear()
        recorder = SessionRecorder(store, session_id)
        await _cancelled_at_the_answer(store, recorder.claim("run-1"))
        assert recorder.lease is None
        assert (await store.info(session_id)).lease_run is None  # not held until it expires
        lease = await SessionRecorder(store, session_id).claim("run-2")  # not refused as busy
        assert lease.run_id == "run-2"


class ClaimLostAtCommit(SQLiteSessionStore):
    """A SQLite store whose next claim commits, then reports a failure (a connection lost at
    its COMMIT: the client cannot tell it from a claim that was not stored)."""

    failing = True

    async def claim(self, session_id: str, **kwargs: Any) -> Any:
        lease = await super().claim(session_id, **kwargs)
        if self.failing:
            self.failing = False
            raise StoreError("server closed the connection unexpectedly")
        return lease


async def test_a_claim_that_failed_but_was_stored_is_given_back(tmp_path: Path) -> None:
    async with ClaimLostAtCommit(tmp_path / "s.db") as store:
        session_id = (await store.create(agent="a")).id
        with pytest.raises(StoreError, match="closed the connection"):
            await SessionRecorder(store, session_id).claim("run-1")
        assert (await store.info(session_id)).lease_run is None  # not held until it expires
        lease = await SessionRecorder(store, session_id).claim("run-2")  # not refused as busy
        assert (lease.run_id, lease.fence) == ("run-2", 2)


class ClaimLostAtCommitHeld(ClaimLostAtCommit):
    """Its failing claim's answer also waits at a gate: the caller can be cancelled first."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def claim(self, session_id: str, **kwargs: Any) -> Any:
        try:
            return await super().claim(session_id, **kwargs)
        except StoreError:
            self.entered.set()
            await self.gate.wait()
            raise


async def test_a_claim_stored_but_failed_as_its_caller_is_cancelled_is_given_back(
    tmp_path: Path,
) -> None:
    async with ClaimLostAtCommitHeld(tmp_path / "s.db") as store:
        session_id = (await store.create(agent="a")).id
        claiming = asyncio.create_task(SessionRecorder(store, session_id).claim("run-1"))
        await store.entered.wait()
        claiming.cancel()
        await asyncio.sleep(0.01)
        store.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await claiming
        assert (await store.info(session_id)).lease_run is None


class ClaimRefused(SQLiteSessionStore):
    """A SQLite store whose claims fail before reaching the database (no connection)."""

    async def claim(self, session_id: str, **kwargs: Any) -> Any:
        raise StoreError("couldn't get a connection after 30.00 sec")


async def test_a_failed_claim_of_a_durable_run_leaves_another_execution_s_claim_alone(
    tmp_path: Path,
) -> None:
    """A durable run's executions share its id: the claim found after a failure may be the
    other execution's, live, and is not given back."""
    path = tmp_path / "s.db"
    async with SQLiteSessionStore(path) as store, ClaimRefused(path) as failing:
        session_id = (await store.create(agent="a")).id
        held = await SessionRecorder(store, session_id).claim("run-1")
        with pytest.raises(StoreError, match="connection"):
            await SessionRecorder(failing, session_id).claim("run-1", unique_run=False)
        info = await store.info(session_id)
        assert (info.lease_run, info.lease_fence) == ("run-1", held.fence)
        assert (await store.renew(held, ttl=3600)).fence == held.fence


async def test_a_session_made_as_its_run_is_cancelled_is_the_next_run_s(tmp_path: Path) -> None:
    async with AnswerHeld(tmp_path / "s.db") as store:
        recorder = SessionRecorder(store)
        await _cancelled_at_the_answer(store, recorder.start(agent="a", task="one"))
        made = [info.id for info in await store.list()]
        assert recorder.session_id is not None and made == [recorder.session_id]
        await recorder.start(agent="a", task="two", run_id="run-2")
        assert [info.id for info in await store.list()] == made  # no second, empty session
        await recorder.release()


async def test_a_run_writes_nothing_into_its_session_deleted_and_made_again(
    tmp_path: Path,
) -> None:
    """Another process deletes the session, creates one under its id and runs it: its first
    claim has the fence this run holds (fences start at 1 again), and still, the run's next
    save is refused and stores nothing into the new session."""
    path = tmp_path / "s.db"
    async with SQLiteSessionStore(path) as mine, SQLiteSessionStore(path) as other:
        await mine.create(session_id="again", agent="a")
        recorder = SessionRecorder(mine, "again")
        mine_lease = await recorder.claim("run-1")
        history, environment = History(counter=COUNTER), Environment()
        one_step(history)
        recorder.record(text(0))
        await recorder.step(history, environment)
        await other.delete("again")
        await other.create(session_id="again", agent="a")
        theirs = await other.claim("again", run_id="run-2", holder="elsewhere", ttl=3600)
        assert theirs.fence == mine_lease.fence
        one_step(history)
        recorder.record(text(1))
        with pytest.raises(LeaseLostError, match="run 'run-2' holds it"):
            await recorder.step(history, environment)
        state = await other.load("again")
        assert (state.entries, await stored_events(other, "again")) == ((), [])
        assert (await other.info("again")).lease_run == "run-2"


async def test_a_dead_holder_is_ended_at_once_only_within_this_pid_namespace() -> None:
    """A process id means something only in its PID namespace: a holder of another namespace
    under this host name (a container on the host's network) is never taken for dead."""
    import socket
    import sys

    from agent_flow.errors import SessionBusyError
    from agent_flow.sessions.recorder import claim_session, default_holder

    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    here = default_holder()
    namespace = here.rpartition(":")[2] if here.count(":") else ""
    host = socket.gethostname()
    store = InMemorySessionStore()
    for holder, ended in [
        (f"{gone.pid}@{host}:{namespace}" if namespace else f"{gone.pid}@{host}", True),
        (f"{gone.pid}@{host}", True),  # written before holders named their namespace
        (f"{gone.pid}@{host}:1", False),  # another namespace: its ids are not ours
        (f"{gone.pid}@another-host", False),
    ]:
        sid = (await store.create(agent="a")).id
        await store.claim(sid, run_id="theirs", holder=holder, ttl=3600)
        if ended:
            lease = await claim_session(store, sid, run_id="mine", holder=here, ttl=60)
            assert lease.interrupted_run == "theirs", holder
        else:
            with pytest.raises(SessionBusyError):
                await claim_session(store, sid, run_id="mine", holder=here, ttl=60)
