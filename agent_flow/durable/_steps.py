"""`_StoreSteps`: the `StepRunner` of a durable run, recording into the session store.

A durable run's model calls and tool calls are its steps (see `agent_flow._checkpoints`);
their records are `Checkpoint`s of the run's session, numbered by position. Where a record is
written is what makes durability cheap:

- a model call's record and an idempotent tool call's record are kept and written by the run's
  next step save, in that save's transaction (`SessionRecorder.checkpoint`): a step and its
  records are stored together or not at all, at no extra round trip;
- the "started" record of a call to a tool that is not idempotent is written at once, in a
  transaction of its own, before the tool runs (`stored_now`), with the records kept before it
  (the model call that asked for it): a recovery that finds it without a result knows the call
  may have taken effect and does not make it again.

DBOS's own steps would write each record in two transactions of the system database (a check,
then the record) before the step returns; measured here, an empty DBOS step cost more than the
whole 2 ms per agent step durability may add (see the README's deployment section).

A record that must be stored now and cannot be (the store failed) stops the run with
`StepRecordError`, as a crash would: it is not a result the model may react to.

A recovered run reads its records once (`SessionStore.checkpoints`) and replays them by
position: each step at a recorded position returns its record, after checking that it is the
same kind of step (else the run's code or config changed: `DurableReplayError`). Past the
last record the run goes on live. A replayed delegation's recorded child is counted into the
run's usage and cost as it was live (`agent_flow.delegation.count_replayed`).

DBOS cancels a workflow by marking it cancelled in its system database. These steps look every
`DURABLE_CANCEL_CHECK_SECONDS` at most, with one status read that records nothing (a
`DBOSClient` read, not `DBOS.get_workflow_status` inside the workflow, which would write a step
row per look). A cancelled run is cancelled like any agent run (`AgentExecutor.cancel`): it
ends with `StopReason.CANCELLED`, and its ``run_finished`` is stored. A delegated child's
model and tool calls are not steps, but each looks first too (`check_cancelled`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from dbos import error as dbos_error

from agent_flow._checkpoints import STEP_RUNNER, StepRecordError, StepRunner
from agent_flow.delegation import _ChildSteps, count_replayed
from agent_flow.errors import StoreError
from agent_flow.sessions.models import Checkpoint
from agent_flow.sessions.recorder import SessionRecorder

__all__ = ["STEPS_PER_CALL", "DurableReplayError", "WorkflowStatus"]

#: The step positions reserved for each tool call of a turn (`_StoreSteps.for_calls`): its
#: "started" record and its result.
STEPS_PER_CALL = 2

#: Reads a workflow's DBOS status ("PENDING", "CANCELLED", ...; None if unknown) without
#: recording anything.
WorkflowStatus = Callable[[str], Awaitable[str | None]]


class DurableReplayError(StepRecordError):
    """A recovered run asked for another step than the one recorded at the same position.

    Replay matches steps by position, so the code or the config that recovers a run must be
    the one that started it: deploy the workers of one version together.
    """


class _StoreSteps:
    """Records a durable run's steps as session checkpoints (see the module doc).

    Args:
        recorder: The run's recorder: records go with its saves.
        run_id: The run (its checkpoints' ``run_id`` and its DBOS workflow id).
        recorded: The run's checkpoints stored before (a recovery's), by position.
        cancel_check_seconds: How often, at most, a step reads whether the run was cancelled.
        status: Reads the run's DBOS status.
        on_cancel: Cancels the run (`AgentExecutor.cancel`).
        first: The position of the first step (positions before it are the workflow's own).
    """

    sequential_tools = False

    def __init__(
        self,
        recorder: SessionRecorder,
        run_id: str,
        recorded: Sequence[Checkpoint],
        *,
        cancel_check_seconds: float,
        status: WorkflowStatus,
        on_cancel: Callable[[], None],
        first: int = 0,
    ) -> None:
        self._status = status
        self._on_cancel = on_cancel
        self._recorder = recorder
        self._run_id = run_id
        self._recorded = {c.position: c for c in recorded}
        self._next = first
        self._poll = cancel_check_seconds
        self._looked = time.monotonic()  # DBOS just started the workflow: not cancelled then

    @property
    def next_position(self) -> int:
        """The position the next step would take."""
        return self._next

    def for_calls(self, n: int) -> list[StepRunner]:
        """Reserve `STEPS_PER_CALL` positions for each of a turn's `n` tool calls, in order.

        The calls then run side by side, each recording at its own positions (see
        `agent_flow._checkpoints.CallSteps`).
        """
        first = self._next
        self._next += STEPS_PER_CALL * n
        return [_CallSteps(self, first + STEPS_PER_CALL * i) for i in range(n)]

    async def step(
        self,
        name: str,
        work: Callable[[], Awaitable[str]],
        *,
        stored_now: bool = False,
        synced: bool = True,
    ) -> str:
        position = self._next
        self._next += 1
        return await self.step_at(position, name, work, stored_now=stored_now, synced=synced)

    async def step_at(
        self,
        position: int,
        name: str,
        work: Callable[[], Awaitable[str]],
        *,
        stored_now: bool = False,
        synced: bool = True,
    ) -> str:
        """`step` at `position` (a position `for_calls` reserved)."""
        recorded = self._recorded.pop(position, None)
        if recorded is not None:
            if recorded.name != name:
                raise DurableReplayError(
                    f"run {self._run_id!r} is being recovered, but its step {position} is "
                    f"{name!r} where the crashed process recorded {recorded.name!r}: the code or "
                    "config changed since it started; recover it with the version that started it"
                )
            count_replayed(name, recorded.result)
            return recorded.result
        await self._look_for_cancellation()
        result = await work()
        self._recorder.checkpoint(Checkpoint(self._run_id, position, name, result))
        if stored_now:
            try:
                await self._recorder.save_checkpoints(synced=synced)
            except StoreError as err:
                raise StepRecordError(
                    f"run {self._run_id!r} stops: its step {position} ({name}) must be stored "
                    f"before the run goes on, and the store failed ({err})"
                ) from err
        return result

    async def check_cancelled(self) -> bool:
        """Whether DBOS marked the run cancelled; if so, cancel it (`on_cancel`) first.

        Reads the status at most every `cancel_check_seconds` (False in between). A delegated
        child calls this before each of its model and tool calls (its runner stops it).
        """
        now = time.monotonic()
        if now - self._looked < self._poll:
            return False
        self._looked = now
        if await self._status(self._run_id) != "CANCELLED":
            return False
        self._on_cancel()
        return True

    async def _look_for_cancellation(self) -> None:
        if not await self.check_cancelled():
            return
        # In the run's own task the cancellation arrives here, and the run ends CANCELLED; a
        # step in a tool call's own task (a turn's calls run side by side) stops on the error,
        # and the run's cancellation, which cancels that task too, ends the run.
        await asyncio.sleep(0)
        raise dbos_error.DBOSWorkflowCancelledError(
            f"Workflow {self._run_id} is cancelled. Aborting function."
        )


class _CallSteps:
    """The step runner of one tool call of a durable turn: the two positions reserved for it.

    The call's own steps have fixed places: ``tool_started:<name>`` (the record before a tool
    that is not idempotent runs) the first, ``tool:<name>`` (its result) the second, so a
    call's records are found where they were whichever of them it made. What runs inside the
    tool (an agent of its own, say) records nothing: it is part of the call, whose result is
    the record, and it looks whether the run was cancelled before each of its steps, as a
    delegated child does (`agent_flow.delegation._ChildSteps`).
    """

    sequential_tools = False

    def __init__(self, steps: _StoreSteps, first: int) -> None:
        self._steps = steps
        self._first = first

    async def step(
        self,
        name: str,
        work: Callable[[], Awaitable[str]],
        *,
        stored_now: bool = False,
        synced: bool = True,
    ) -> str:
        if name.startswith("tool_started:"):
            position = self._first
        elif name.startswith("tool:"):
            position = self._first + 1
        else:
            raise DurableReplayError(
                f"a tool call asked for a step {name!r}, which is not one of a call's own "
                "steps; this is a bug in agent_flow"
            )

        async def unrecorded_inside() -> str:
            token = STEP_RUNNER.set(_ChildSteps(self))
            try:
                return await work()
            finally:
                STEP_RUNNER.reset(token)

        return await self._steps.step_at(
            position, name, unrecorded_inside, stored_now=stored_now, synced=synced
        )

    async def check_cancelled(self) -> bool:
        """Whether the run was cancelled (see `_StoreSteps.check_cancelled`)."""
        return await self._steps.check_cancelled()
