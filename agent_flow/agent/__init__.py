"""The agent: `AgentExecutor`, the loop it runs, and what a run produces."""

from __future__ import annotations

from agent_flow.agent.executor import (
    AgentExecutor,
    Continue,
    ExecutionOutcome,
    Finish,
    RunTools,
    StopReason,
    ToolUse,
    tool_executor_from_config,
)

__all__ = [
    "AgentExecutor",
    "Continue",
    "ExecutionOutcome",
    "Finish",
    "RunTools",
    "StopReason",
    "ToolUse",
    "tool_executor_from_config",
]
