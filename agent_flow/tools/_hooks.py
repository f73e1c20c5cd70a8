"""`ToolHooks`, the callbacks the executor awaits as calls progress, and the guard around them.

A hook that raises is logged and ignored (`_hook`): a listener never changes a result.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from agent_flow.messages import ToolCall
from agent_flow.tools.policy import ApprovalRequest, ApprovalResponse
from agent_flow.tools.results import ToolResult

# Logged under the public module's name, which is where users configure the executor's logs.
logger = logging.getLogger("agent_flow.tools.executor")


class ToolHooks:
    """Callbacks the executor awaits as calls progress; override the ones you need.

    The agent loop subclasses this to publish events (tool call started/completed/failed,
    approval required/resolved, progress). A hook that raises is logged and ignored: it never
    changes a result. Every method is a no-op by default.
    """

    async def call_started(self, call: ToolCall) -> None:
        """A call began (every call gets exactly one `call_finished` afterwards)."""

    async def progress(
        self, call: ToolCall, progress: float, total: float | None, message: str | None
    ) -> None:
        """A running tool reported progress."""

    async def approval_required(self, call: ToolCall, request: ApprovalRequest) -> None:
        """A call waits for approval."""

    async def approval_resolved(self, call: ToolCall, response: ApprovalResponse) -> None:
        """An approval request was answered."""

    async def call_finished(self, call: ToolCall, result: ToolResult) -> None:
        """A call produced its result (``result.failed`` when it could not run to completion)."""


async def _hook(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except Exception:
        logger.exception("a tool hook raised; ignoring it")
