"""Tool gating: which registered tools an agent is offered and may call right now.

A `ToolFilter` is plain data (the config's allow and deny lists, the tools that are always
callable, the active skill's allowed tools) with one pure question, `ToolFilter.allows`.
The executor builds one from its config and skill whenever it asks, so a skill switch takes
effect at the next prompt. Its deny list is the config's ``deny_tools`` together with the
``denied_tools`` of the tool executor's `PolicyEngine`: a denied tool is never offered, and
the loop refuses a call to it (as the engine does).

An `MCPFilter` is the same kind of question for MCP components, per agent (the ``[agent.mcp]``
table, as in Aurite's ``client_ids`` and ``exclude_components``): which servers the agent may
use, and which of their tools, resources and prompts it never sees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent_flow.messages import ToolDefinition
from agent_flow.tools.control import CONTROL_TOOL_NAMES, update_plan
from agent_flow.tools.mcp_config import ComponentKind
from agent_flow.tools.policy import matches_any

__all__ = ["LOOP_TOOL_NAMES", "MCPFilter", "ToolFilter"]

# The loop-control tools and the plan tool stay callable under any skill.
LOOP_TOOL_NAMES: frozenset[str] = CONTROL_TOOL_NAMES | {update_plan.name}


@dataclass(frozen=True, slots=True)
class ToolFilter:
    """Which registered tools may be offered and called; patterns are `fnmatch` globs.

    The rules, in order: a tool matching `deny` (or in `foreign`) is never callable; a tool
    in `always` is callable; with an `allow` list, a tool matching none of it is not; with a
    `skill` list, a tool is callable only if it matches one of those; anything else is.

    Attributes:
        allow: Only these tools are callable (``None``: all).
        deny: These tools never are, not even those in `always` (the agent's
            ``config.deny_tools`` and its tool executor's ``policy.denied_tools``).
        always: Tool names callable whatever `allow` and `skill` say (the loop-control
            tools when the agent offers them); empty for none.
        skill: The active skill's allowed tools (``None``: no skill is active; an empty
            tuple allows only the tools in `always`).
        foreign: Exact names of tools that belong to other agents sharing the tool executor
            (their MCP servers' tools): never callable, like `deny`.
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    always: frozenset[str] = frozenset()
    skill: tuple[str, ...] | None = None
    foreign: frozenset[str] = frozenset()

    def allows(self, name: str) -> bool:
        """Whether the registered tool called `name` may be offered and called."""
        if name in self.foreign or matches_any(name, self.deny):
            return False
        if name in self.always:
            return True
        if self.allow is not None and not matches_any(name, self.allow):
            return False
        if self.skill is not None:
            return matches_any(name, self.skill)
        return True

    def select(self, definitions: Iterable[ToolDefinition]) -> list[ToolDefinition]:
        """The definitions of the tools this filter allows, in the given order."""
        return [d for d in definitions if self.allows(d.name)]


_KIND_PREFIXES: dict[str, ComponentKind] = {
    "tool:": "tools",
    "resource:": "resources",
    "prompt:": "prompts",
}


@dataclass(frozen=True, slots=True)
class MCPFilter:
    """Which MCP servers, and which of their components, one agent may use.

    Attributes:
        clients: Server name globs the agent may use (``None``: every server).
        exclude: Component patterns hidden from the agent: a glob on ``<server>/<name>`` or
            on ``<name>`` alone (a tool's or prompt's name on its server, a resource's URI, a
            template's URI template), optionally prefixed by ``tool:``, ``resource:`` or
            ``prompt:`` to apply to that kind only.
    """

    clients: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()

    def allows_server(self, server: str) -> bool:
        """Whether the agent may use the server called `server` at all."""
        return self.clients is None or matches_any(server, self.clients)

    def allows(self, server: str, kind: ComponentKind, name: str) -> bool:
        """Whether the component `name` of kind `kind` on `server` is offered to the agent."""
        if not self.allows_server(server):
            return False
        candidates = (f"{server}/{name}", name)
        for pattern in self.exclude:
            body = _pattern_for(pattern, kind)
            if body is not None and any(matches_any(c, (body,)) for c in candidates):
                return False
        return True


def _pattern_for(pattern: str, kind: ComponentKind) -> str | None:
    """The glob of `pattern` if it applies to components of `kind` (its prefix removed)."""
    for prefix, prefix_kind in _KIND_PREFIXES.items():
        if pattern.startswith(prefix):
            return pattern[len(prefix) :] if prefix_kind == kind else None
    return pattern
