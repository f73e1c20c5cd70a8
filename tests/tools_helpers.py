"""The tools and name rule shared by the tool executor tests."""

from __future__ import annotations

import re

from agent_flow.errors import ToolError
from agent_flow.messages import ToolCall
from agent_flow.tools import (
    ApprovalRequest,
    ApprovalResponse,
    ToolHooks,
    ToolResult,
    tool,
)

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@tool
def search(query: str, limit: int = 5) -> list[str]:
    """Search things.

    Args:
        query: What to look for.
        limit: How many results.
    """
    return [f"{query}-{i}" for i in range(limit)]


@tool
async def explode(message: str) -> str:
    """Raise an unexpected error."""
    raise RuntimeError(message)


@tool
async def refuse(message: str) -> str:
    """Raise a ToolError meant for the model."""
    raise ToolError(message)


class RecordingHooks(ToolHooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    async def call_started(self, call: ToolCall) -> None:
        self.events.append(("started", call.id))

    async def progress(
        self, call: ToolCall, progress: float, total: float | None, message: str | None
    ) -> None:
        self.events.append(("progress", call.id, f"{progress}/{total}", message or ""))

    async def approval_required(self, call: ToolCall, request: ApprovalRequest) -> None:
        self.events.append(("approval_required", call.id, request.reason))

    async def approval_resolved(self, call: ToolCall, response: ApprovalResponse) -> None:
        self.events.append(("approval_resolved", call.id, str(response.approved)))

    async def call_finished(self, call: ToolCall, result: ToolResult) -> None:
        self.events.append(("finished", call.id, result.error_kind or "ok"))
