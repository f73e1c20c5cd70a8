"""The seam through which a durable engine checkpoints a run's model calls and tool calls.

The agent loop and the tool executor ask `current_step_runner()` around each model call and
each tool invocation. Without one (the default) they call the model or the tool directly; a
durable engine (`agent_flow.durable`, on DBOS) sets `STEP_RUNNER` for the run it executes,
and every such call becomes a step whose recorded result (a JSON string the core writes and
reads itself) is what a recovery gets back instead of calling again. `agent_flow.durable`
records them as session `Checkpoint`s, in the transaction of the step they belong to.

The core decides what is recorded (`_model_call` records the completion and the events it
streamed, the tool executor the `ToolResult`), so an engine only needs `step`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

__all__ = [
    "STEP_RUNNER",
    "CallSteps",
    "StepRecordError",
    "StepRunner",
    "checkpointed",
    "current_step_runner",
]


class StepRecordError(BaseException):
    """A durable run could not record one of its steps, or replay one: it stops where it is.

    A `BaseException`, as a crash would be and as DBOS's own cancellation is: neither the tool
    boundary nor the loop's error handling may turn it into a result the model sees, which
    could make the model call again a tool whose effect went unrecorded. The durable engine
    that runs the step decides what becomes of the run (DBOS marks its workflow failed).
    """


class StepRunner(Protocol):
    """Runs one named unit of work as a durable step.

    `step` returns the string `work` returned, recorded: when a recovery replays a run, the
    step at the same position returns its recorded string and `work` is not called.
    """

    async def step(
        self,
        name: str,
        work: Callable[[], Awaitable[str]],
        *,
        stored_now: bool = False,
        synced: bool = True,
    ) -> str:
        """Run `work` once (or return what it returned before this run was recovered).

        An engine may keep a step's record and store it later (with the run's next saved
        step); with `stored_now` the record is stored before `step` returns, for a step that
        announces an effect which must not happen twice (the start of a tool call that is
        not idempotent). ``synced=False`` lets that store skip waiting for the disk: the
        record then survives a crash of this process, not of the database (for a record
        whose loss costs information, never a repeated effect).
        """
        ...

    @property
    def sequential_tools(self) -> bool:
        """Whether one turn's tool calls must run one after another (steps are positional)."""
        ...


@runtime_checkable
class CallSteps(Protocol):
    """A step runner that can run one turn's tool calls side by side.

    `for_calls` reserves the positions of ``n`` calls, in call order, before any of them
    starts, and gives each call its own runner over its positions: each call's steps have
    the same positions in a recovery, however the calls interleaved the first time.
    """

    def for_calls(self, n: int) -> list[StepRunner]:
        """One runner per call of a turn of `n` calls, in call order."""
        ...


#: The step runner of the run executing in this context (None: no durability).
STEP_RUNNER: ContextVar[StepRunner | None] = ContextVar("agent_flow_step_runner", default=None)


def current_step_runner() -> StepRunner | None:
    """The step runner of the run executing in this context, if it is durable."""
    return STEP_RUNNER.get()


async def checkpointed(
    runner: StepRunner,
    name: str,
    work: Callable[[], Awaitable[str]],
    *,
    stored_now: bool = False,
    synced: bool = True,
) -> tuple[str, bool]:
    """Run `work` as the step `name`; return its recorded result and whether it ran now.

    `stored_now`, `synced`: see `StepRunner.step`.

    ``False`` means the result was recorded before a crash and is replayed: whatever `work`
    did besides returning (events it published) happened in the process that crashed.
    """
    ran = False

    async def tracked() -> str:
        nonlocal ran
        ran = True
        return await work()

    result = await runner.step(name, tracked, stored_now=stored_now, synced=synced)
    return result, ran
