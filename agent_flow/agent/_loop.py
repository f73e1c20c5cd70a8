"""The agent loop: one `_Run` of an `AgentExecutor`, from the user's message to its outcome.

A `_Run` lives for one `run` or `send`. It holds that run's state (iterations, usage,
retries, the stuck detector's memory, the event sequence) and reads everything else (config,
model, context, tools, store, bus) from its executor, which owns it while it runs.

One iteration checks the limits, takes up what MCP servers announced since the last model
call (`AgentMCP.refresh`: list changes, updated resources), then takes a `_model_step`
(build the prompt, call the model, record its turn) that returns a typed step —
`RunTools`, `Continue` or `Finish` — and, for `RunTools`, a `_tool_step` (execute, apply
handlers, record results) that returns `Continue` or `Finish`; the steps are in
`agent_flow.agent._steps`. Every step publishes
typed events on the executor's `EventBus`; nothing in a tool, a handler or a subscriber can
end the loop except through a `Finish` with a `StopReason`. Here too: cancellation, the
loop's own failures, pruning after each step, and the final `ExecutionOutcome`.

Saving is not decided here: the loop hands its events and its step boundaries to the
executor's `StepRecorder` (`agent_flow.sessions.protocol`), which owns the save policy.

How a run ends:

- `cancel` (even before the run's task first ran) ends it as CANCELLED, and `run` returns
  the outcome. A cancellation from outside (``task.cancel()``, a timeout) also ends it as
  CANCELLED, then re-raises `CancelledError` to that canceller — also when it coincides with
  `cancel`, whose own request is then withdrawn (``uncancel``) and the outside one kept.
- The run's end is saved before `RunFinished` is published, so a subscriber that sees it can
  read the final state from the store. A cancellation arriving while the end is saved waits
  for the write (the recorder's), so the session is never left "active".
- A store that fails to save the end makes the outcome ERROR, its `errors` saying why; the
  answer the run had (``final_text``, ``output``) is kept. `ExecutionError` and a
  `RunFinished` with stop reason ``error`` are published instead (and saved by the next
  successful write).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import time
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agent_flow._unicode import mend
from agent_flow.agent._cost import _admit, _base_url, _Billing, _model_name, _past_limit
from agent_flow.agent._deferred import DeferredResults, take_up_answers
from agent_flow.agent._model_call import _count_model_call
from agent_flow.agent._steps import _count_ahead, _model_step, _tool_step
from agent_flow.agent._task import settle_task
from agent_flow.agent.outcome import (
    ExecutionOutcome,
    Finish,
    RunErrorInfo,
    RunTools,
    StopReason,
    ToolUse,
)
from agent_flow.errors import (
    AgentFlowError,
    CostLimitError,
    RunError,
)
from agent_flow.events import (
    AgentEvent,
    EnvironmentUpdated,
    ExecutionError,
    HistoryPruned,
    IterationStarted,
    MCPListChanged,
    RunFinished,
    RunStarted,
    WarningRaised,
)
from agent_flow.history import ToolResultEntry, UserMessage
from agent_flow.llm.base import (
    Usage,
)
from agent_flow.llm.metering import listen_for_model_calls

if TYPE_CHECKING:
    from agent_flow.agent.executor import AgentExecutor
    from agent_flow.sessions.protocol import StepRecorder


#: The run whose loop is executing in this context (its tools' tasks inherit it); a delegation
#: (`agent_flow.delegation`) reads its parent run here.
CURRENT_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "agent_flow_current_run", default=None
)


@dataclass(eq=False)
class _Run:
    """One run of `agent`: its state, its loop, and how it ends."""

    agent: AgentExecutor
    run_id: str
    # The coroutine that claimed this run (`AgentExecutor.run`), until its task starts it.
    coroutine: weakref.ref[Coroutine[object, None, ExecutionOutcome]] | None = None
    task: asyncio.Task[object] | None = None
    iteration: int = 0
    seq: int = 0
    started: float = field(default_factory=time.perf_counter)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    usage: Usage = field(default_factory=Usage)
    usage_per_call: list[Usage] = field(default_factory=list)
    # Dollars of the calls with a known price, and each call's price (None: unknown).
    cost_usd: float = 0.0
    cost_per_call: list[float | None] = field(default_factory=list)
    # What servers billed beyond what calls asked for, for the cost limit's estimates, and
    # the last such call's report (see `agent_flow.agent._cost`).
    billing: _Billing = field(default_factory=_Billing)
    cost_overrun: str | None = None
    tool_uses: list[ToolUse] = field(default_factory=list)
    errors: list[RunErrorInfo] = field(default_factory=list)
    reprompts: int = 0
    # Whether a server's prompt count showed it dropped the offered tools (warned once).
    tools_checked: bool = False
    output_retries: int = 0
    last_signature: tuple[tuple[str, str, str], ...] | None = None
    repeats: int = 0
    cancel_requested: bool = False
    # Whether `cancel` cancelled the task (a request made before the task ran did not).
    cancelled_task: bool = False
    finishing: bool = False
    # Parallel tool calls emit concurrently; see `emit`.
    emit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The events published during a durable model call, recorded with its result.
    captured: list[AgentEvent] | None = None
    # The caller's answers to the calls the last run handed over, taken up first (`_deferred`).
    answers: DeferredResults | None = None
    # Hand calls that need approval to the caller instead of asking the approver.
    defer_approvals: bool = False

    @property
    def recorder(self) -> StepRecorder | None:
        return self.agent.recorder

    def lapsed(self) -> bool:
        """Whether this run was claimed and can no longer start (its claim is void).

        Claimed, never started, the claim holds while its coroutine can still run; one that
        was dropped unawaited, or whose task was cancelled before it ran, frees the agent.
        """
        if self.task is not None:
            return False
        coroutine = self.coroutine() if self.coroutine is not None else None
        return coroutine is None or inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED

    def cancel(self) -> None:
        """End this run as CANCELLED: cancel its task, or, before it started, ask it to stop."""
        # Once: a second cancel() must not leave a cancellation pending on the caller, and
        # one that arrives while the run is already finishing has nothing left to cancel.
        if self.cancel_requested or self.finishing:
            return
        self.cancel_requested = True
        # Before the task ran (`create_task(agent.run(...))`, then `cancel()`), there is no
        # task to cancel yet: `execute` sees the request when it starts.
        if self.task is not None:
            self.cancelled_task = True
            self.task.cancel()

    async def execute(self, message: str | None) -> ExecutionOutcome:
        """Run the loop on a new user message (or answers only) until a `Finish`."""
        if message is not None:
            message = mend(message)  # a lone surrogate could never be stored
        self.task = asyncio.current_task()
        self.started = time.perf_counter()
        self.started_at = datetime.now(UTC)
        finish: Finish
        # A cancellation from outside, to re-raise once the run is finished and saved.
        outside: asyncio.CancelledError | None = None
        try:
            if self.recorder is not None:
                await self.recorder.start(
                    agent=self.agent.config.name, task=message or "", run_id=self.run_id
                )
            answered = self.answers.call_ids if self.answers is not None else frozenset()
            self._close_pending("the previous run ended before this call finished", keep=answered)
            if message is not None and not answered:  # else after the answers' results
                try:
                    await _count_ahead(self.agent.history.counter, message)
                finally:  # cancelled meanwhile, the message is still the history's
                    self.agent.history.add(UserMessage(content=message))
            await self.emit(
                RunStarted,
                task=message or "",
                agent=self.agent.config.name,
                model=_model_name(self.agent.llm),
                base_url=_base_url(self.agent.llm),
            )
            if self.agent._counter_note is not None:
                await self.emit(WarningRaised, message=self.agent._counter_note, source="tokens")
            if self.cancel_requested and not self.cancelled_task:
                # Cancelled before the task first ran: the message is recorded, nothing done.
                finish = Finish(StopReason.CANCELLED)
            else:
                # The caller's answers to the calls the last run handed over come first.
                # Tools called from here on (a delegation among them) find their run here.
                token = CURRENT_RUN.set(self)
                try:
                    taken = await take_up_answers(self, message if answered else None)
                    finish = taken if taken is not None else await self._steps()
                finally:
                    CURRENT_RUN.reset(token)
            if self.cancelled_task:
                # `cancel()` came from inside this task (a hook, a tool) where no await
                # delivered it: take it here, not at the caller's next await.
                await asyncio.sleep(0)
        except asyncio.CancelledError as err:
            self._close_pending("the run was cancelled before this call finished")
            self.finishing = True
            task = asyncio.current_task()
            if self.cancelled_task and task is not None:
                task.uncancel()  # withdraw our own request; any other one stays counted
            if not self.cancelled_task or task is None or task.cancelling() > 0:
                outside = err
            finish = Finish(StopReason.CANCELLED)
        # The loop's own failures (a summarizer's model error during pruning, a store that
        # cannot write, a bug) end the run with an error instead of leaving it half-open.
        except Exception as err:
            self._close_pending("the run failed before this call finished")
            wrapped = _wrap(err)
            await self._error(wrapped, fatal=True)
            finish = Finish(StopReason.ERROR, text=str(wrapped))
        self.finishing = True
        outcome = await self._finish(finish)
        if outside is not None:
            raise outside
        return outcome

    async def _steps(self) -> Finish:
        while True:
            limit = self._limit_reached()
            if limit is not None:
                return limit
            self.iteration += 1
            await self.emit(IterationStarted, iteration=self.iteration)
            await self._refresh_mcp()
            step = await _model_step(self)
            if isinstance(step, RunTools):
                step = await _tool_step(self, step)
            if isinstance(step, Finish):
                return step
            stopped = await self._after_step()
            if stopped is not None:
                return stopped

    async def _refresh_mcp(self) -> None:
        """Before a model call: take up what MCP servers said changed since the last one."""
        found = await self.agent.mcp.refresh(self.agent.environment)
        for change in found.changes:
            await self.emit(
                MCPListChanged,
                server=change.server,
                component=change.kind,
                added=change.added,
                removed=change.removed,
            )
        for source, changes in found.environment:
            await self.emit(
                EnvironmentUpdated,
                source=source,
                version=self.agent.environment.version,
                changes=tuple(changes),
            )
        for message in found.warnings:
            await self.emit(WarningRaised, message=message, source="mcp")

    def _limit_reached(self) -> Finish | None:
        config = self.agent.config
        if self.iteration >= config.max_iterations:
            return Finish(StopReason.MAX_ITERATIONS)
        if config.max_total_tokens is not None and self.usage.total_tokens >= (
            config.max_total_tokens
        ):
            return Finish(StopReason.TOKEN_LIMIT)
        # Every call is admitted by its worst case; only a server billing more than it was
        # asked for can bring the run to its limit.
        return _past_limit(self)

    def metered(self) -> contextlib.AbstractContextManager[None]:
        """Count the model calls made for this run inside the block as its own.

        A summarizer's, while pruning or for a handoff's view: each is admitted under the
        run's cost limit first (`agent_flow.llm.metering`).
        """
        return listen_for_model_calls(
            functools.partial(_count_model_call, self), gate=functools.partial(_admit, self)
        )

    async def _after_step(self) -> Finish | None:
        """Step 9: prune, then save the completed step; a `Finish` if pruning could not."""
        # A summarizing strategy calls the model: those calls count like the agent's own, and
        # each is admitted under the cost limit first (a refused step changes nothing).
        try:
            with self.metered():
                report = await self.agent.context.prune_if_needed(tools=self.agent.offered_tools())
        except CostLimitError as err:
            return Finish(StopReason.COST_LIMIT, text=str(err))
        if report is not None and report.changed:
            await self.emit(HistoryPruned, report=report)
        if self.recorder is not None:
            await self.recorder.step(self.agent.history, self.agent.environment)
        return None

    async def _finish(self, finish: Finish) -> ExecutionOutcome:
        """Save and publish the run's end, end its subscriptions, and build the outcome."""
        duration_ms = (time.perf_counter() - self.started) * 1000
        try:
            try:
                await self._end(finish, duration_ms)
            except asyncio.CancelledError:
                raise
            # The store could not save the end: the run failed, whatever it achieved.
            except Exception as err:
                await self._error(_wrap(err), fatal=True)
                finish = Finish(StopReason.ERROR, text=finish.text, output=finish.output)
                async with self.emit_lock:
                    settled = self._settled(finish.reason)  # the task failed with the run
                    if settled is not None:
                        await self._publish(settled)
                    await self._publish(self._finished_event(finish, duration_ms))
        finally:
            self.agent._run_ended()
        return ExecutionOutcome(
            run_id=self.run_id,
            final_text=finish.text,
            output=finish.output,
            stop_reason=finish.reason,
            tool_uses=tuple(self.tool_uses),
            usage=self.usage,
            usage_per_call=tuple(self.usage_per_call),
            cost_usd=self._run_cost(),
            cost_per_call=tuple(self.cost_per_call),
            errors=tuple(self.errors),
            iterations=self.iteration,
            started_at=self.started_at,
            duration_ms=duration_ms,
            environment_version=self.agent.environment.version,
            deferred=finish.deferred,
        )

    def _settled(self, reason: StopReason) -> EnvironmentUpdated | None:
        """Set ``/task/status`` as the run's end leaves it (`settle_task`).

        Returns the event saying so, numbered ``self.seq`` (the caller counts it), or None when
        nothing changed. The caller holds the emit lock.
        """
        environment = self.agent.environment
        before = environment.version
        if not settle_task(environment, reason):
            return None
        event = EnvironmentUpdated(
            run_id=self.run_id,
            seq=self.seq,
            source="run_finished",
            version=environment.version,
            changes=tuple(environment.changes(since_version=before)),
        )
        return event

    async def _end(self, finish: Finish, duration_ms: float) -> None:
        """Save `RunFinished` with the final state, then publish it."""
        async with self.emit_lock:
            # What the end does to the task is saved with the end, and published before it.
            settled = self._settled(finish.reason)
            if settled is not None:
                self.seq += 1
            event = self._finished_event(finish, duration_ms)
            interrupted: asyncio.CancelledError | None = None
            if self.recorder is not None:
                if settled is not None:
                    self.recorder.record(settled)
                try:
                    await self.recorder.finish(self.agent.history, self.agent.environment, event)
                except asyncio.CancelledError as err:
                    # The recorder let its write finish first: the end is saved; say so.
                    interrupted = err
                except Exception:
                    # Not saved: the run ends in error (`_finish`). The task's change did
                    # happen: say so, in its place, before the error.
                    if settled is not None:
                        await self.agent.events.publish(settled)
                    raise
            self.seq += 1
            if settled is not None:
                await self.agent.events.publish(settled)
            await self.agent.events.publish(event)
        if interrupted is not None:
            raise interrupted

    def _finished_event(self, finish: Finish, duration_ms: float) -> RunFinished:
        """The run's last event, numbered next (publish it with the emit lock held)."""
        return RunFinished(
            run_id=self.run_id,
            seq=self.seq,
            stop_reason=finish.reason.value,
            final_text=finish.text,
            output=finish.output,
            iterations=self.iteration,
            prompt_tokens=self.usage.prompt_tokens,
            completion_tokens=self.usage.completion_tokens,
            cost_usd=self._run_cost(),
            duration_ms=duration_ms,
        )

    def _run_cost(self) -> float | None:
        """The run's cost so far: ``None`` (unknown) if any call's price is unknown."""
        if any(cost is None for cost in self.cost_per_call):
            return None
        return self.cost_usd

    # -- plumbing ----------------------------------------------------------------------

    def _close_pending(self, reason: str, *, keep: frozenset[str] = frozenset()) -> None:
        """Answer calls left without results (but `keep`), so no call is left dangling."""
        for call in self.agent.history.pending_calls():
            if call.call_id in keep:
                continue
            self.agent.history.add(
                ToolResultEntry(
                    call_id=call.call_id,
                    tool_name=call.call.name,
                    content=f"error: {reason}",
                    is_error=True,
                )
            )

    async def _error(self, err: AgentFlowError, *, fatal: bool) -> None:
        self.errors.append(
            RunErrorInfo(
                type=type(err).__name__, message=str(err), fatal=fatal, iteration=self.iteration
            )
        )
        await self.emit(
            ExecutionError, error_type=type(err).__name__, message=str(err), fatal=fatal
        )

    async def emit(self, kind: Callable[..., AgentEvent], /, **fields: object) -> None:
        """Number an event of this run, hand it to the recorder, and publish it."""
        # Parallel tool calls emit concurrently: number and publish under one lock, so every
        # subscriber sees the events in sequence order.
        async with self.emit_lock:
            await self._publish(kind(run_id=self.run_id, seq=self.seq, **fields))

    async def forward(self, event: AgentEvent, path: tuple[str, ...]) -> None:
        """Take a delegated child's `event` into this run: its ``path``, the next ``seq``.

        One run, one tree: a child's events are numbered in its parent's sequence (and so, up
        the tree, in the top-level run's), recorded with the parent's own events (stored in its
        session) and published on its bus. A child's own bus (`ChildEvents`) calls this.
        """
        async with self.emit_lock:
            await self._publish(event.model_copy(update={"path": path, "seq": self.seq}))

    async def _publish(self, event: AgentEvent) -> None:
        """Publish `event`, numbered ``self.seq``; the caller holds the emit lock."""
        self.seq += 1
        if self.captured is not None:
            self.captured.append(event)
        if self.recorder is not None:
            self.recorder.record(event)
        await self.agent.events.publish(event)


def _wrap(err: Exception) -> AgentFlowError:
    return err if isinstance(err, AgentFlowError) else RunError(f"{type(err).__name__}: {err}")
