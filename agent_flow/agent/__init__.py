"""The agent: `AgentExecutor`, the loop it runs, and what a run produces.

The pieces, by module:

- `executor`: `AgentExecutor`, its construction, `resume`, events, skills and
  `run`/`send`/`cancel`;
- `outcome`: `StopReason`, the loop's steps (`Continue`, `RunTools`, `Finish`), `ToolUse`,
  `RunErrorInfo` and `ExecutionOutcome`;
- `_loop`: one run, from the user's message to its outcome (cancellation, errors, saving);
- `_steps`: the model step and the tool step;
- `_output`: validating a final answer against the output schema;
- `_deferred`: the calls a run hands to its caller (external tools, deferred approvals) and
  the `DeferredResults` that answer them;
- `_hooks`: the tool executor's progress as run events;
- `_build`: the counter, pruning strategy and tool executor a config describes
  (`counter_for`, `tool_executor_from_config`).
"""

from __future__ import annotations

from agent_flow.agent._build import counter_for, tool_executor_from_config
from agent_flow.agent._deferred import DeferredResults
from agent_flow.agent.executor import AgentExecutor
from agent_flow.agent.outcome import (
    Continue,
    DeferredCall,
    ExecutionOutcome,
    Finish,
    RunTools,
    StopReason,
    ToolUse,
)

__all__ = [
    "AgentExecutor",
    "Continue",
    "DeferredCall",
    "DeferredResults",
    "ExecutionOutcome",
    "Finish",
    "RunTools",
    "StopReason",
    "ToolUse",
    "counter_for",
    "tool_executor_from_config",
]
