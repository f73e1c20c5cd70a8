"""The adapter that publishes a tool executor's progress (`ToolHooks`) as run events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agent_flow._utils import weak_method
from agent_flow.events import (
    AgentEvent,
    ApprovalRequired,
    ApprovalResolved,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
)
from agent_flow.messages import ToolCall
from agent_flow.tools import ApprovalRequest, ApprovalResponse, ToolHooks, ToolResult


class _Emit(Protocol):
    """Publishes one event of the current run (`AgentExecutor._emit`)."""

    async def __call__(self, kind: Callable[..., AgentEvent], /, **fields: object) -> None: ...


class _EventHooks(ToolHooks):
    """Publishes the tool executor's progress as events of the current run.

    It holds its agent's `emit` weakly: the agent owns these hooks, and a strong bound
    method back would make the agent a reference cycle (freed only by a full collection).
    """

    def __init__(self, emit: _Emit) -> None:
        self._publish = weak_method(emit, None)

    async def _emit(self, kind: Callable[..., AgentEvent], /, **fields: object) -> None:
        publishing = self._publish(kind, **fields)
        if publishing is not None:  # None: the agent is gone, with its run
            await publishing

    async def call_started(self, call: ToolCall) -> None:
        await self._emit(ToolCallStarted, call_id=call.id, name=call.name, arguments=call.arguments)

    async def approval_required(self, call: ToolCall, request: ApprovalRequest) -> None:
        await self._emit(
            ApprovalRequired,
            call_id=call.id,
            name=call.name,
            arguments=call.arguments,
            reason=request.reason,
        )

    async def approval_resolved(self, call: ToolCall, response: ApprovalResponse) -> None:
        await self._emit(
            ApprovalResolved,
            call_id=call.id,
            name=call.name,
            approved=response.approved,
            decided_by=response.decided_by,
            reason=response.reason,
        )

    async def call_finished(self, call: ToolCall, result: ToolResult) -> None:
        duration_ms = result.duration_seconds * 1000
        if result.failed:
            await self._emit(
                ToolCallFailed,
                call_id=call.id,
                name=call.name,
                error=result.content,
                duration_ms=duration_ms,
                error_kind=result.error_kind,
            )
        else:
            await self._emit(
                ToolCallCompleted,
                call_id=call.id,
                name=call.name,
                content=result.content,
                is_error=result.is_error,
                truncated=result.truncated,
                duration_ms=duration_ms,
            )
