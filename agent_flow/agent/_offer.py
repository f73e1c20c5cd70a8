"""The tools an agent offers now: its `ToolFilter` and the definitions it selects.

The loop asks several times per turn (the prompt, the tool gate, pruning), and the answer only
changes when the config, the active skill, the policy's deny list, the registered tools, the
other agents' MCP tools on a shared executor or the output type do: both are kept until one of
those changes. With an output schema, the built-in ``task_completion`` is offered with that
schema as its ``result`` (`with_result_schema`), so the first request already tells the model
what to return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_flow.messages import ToolDefinition
from agent_flow.tools.control import task_completion, with_result_schema
from agent_flow.tools.filters import LOOP_TOOL_NAMES, ToolFilter

if TYPE_CHECKING:
    from agent_flow.agent.executor import AgentExecutor


class _ToolOffer:
    """One agent's current `ToolFilter` and offered definitions, rebuilt when they change."""

    __slots__ = ("_filter", "_key", "_offered")

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._filter = ToolFilter()
        self._offered: tuple[ToolDefinition, ...] = ()

    def _refresh(self, agent: AgentExecutor) -> None:
        tools = agent.tools
        policy = tools.policy
        # Other agents' MCP tools on a shared executor (the same set while nothing changes).
        foreign = agent.mcp.hidden()
        # Compared by identity first (tuple equality), so an unchanged agent costs a few checks.
        key = (
            agent.config,
            agent.skill,
            tools,
            policy,
            policy.denied_tools,
            tools.version,
            foreign,
            agent.output_type,
        )
        if key == self._key:
            return
        config = agent.config
        self._filter = ToolFilter(
            allow=config.allow_tools,
            deny=(*config.deny_tools, *policy.denied_tools),
            always=LOOP_TOOL_NAMES if config.control_tools else frozenset(),
            skill=agent.skill.allowed_tools if agent.skill is not None else None,
            foreign=foreign,
        )
        offered = self._filter.select(tools.definitions())
        schema = (
            agent.output_type.model_json_schema()
            if agent.output_type is not None
            else config.output_schema
        )
        registered = tools.tools.get(task_completion.name)
        if schema is not None and registered is not None and registered.tool is task_completion:
            offered = [
                with_result_schema(d, schema) if d.name == registered.name else d for d in offered
            ]
        self._offered = tuple(offered)
        self._key = key

    def gate(self, agent: AgentExecutor) -> ToolFilter:
        """The filter that decides which registered tools `agent` may call now."""
        self._refresh(agent)
        return self._filter

    def offered(self, agent: AgentExecutor) -> list[ToolDefinition]:
        """The definitions of the tools `agent` offers its model now, in registration order."""
        self._refresh(agent)
        return list(self._offered)
