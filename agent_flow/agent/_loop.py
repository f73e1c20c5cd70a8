"""The agent loop: one `_Run` of an `AgentExecutor`, from the user's message to its outcome.

A `_Run` lives for one `run` or `send`. It holds that run's state (iterations, usage,
retries, the stuck detector's memory, the event sequence) and reads everything else (config,
model, context, tools, store, bus) from its executor, which owns it while it runs.

One iteration checks the limits, then takes a `_model_step` (build the prompt, call the
model, record its turn) that returns a typed step — `RunTools`, `Continue` or `Finish` —
and, for `RunTools`, a `_tool_step` (execute, apply handlers, record results) that returns
`Continue` or `Finish`; the steps are in `agent_flow.agent._steps`. Every step publishes
typed events on the executor's `EventBus`; nothing in a tool, a handler or a subscriber can
end the loop except through a `Finish` with a `StopReason`. Here too: cancellation, the
loop's own failures, pruning and saving after each step, and the final `ExecutionOutcome`.
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agent_flow.agent._steps import _model_step, _tool_step
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
    RunError,
)
from agent_flow.events import (
    AgentEvent,
    ExecutionError,
    HistoryPruned,
    IterationStarted,
    RunFinished,
    RunStarted,
    WarningRaised,
)
from agent_flow.history import ToolResult as ToolResultEntry
from agent_flow.history import UserMessage
from agent_flow.llm.base import (
    LLMClient,
    Usage,
)
from agent_flow.sessions import SessionStatus

if TYPE_CHECKING:
    from agent_flow.agent.executor import AgentExecutor


@dataclass(eq=False)
class _Run:
    """One run of `agent`: its state, its loop, and how it ends."""

    agent: AgentExecutor
    run_id: str
    task: asyncio.Task[object] | None = None
    iteration: int = 0
    seq: int = 0
    started: float = field(default_factory=time.perf_counter)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    usage: Usage = field(default_factory=Usage)
    usage_per_call: list[Usage] = field(default_factory=list)
    tool_uses: list[ToolUse] = field(default_factory=list)
    errors: list[RunErrorInfo] = field(default_factory=list)
    pending_events: list[AgentEvent] = field(default_factory=list)
    reprompts: int = 0
    output_retries: int = 0
    last_signature: tuple[tuple[str, str, str], ...] | None = None
    repeats: int = 0
    cancel_requested: bool = False
    finishing: bool = False
    # Parallel tool calls emit concurrently; see `emit`.
    emit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def cancel(self) -> None:
        """Cancel the task running this run; `execute` then finishes it as CANCELLED."""
        # Once: a second cancel() must not leave a cancellation pending on the caller, and
        # one that arrives while the run is already finishing has nothing left to cancel.
        if self.task is None or self.cancel_requested or self.finishing:
            return
        self.cancel_requested = True
        self.task.cancel()

    async def execute(self, message: str) -> ExecutionOutcome:
        """Run the loop on a new user message until a `Finish`; see `AgentExecutor`."""
        finish: Finish
        try:
            if self.agent.store is not None and self.agent.session_id is None:
                title = textwrap.shorten(message, width=80, placeholder=" …")
                info = await self.agent.store.create(
                    agent=self.agent.config.name, title=title, task=message
                )
                self.agent.session_id = info.id
            self._close_pending("the previous run ended before this call finished")
            self.agent.history.add(UserMessage(content=message))
            await self.emit(
                RunStarted,
                task=message,
                agent=self.agent.config.name,
                model=_model_name(self.agent.llm),
            )
            if self.agent._counter_note is not None:
                await self.emit(WarningRaised, message=self.agent._counter_note, source="tokens")
            finish = await self._loop()
        except asyncio.CancelledError:
            self._close_pending("the run was cancelled before this call finished")
            self.finishing = True
            if not self.cancel_requested:
                await self._finish(Finish(StopReason.CANCELLED))
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            finish = Finish(StopReason.CANCELLED)
        # The loop's own failures (a summarizer's model error during pruning, a store that
        # cannot write, a bug) end the run with an error instead of leaving it half-open.
        except Exception as err:
            self._close_pending("the run failed before this call finished")
            wrapped = (
                err if isinstance(err, AgentFlowError) else RunError(f"{type(err).__name__}: {err}")
            )
            await self._error(wrapped, fatal=True)
            finish = Finish(StopReason.ERROR, text=str(wrapped))
        self.finishing = True
        return await self._finish(finish)

    async def _loop(self) -> Finish:
        while True:
            limit = self._limit_reached()
            if limit is not None:
                return limit
            self.iteration += 1
            await self.emit(IterationStarted, iteration=self.iteration)
            step = await _model_step(self)
            if isinstance(step, RunTools):
                step = await _tool_step(self, step)
            if isinstance(step, Finish):
                return step
            await self._after_step()

    def _limit_reached(self) -> Finish | None:
        config = self.agent.config
        if self.iteration >= config.max_iterations:
            return Finish(StopReason.MAX_ITERATIONS)
        if config.max_total_tokens is not None and self.usage.total_tokens >= (
            config.max_total_tokens
        ):
            return Finish(StopReason.TOKEN_LIMIT)
        if config.max_cost_usd is not None and config.pricing is not None:
            cost = config.pricing.cost(self.usage.prompt_tokens, self.usage.completion_tokens)
            if cost >= config.max_cost_usd:
                return Finish(StopReason.COST_LIMIT)
        return None

    async def _after_step(self) -> None:
        """Step 9: prune, then save the completed step."""
        report = await self.agent.context.prune_if_needed(tools=self.agent.offered_tools())
        if report is not None and report.changed:
            await self.emit(HistoryPruned, report=report)
        await self._save(status="active")

    async def _finish(self, finish: Finish) -> ExecutionOutcome:
        duration_ms = (time.perf_counter() - self.started) * 1000
        outcome = ExecutionOutcome(
            run_id=self.run_id,
            final_text=finish.text,
            output=finish.output,
            stop_reason=finish.reason,
            tool_uses=tuple(self.tool_uses),
            usage=self.usage,
            usage_per_call=tuple(self.usage_per_call),
            errors=tuple(self.errors),
            iterations=self.iteration,
            started_at=self.started_at,
            duration_ms=duration_ms,
            environment_version=self.agent.environment.version,
        )
        try:
            await self.emit(
                RunFinished,
                stop_reason=finish.reason.value,
                final_text=finish.text,
                output=finish.output,
                iterations=self.iteration,
                prompt_tokens=self.usage.prompt_tokens,
                completion_tokens=self.usage.completion_tokens,
                duration_ms=duration_ms,
            )
            await self._save(status=_session_status(finish.reason))
        finally:
            self.agent.events.close()
        return outcome

    # -- plumbing ----------------------------------------------------------------------

    def _close_pending(self, reason: str) -> None:
        """Answer calls left without results, so the history never has a dangling call."""
        for call in self.agent.history.pending_calls():
            self.agent.history.add(
                ToolResultEntry(
                    call_id=call.call_id,
                    tool_name=call.name,
                    content=f"error: {reason}",
                    is_error=True,
                )
            )

    async def _save(self, *, status: SessionStatus) -> None:
        if self.agent.store is None or self.agent.session_id is None:
            self.pending_events.clear()
            return
        events, self.pending_events = self.pending_events, []
        await self.agent.store.save_step(
            self.agent.session_id,
            history=self.agent.history,
            environment=self.agent.environment,
            events=events,
            status=status,
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
        """Number an event of this run, keep it for the next save, and publish it."""
        # Parallel tool calls emit concurrently: number and publish under one lock, so every
        # subscriber sees the events in sequence order.
        async with self.emit_lock:
            event = kind(run_id=self.run_id, seq=self.seq, **fields)
            self.seq += 1
            if self.agent.store is not None:
                self.pending_events.append(event)
            await self.agent.events.publish(event)


def _model_name(client: LLMClient) -> str:
    return str(getattr(client, "model", "") or type(client).__name__)


def _session_status(reason: StopReason) -> SessionStatus:
    if reason in (StopReason.COMPLETED, StopReason.ANSWERED, StopReason.CONVERSE):
        return "completed"
    if reason is StopReason.WAITING_FOR_USER:
        return "waiting"
    if reason is StopReason.CANCELLED:
        return "cancelled"
    # Limits, a stuck model, errors: the task did not get done.
    return "failed"
