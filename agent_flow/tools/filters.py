"""Tool gating: which registered tools an agent is offered and may call right now.

A `ToolFilter` is plain data (the config's allow and deny lists, the tools that are always
callable, the active skill's allowed tools) with one pure question, `ToolFilter.allows`.
The executor builds one from its config and skill whenever it asks, so a skill switch takes
effect at the next prompt. Its deny list is the config's ``deny_tools`` together with the
``denied_tools`` of the tool executor's `PolicyEngine`: a denied tool is never offered, and
the loop refuses a call to it (as the engine does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent_flow.messages import ToolDefinition
from agent_flow.tools.control import CONTROL_TOOL_NAMES, update_plan
from agent_flow.tools.policy import matches_any

__all__ = ["LOOP_TOOL_NAMES", "ToolFilter"]

# The loop-control tools and the plan tool stay callable under any skill.
LOOP_TOOL_NAMES: frozenset[str] = CONTROL_TOOL_NAMES | {update_plan.name}


@dataclass(frozen=True, slots=True)
class ToolFilter:
    """Which registered tools may be offered and called; patterns are `fnmatch` globs.

    The rules, in order: a tool matching `deny` is never callable; a tool in `always` is
    callable; with an `allow` list, a tool matching none of it is not; with a `skill` list,
    a tool is callable only if it matches one of those; anything else is.

    Attributes:
        allow: Only these tools are callable (``None``: all).
        deny: These tools never are, not even those in `always` (the agent's
            ``config.deny_tools`` and its tool executor's ``policy.denied_tools``).
        always: Tool names callable whatever `allow` and `skill` say (the loop-control
            tools when the agent offers them); empty for none.
        skill: The active skill's allowed tools (``None``: no skill is active; an empty
            tuple allows only the tools in `always`).
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    always: frozenset[str] = frozenset()
    skill: tuple[str, ...] | None = None

    def allows(self, name: str) -> bool:
        """Whether the registered tool called `name` may be offered and called."""
        if matches_any(name, self.deny):
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
