"""A durable run's checkpoints (`agent_flow.durable._steps`), and recovery from any crash point.

The recovery test runs one durable run to completion once to count its writes, then, for
every write W of it, "crashes" an attempt at W (that write and every later one fail, as when
the process dies before committing) and lets a second attempt recover the run from what the
store holds. Every time: the run finishes once, its events are numbered without gap or
repeat, every tool call that completed before the crash keeps its answer and is not run
again, and a call the crash interrupted is not run again (its tool is not idempotent).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_flow._checkpoints import StepRecordError
from agent_flow.agent import ExecutionOutcome, StopReason
from agent_flow.durable import _workflow as workflow_module
from agent_flow.durable._steps import DurableReplayError, _StoreSteps
from agent_flow.durable._workflow import (
    OUTCOME_CHECKPOINT,
    RunRequest,
    Runtime,
    _execute,
    _execute_recovering,
)
from agent_flow.environment import Environment
from agent_flow.errors import AgentFlowError, StoreError
from agent_flow.events import RunFinished
from agent_flow.history import History
from agent_flow.sessions import Checkpoint, InMemorySessionStore, SessionRecorder
from tests.durable_app import CONFIG, model_and_tools
from tests.durable_helpers import counts_of


async def _pending(_run_id: str) -> str | None:
    return "PENDING"


#: A run no one cancels.
NEVER: Any = {"status": _pending, "on_cancel": lambda: None}


def work(result: str, calls: list[str]) -> Callable[[], Awaitable[str]]:
    async def run() -> str:
        calls.append(result)
        return result

    return run


async def test_records_go_with_the_next_save_unless_they_must_be_stored_now() -> None:
    store = InMemorySessionStore()
    info = await store.create()
    recorder = SessionRecorder(store, info.id)
    steps = _StoreSteps(recorder, "r", [], cancel_check_seconds=3600, **NEVER)
    calls: list[str] = []
    assert await steps.step("model_call", work("m0", calls)) == "m0"
    assert await store.checkpoints(info.id, "r") == []  # kept for the step's save
    assert await steps.step("tool_started:x", work("s", calls), stored_now=True) == "s"
    assert [c.result for c in await store.checkpoints(info.id, "r")] == ["m0", "s"]
    await steps.step("tool:x", work("t", calls))
    await recorder.step(History(), Environment())
    stored = await store.checkpoints(info.id, "r")
    assert [(c.position, c.name) for c in stored] == [
        (0, "model_call"),
        (1, "tool_started:x"),
        (2, "tool:x"),
    ]
    assert calls == ["m0", "s", "t"]


async def test_a_recovery_replays_records_by_position_then_goes_on_live() -> None:
    store = InMemorySessionStore()
    info = await store.create()
    recorded = [Checkpoint("r", 1, "model_call", "m1"), Checkpoint("r", 2, "tool:x", "t2")]
    steps = _StoreSteps(
        SessionRecorder(store, info.id), "r", recorded, cancel_check_seconds=3600, first=1, **NEVER
    )
    calls: list[str] = []
    assert await steps.step("model_call", work("new", calls)) == "m1"
    assert await steps.step("tool:x", work("new", calls)) == "t2"
    assert calls == []
    assert await steps.step("model_call", work("m3", calls)) == "m3"
    assert calls == ["m3"]


async def test_a_recovery_that_meets_another_step_than_recorded_refuses_to_go_on() -> None:
    store = InMemorySessionStore()
    info = await store.create()
    recorded = [Checkpoint("r", 0, "tool:launch", "{}")]
    steps = _StoreSteps(
        SessionRecorder(store, info.id), "r", recorded, cancel_check_seconds=3600, **NEVER
    )
    with pytest.raises(DurableReplayError, match=r"step 0 is 'model_call'.*'tool:launch'"):
        await steps.step("model_call", work("m", []))


class CrashingStore(InMemorySessionStore):
    """An in-memory store whose writes fail from the `crash_at`-th on (None: never)."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_at: int | None = None
        self.writes = 0

    def _write(self) -> None:
        self.writes += 1
        if self.crash_at is not None and self.writes >= self.crash_at:
            raise StoreError("the process died before this write committed")

    async def save_step(self, session_id: str, **kwargs: Any) -> Any:
        self._write()
        return await super().save_step(session_id, **kwargs)

    async def save_checkpoints(self, session_id: str, checkpoints: Any, **kwargs: Any) -> None:
        self._write()
        await super().save_checkpoints(session_id, checkpoints, **kwargs)


def runtime_for(store: CrashingStore, folder: Path) -> Runtime:
    """A worker's runtime on `store`, its counting tool writing into `folder`."""
    llm, tools = model_and_tools(folder, None)
    return Runtime(
        store=store,
        config=CONFIG,
        llm_factory=lambda _config: (llm, None),
        tools_factory=lambda _config: tools,
        cancel_check_seconds=3600,
    )


async def attempt(store: CrashingStore, folder: Path, request: RunRequest) -> Any:
    runtime = runtime_for(store, folder)
    try:
        return await _execute(runtime, request)
    except StepRecordError as err:
        if not isinstance(err.__cause__, StoreError):
            raise
        return None  # a crashed attempt: only what it left in the store counts


async def test_a_run_recovers_from_a_crash_at_any_write(tmp_path: Path) -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    request = RunRequest(session_id=info.id, message="count 3", run_id="run-full")
    outcome = await attempt(store, tmp_path, request)
    assert outcome is not None and outcome.final_text == "done"
    total = store.writes
    assert total >= 7  # three steps, each: a started record, a result, a save; and the end
    for crash_at in range(1, total + 1):
        store = CrashingStore()
        info = await store.create(agent="durable")
        request = RunRequest(session_id=info.id, message="count 3", run_id=f"run-{crash_at}")
        store.crash_at = crash_at
        await attempt(store, tmp_path, request)  # writes nothing from `crash_at` on
        store.crash_at = None
        outcome = await attempt(store, tmp_path, request)
        assert outcome is not None and outcome.final_text == "done", crash_at
        executed = counts_of(tmp_path, request.run_id)
        assert len(outcome.tool_uses) == 3
        for n, use in enumerate(outcome.tool_uses, start=1):
            assert json.loads(use.arguments) == {"n": n}
            if use.error_kind == "interrupted":
                assert executed.count(n) <= 1, (crash_at, executed)
            else:
                assert use.content == f"counted {n}"
                assert executed.count(n) == 1, (crash_at, executed)
        events = await store.events(info.id, run_id=request.run_id)
        assert [e.seq for e in events] == list(range(len(events))), crash_at
        assert [e.kind for e in events].count("run_finished") == 1, crash_at
        state = await store.load(info.id)
        assert state.info.status == "completed"
        assert [e.kind for e in state.entries].count("tool_result") == 3


class FlakyStore(CrashingStore):
    """Fails its `crash_at`-th write only (a store that comes back)."""

    def _write(self) -> None:
        self.writes += 1
        if self.writes == self.crash_at:
            raise StoreError("the connection to the store dropped")


# Write 1 is the first call's "started" record (the tool has not run: it runs once, after the
# recovery), write 2 its result (the tool ran: the recovery may not run it again).
@pytest.mark.parametrize(
    ("failing", "first"),
    [(1, "counted 1"), (2, "the call to 'count' was interrupted by a crash")],
)
async def test_a_run_whose_store_fails_once_is_recovered_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int, first: str
) -> None:
    monkeypatch.setattr(workflow_module, "DURABLE_RECORD_RETRY_SECONDS", 0.0)
    store = FlakyStore()
    store.crash_at = failing
    info = await store.create(agent="durable")
    runtime = runtime_for(store, tmp_path)
    request = RunRequest(session_id=info.id, message="count 2", run_id="flaky")
    outcome = await _execute_recovering(runtime, request)
    assert outcome.final_text == "done"
    assert outcome.tool_uses[0].content.startswith(first)
    assert outcome.tool_uses[1].content == "counted 2"
    assert counts_of(tmp_path, "flaky") == [1, 2]
    events = await store.events(info.id, run_id="flaky")
    assert [e.seq for e in events] == list(range(len(events)))


async def test_a_store_that_stays_down_fails_the_workflow_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_module, "DURABLE_RECORD_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(workflow_module, "DURABLE_STORE_OUTAGE_SECONDS", 0.05)
    store = CrashingStore()
    store.crash_at = 1
    info = await store.create(agent="durable")
    runtime = runtime_for(store, tmp_path)
    request = RunRequest(session_id=info.id, message="count 2", run_id="down")
    with pytest.raises(
        AgentFlowError, match=r"must be stored.*gave up after \d+ attempts in 0.05s"
    ):
        await _execute_recovering(runtime, request)
    assert counts_of(tmp_path, "down") == []  # never started without its record


async def test_a_cancelled_run_ends_cancelled_and_its_end_is_stored(tmp_path: Path) -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    looks: list[str] = []

    async def status(run_id: str) -> str | None:
        looks.append(run_id)
        # Cancelled once two calls ran (read from what the tool wrote).
        return "CANCELLED" if len(counts_of(tmp_path, run_id)) >= 2 else "PENDING"

    runtime = runtime_for(store, tmp_path)
    runtime.cancel_check_seconds = 0.0
    runtime.status = status
    request = RunRequest(session_id=info.id, message="count 9", run_id="cancelled")
    outcome = await _execute(runtime, request)
    assert outcome.stop_reason == StopReason.CANCELLED
    assert counts_of(tmp_path, "cancelled") == [1, 2]
    assert looks and set(looks) == {"cancelled"}
    events = await store.events(info.id, run_id="cancelled")
    finished = [e for e in events if isinstance(e, RunFinished)]
    assert [e.stop_reason for e in finished] == [StopReason.CANCELLED]
    assert (await store.load(info.id)).info.status == "cancelled"
    records = await store.checkpoints(info.id, "cancelled")
    assert records[-1].name == OUTCOME_CHECKPOINT
    assert ExecutionOutcome.model_validate_json(records[-1].result) == outcome


async def test_a_run_that_ended_is_not_run_again_by_a_later_execution(tmp_path: Path) -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    request = RunRequest(session_id=info.id, message="count 2", run_id="once")
    first = await _execute(runtime_for(store, tmp_path), request)
    events = await store.events(info.id)
    # DBOS may execute a run again whose outcome it never recorded (a crash just after the
    # run ended, or a cancel that landed after its last step): the same outcome, nothing run.
    again = await _execute(runtime_for(store, tmp_path), request)
    assert again == first and again.final_text == "done"
    assert counts_of(tmp_path, "once") == [1, 2]
    assert await store.events(info.id) == events


class OutageStore(CrashingStore):
    """Every read and write fails while `down` (a restarting database), then works again."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.refused = 0
        self.down_at: int | None = None  # the write that starts the outage
        self.down_for = 0.0

    def _write(self) -> None:
        self.writes += 1
        if self.writes == self.down_at:
            self.down = True
            asyncio.get_running_loop().call_later(self.down_for, setattr, self, "down", False)
        self._check()

    def _check(self) -> None:
        if self.down:
            self.refused += 1
            raise StoreError("connection refused: the database system is starting up")

    async def claim(self, session_id: str, **kwargs: Any) -> Any:
        self._check()
        return await super().claim(session_id, **kwargs)

    async def checkpoints(self, session_id: str, run_id: str) -> Any:
        self._check()
        return await super().checkpoints(session_id, run_id)


async def test_a_run_in_flight_during_an_outage_is_recovered_when_the_store_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_module, "DURABLE_RECORD_RETRY_SECONDS", 0.01)
    store = OutageStore()
    info = await store.create(agent="durable")
    runtime = runtime_for(store, tmp_path)
    request = RunRequest(session_id=info.id, message="count 4", run_id="outage")

    # Down from the run's fifth write on (two calls ran), long enough to fail every path.
    store.down_at, store.down_for = 5, 0.3
    outcome = await _execute_recovering(runtime, request)
    assert store.refused >= 2
    assert outcome.final_text == "done" and len(outcome.tool_uses) == 4
    executed = counts_of(tmp_path, "outage")
    assert sorted(set(executed)) == [1, 2, 3, 4] and len(executed) == len(set(executed))
    events = await store.events(info.id, run_id="outage")
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.kind for e in events].count("run_finished") == 1
    assert (await store.info(info.id)).status == "completed"


async def test_a_model_error_made_live_in_a_durable_run_keeps_its_type(tmp_path: Path) -> None:
    from agent_flow.errors import ModelBadRequestError
    from agent_flow.testing import FunctionLLM, fail

    def refuse(_request: object) -> object:
        return fail(ModelBadRequestError("the model refused the request", status_code=400))

    store = CrashingStore()
    info = await store.create(agent="durable")
    runtime = runtime_for(store, tmp_path)
    runtime.llm_factory = lambda _config: (FunctionLLM(refuse), None)  # type: ignore[arg-type]
    request = RunRequest(session_id=info.id, message="count 1", run_id="refused")
    outcome = await _execute(runtime, request)
    assert outcome.stop_reason == StopReason.ERROR
    # The error as raised (fallbacks and reports read its type), not a replay's stand-in.
    assert outcome.errors[-1].type == "ModelBadRequestError"
