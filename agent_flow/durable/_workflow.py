"""The durable run: one DBOS workflow per run, its model and tool calls checkpointed.

`run_workflow` is registered with DBOS under `WORKFLOW_NAME`. It

0. claims the session for the run (`_claim`: `SessionStore.claim`, waiting while another
   execution of the run or another run of the session holds it), so that at most one
   execution writes, whatever DBOS believes about which worker lives: a stale execution's
   writes carry a stale fencing number and are refused;
1. reads the run's checkpoints (`SessionStore.checkpoints`): none for a new run, what a
   crashed attempt stored for a recovered one;
2. takes the session's state as the run found it: position 0 of its checkpoints, recorded
   from the store by the first attempt (and saved with its first step), so a recovery gets
   that state back, not the store's later one;
3. rebuilds the agent from it in this process (`Runtime.build` makes the model client and the
   tools) and runs it with a `_StoreSteps` step runner set (see `agent_flow._checkpoints` and
   `_steps`): every model call and tool call is a checkpoint saved with its step, so a
   recovery replays them from their records and reaches the same history, environment,
   usage and cost as the crashed process;
4. records through a `_ReplayRecorder`: the events a replay publishes again that the store
   already has (same run id, same ``seq``) are not saved twice, nor are the step saves they
   belong to;
5. stores the run's outcome as its last checkpoint (`OUTCOME_CHECKPOINT`): an execution that
   finds it returns it at once, and `RunHandle.outcome` reads it where DBOS's status and the
   run disagree (a cancel that landed after the run's last step).

The run's outcome (`ExecutionOutcome` as JSON) is the workflow's result. A run cancelled
through DBOS ends like any cancelled agent run: ``run_finished`` with
`StopReason.CANCELLED` is stored, and so is its outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dbos import DBOS
from pydantic import BaseModel, ConfigDict

from agent_flow._checkpoints import STEP_RUNNER, StepRecordError
from agent_flow._defaults import (
    DURABLE_CANCEL_CHECK_SECONDS,
    DURABLE_CLAIM_WAIT_SECONDS,
    DURABLE_RECORD_RETRY_MAX_SECONDS,
    DURABLE_RECORD_RETRY_SECONDS,
    DURABLE_STORE_OUTAGE_SECONDS,
)
from agent_flow._types import JsonObject
from agent_flow.agent import AgentExecutor, ExecutionOutcome
from agent_flow.config import AgentConfig
from agent_flow.durable._steps import DurableReplayError, WorkflowStatus, _StoreSteps
from agent_flow.durable._wake import on_done
from agent_flow.environment import Environment
from agent_flow.errors import AgentFlowError, SessionBusyError, SessionNotFoundError, StoreError
from agent_flow.events import AgentEvent, RunFinished
from agent_flow.history import History, HistoryEntry
from agent_flow.llm.base import LLMClient
from agent_flow.sessions.models import Checkpoint
from agent_flow.sessions.protocol import SessionStore, StepRecorder
from agent_flow.sessions.recorder import SessionRecorder, end_claim
from agent_flow.telemetry.propagation import attached_context
from agent_flow.tools import ApprovalRequest, ApprovalResponse, ToolExecutor

__all__ = ["OUTCOME_CHECKPOINT", "WORKFLOW_NAME", "RunRequest", "Runtime", "run_workflow"]

logger = logging.getLogger(__name__)

#: The name runs are enqueued under (the same in every process of a deployment).
WORKFLOW_NAME = "agent_flow.run"

#: Builds the model client of a run from its config, with the coroutine that closes it.
LLMFactory = Callable[[AgentConfig], tuple[LLMClient, Callable[[], Awaitable[None]] | None]]
#: Builds the tool executor of a run from its config (None: from the config).
ToolsFactory = Callable[[AgentConfig], ToolExecutor]


class RunRequest(BaseModel):
    """An enqueued run: the workflow's one argument (as JSON).

    Attributes:
        session_id: The session the run continues (it exists in the store).
        message: The user message the run starts with.
        run_id: The run's id: its events' ``run_id`` and its DBOS workflow id.
        config: The agent's config as JSON (None: the worker's own).
        trace_context: The W3C trace context of the enqueuer, so the run joins its trace.
    """

    model_config = ConfigDict(frozen=True)

    session_id: str
    message: str
    run_id: str
    config: JsonObject | None = None
    trace_context: dict[str, str] | None = None


class _Snapshot(BaseModel):
    entries: list[HistoryEntry]
    environment: str | None


@dataclass
class Runtime:
    """What a worker process runs durable runs with (one per process: DBOS is one per process).

    Attributes:
        store: The session store every run records into.
        config: The agent config of runs whose request carries none.
        llm_factory: Builds a run's model client (default: `OpenAIClient` from the config).
        tools_factory: Builds a run's tools (default: from the config).
        cancel_check_seconds: How often, at most, a running run reads whether it was
            cancelled.
        on_agent: Called with each run's agent once it is built, before it runs
            (``agent_flow.telemetry.instrument`` traces it; the run's trace context, carried
            from the request that enqueued it, makes its spans part of that trace).
        status: Reads a run's DBOS status without recording a step (the worker sets a
            `DBOSClient` read; None: DBOS's own read, which records one per look).
        after_run: Called once a run's workflow has ended and its outcome is recorded (the
            worker looks at the queue again: the session's next run may be taken now).
    """

    store: SessionStore
    config: AgentConfig
    llm_factory: LLMFactory | None = None
    tools_factory: ToolsFactory | None = None
    cancel_check_seconds: float = DURABLE_CANCEL_CHECK_SECONDS
    on_agent: Callable[[AgentExecutor], object] | None = None
    status: WorkflowStatus | None = None
    after_run: Callable[[], None] | None = None

    async def workflow_status(self, run_id: str) -> str | None:
        """The DBOS status of `run_id` ("PENDING", "CANCELLED", ...; None if unknown)."""
        if self.status is not None:
            return await self.status(run_id)
        found = await DBOS.get_workflow_status_async(run_id)
        return found.status if found is not None else None

    def llm(self, config: AgentConfig) -> tuple[LLMClient, Callable[[], Awaitable[None]] | None]:
        """The model client of a run, and how to close it."""
        if self.llm_factory is not None:
            return self.llm_factory(config)
        from agent_flow.llm.openai_client import OpenAIClient

        client = OpenAIClient.from_config(config.resolved_llm())
        return client, client.aclose


_runtime: Runtime | None = None


def install(runtime: Runtime | None) -> None:
    """Make `runtime` the one this process's workflows run with."""
    global _runtime
    _runtime = runtime


class _ReplayRecorder:
    """A `StepRecorder` that does not save again what a crashed attempt of the run saved."""

    def __init__(self, inner: StepRecorder, saved_through: int) -> None:
        self._inner = inner
        self._saved_through = saved_through  # the largest seq of this run in the store
        self._last = -1

    @property
    def session_id(self) -> str | None:
        return self._inner.session_id

    async def start(self, *, agent: str, task: str, run_id: str = "") -> None:
        await self._inner.start(agent=agent, task=task, run_id=run_id)

    def record(self, event: AgentEvent) -> None:
        self._last = event.seq
        if event.seq > self._saved_through:
            self._inner.record(event)

    async def step(self, history: History, environment: Environment) -> None:
        if self._last > self._saved_through:
            try:
                await self._inner.step(history, environment)
            except StoreError as err:
                raise _unrecorded("a step", err) from err

    async def finish(self, history: History, environment: Environment, final: RunFinished) -> None:
        if final.seq > self._saved_through:
            try:
                await self._inner.finish(history, environment, final)
            except StoreError as err:
                raise _unrecorded("its end", err) from err


def _unrecorded(what: str, err: StoreError) -> StepRecordError:
    """Stop a durable run where the store failed, as a crash would, to be recovered.

    It does not go on (or end, failed) with what the store may not have.
    """
    return StepRecordError(f"the store did not record {what} of the run ({err})")


async def _refuse_approval(request: ApprovalRequest) -> ApprovalResponse:
    """Durable runs ask no one: a call that needs approval is refused (the model is told)."""
    return ApprovalResponse(
        approved=False,
        reason=f"{request.tool_name!r} needs approval, and a durable run (executing in a worker) "
        "has no one to ask; allow the tool in its policy to use it in durable runs",
    )


#: The name of a run's first checkpoint: the session as the run found it (`_Snapshot`).
_SNAPSHOT = "session_snapshot"
#: The name of a run's last checkpoint: its `ExecutionOutcome` as JSON.
OUTCOME_CHECKPOINT = "run_outcome"


async def _snapshot(store: SessionStore, session_id: str) -> str:
    state = await store.load(session_id)
    environment = state.environment.to_json() if state.environment is not None else None
    return _Snapshot(entries=list(state.entries), environment=environment).model_dump_json()


async def _saved_through(store: SessionStore, session_id: str, run_id: str) -> int:
    events = await store.events(session_id, run_id=run_id)
    return max((event.seq for event in events), default=-1)


@DBOS.workflow(name=WORKFLOW_NAME)
async def run_workflow(request_json: str) -> str:
    """Execute one enqueued run (see the module doc); return its `ExecutionOutcome` JSON."""
    runtime = _runtime
    if runtime is None:
        raise RuntimeError("no agent_flow durable runtime in this process; start a Worker")
    request = RunRequest.model_validate_json(request_json)
    if runtime.after_run is not None:
        on_done(runtime.after_run)
    with attached_context(request.trace_context):
        outcome = await _execute_recovering(runtime, request)
    return outcome.model_dump_json()


async def _execute_recovering(runtime: Runtime, request: RunRequest) -> ExecutionOutcome:
    """`_execute`, executed again from its records while the session store fails.

    A store that failed to record a step (`StepRecordError`), to renew the run's claim, or to
    answer a read (`StoreError`: PostgreSQL restarting, a pooled connection broken) stopped
    the run where it was, as a crash would. After a pause (doubling from
    `DURABLE_RECORD_RETRY_SECONDS` up to `DURABLE_RECORD_RETRY_MAX_SECONDS`) the run is
    recovered in this process from what the store holds, for up to
    `DURABLE_STORE_OUTAGE_SECONDS` from the first failure. Then, or when a recovery meets
    steps that differ from the records (`DurableReplayError`), the workflow fails with the
    reason (an `AgentFlowError`: DBOS records the workflow as failed, `RunHandle.outcome`
    raises it); a run left without its end gets an ``interrupted`` one when its session is
    next opened.
    """
    loop = asyncio.get_running_loop()
    # The window runs from the first failure: a run's age (or its wait for the claim) does not
    # shorten it.
    deadline: float | None = None
    pause = DURABLE_RECORD_RETRY_SECONDS
    attempt = 0
    while True:
        attempt += 1
        try:
            return await _execute(runtime, request)
        except DurableReplayError as err:
            raise AgentFlowError(str(err)) from err
        except SessionNotFoundError as err:  # deleted: no outage, nothing to wait for
            raise AgentFlowError(f"run {request.run_id} cannot run: {err}") from err
        except (StepRecordError, StoreError) as err:
            if deadline is None:
                deadline = loop.time() + DURABLE_STORE_OUTAGE_SECONDS
            if isinstance(err, SessionBusyError) or loop.time() + pause > deadline:
                raise AgentFlowError(
                    f"{err} (gave up after {attempt} attempts in "
                    f"{DURABLE_STORE_OUTAGE_SECONDS:g}s to record the run's steps)"
                ) from err
            logger.warning("%s; recovering the run from its records in this process", err)
            await asyncio.sleep(pause)
            pause = min(pause * 2, DURABLE_RECORD_RETRY_MAX_SECONDS)


async def _claim(store: SessionStore, session_id: str, run_id: str) -> SessionRecorder:
    """A recorder holding the session's claim for `run_id`, once no one else holds it.

    Another execution of this run (a worker DBOS took for dead while it lived, or one cut from
    the database) or another run of the session may hold the claim: this execution waits until
    that one releases it or its claim expires (it then stops itself: it cannot renew). So at
    most one execution of a run, and one run of a session, writes at a time, whatever the
    network does. A claim left by an earlier attempt in this process is taken over at once.

    Raises:
        AgentFlowError: The claim stayed held for `DURABLE_CLAIM_WAIT_SECONDS`.
    """
    recorder = SessionRecorder(store, session_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DURABLE_CLAIM_WAIT_SECONDS
    while True:
        try:
            await recorder.claim(run_id, unique_run=False)  # (its executions share the id)
            return recorder
        except SessionBusyError as err:
            if err.holder == recorder.holder and err.run_id == run_id and err.fence:
                # This process's earlier attempt of the run: it is over (we are its retry).
                await end_claim(store, session_id, err)
                continue
            if loop.time() >= deadline:
                raise AgentFlowError(
                    f"run {run_id} waited {DURABLE_CLAIM_WAIT_SECONDS:g}s for session "
                    f"{session_id!r}, held by run {err.run_id} ({err.holder}); it was not run"
                ) from err
            logger.info("run %s waits for session %s: %s", run_id, session_id, err)
            await asyncio.sleep(min(1.0, recorder.lease_seconds / 10))


async def _execute(runtime: Runtime, request: RunRequest) -> ExecutionOutcome:
    store, session_id, run_id = runtime.store, request.session_id, request.run_id
    # Claimed first: what this execution reads next is what the last holder left.
    claimed = await _claim(store, session_id, run_id)
    try:
        return await _execute_claimed(runtime, request, claimed)
    finally:
        await claimed.release()


async def _store_outcome(
    recorder: SessionRecorder, run_id: str, outcome: ExecutionOutcome, position: int
) -> None:
    """Store the run's outcome as its last checkpoint (retried like a step's record)."""
    recorder.checkpoint(Checkpoint(run_id, position, OUTCOME_CHECKPOINT, outcome.model_dump_json()))
    try:
        await recorder.save_checkpoints()
    except StoreError as err:
        raise StepRecordError(
            f"run {run_id!r} ended, and its outcome could not be stored ({err})"
        ) from err


async def _execute_claimed(
    runtime: Runtime, request: RunRequest, claimed: SessionRecorder
) -> ExecutionOutcome:
    store, session_id, run_id = runtime.store, request.session_id, request.run_id
    recorded = await store.checkpoints(session_id, run_id)
    if recorded and recorded[-1].name == OUTCOME_CHECKPOINT:
        # The run ended before (its execution's outcome never reached DBOS): the same outcome.
        return ExecutionOutcome.model_validate_json(recorded[-1].result)
    if recorded and recorded[0].name == _SNAPSHOT:
        first = recorded[0]
    else:  # a new run, or one that crashed before saving anything
        recorded = []
        first = Checkpoint(run_id, 0, _SNAPSHOT, await _snapshot(store, session_id))
    snapshot = _Snapshot.model_validate_json(first.result)
    config = (
        AgentConfig.model_validate(request.config) if request.config is not None else runtime.config
    )
    llm, close = runtime.llm(config)
    try:
        tools = runtime.tools_factory(config) if runtime.tools_factory is not None else None
        environment = Environment.from_json(snapshot.environment) if snapshot.environment else None
        agent = AgentExecutor(
            llm,
            config=config,
            tools=tools,
            environment=environment,
            store=store,
            session_id=session_id,
            approval=_refuse_approval,
        )
        for entry in snapshot.entries:
            agent.history.add(entry)
        if runtime.on_agent is not None:
            runtime.on_agent(agent)
        # The recorder that holds the claim records the run (and stops it if it loses it).
        recorder = claimed
        recorder.cancels(agent.cancel)
        if not recorded:
            recorder.checkpoint(first)  # saved with the run's first step
        saved = await _saved_through(store, session_id, run_id)
        agent.recorder = _ReplayRecorder(recorder, saved)
        steps = _StoreSteps(
            recorder,
            run_id,
            recorded[1:],
            cancel_check_seconds=runtime.cancel_check_seconds,
            status=runtime.workflow_status,
            on_cancel=agent.cancel,
            first=1,
        )
        token = STEP_RUNNER.set(steps)
        try:
            async with agent:
                first_run = not snapshot.entries and agent.environment.task.objective == ""
                if first_run:
                    outcome = await agent.run(request.message, run_id=run_id)
                else:
                    outcome = await agent.send(request.message, run_id=run_id)
        finally:
            STEP_RUNNER.reset(token)
        await _store_outcome(recorder, run_id, outcome, steps.next_position)
        return outcome
    finally:
        if close is not None:
            await close()
