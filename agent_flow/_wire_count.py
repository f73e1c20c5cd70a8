"""Counting a prompt as a client's `PromptFormat` sends it, for the `ContextManager`'s budget.

A client in XML tool mode does not send the neutral prompt: the tool schemas and calling rules
join the system message, tool calls become ``<tool>`` blocks in the assistant's text and tool
results become ``<tool_result>`` user messages, merged with their neighbours. `WireCounter`
gives the `ContextManager` the costs of that rendering:

- `tools_cost`: what offering the tools adds to a system message (the tools prompt);
- `unit_cost`: what one history unit costs rendered on its own (cached per unit object, so
  a step renders only the units that are new);
- `count`: the exact cost of a whole rendered prompt, which the manager checks against the
  budget before returning it (merging neighbours and the seams between texts can change a
  count by a few tokens; the check, not the estimate, is the guarantee). Counts are cached by
  message text, so a step tokenizes only what is new.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_flow.history import Unit
from agent_flow.llm.base import PromptFormat
from agent_flow.messages import ChatMessage, ToolDefinition
from agent_flow.tokens import REPLY_PRIMING_TOKENS, TokenCounter

__all__ = ["WireCounter"]

# Caches are cleared when they grow past this many entries beyond what the prompt needs.
_SLACK = 256


class WireCounter:
    """Counts prompts the way `prompt_format` puts them on the wire, with `counter`.

    Args:
        prompt_format: How the client renders the prompt.
        counter: The token counter (the history's).
    """

    def __init__(self, prompt_format: PromptFormat, counter: TokenCounter) -> None:
        self.prompt_format = prompt_format
        self.counter = counter
        self._tools: tuple[str, tuple[ToolDefinition, ...], int] | None = None
        self._units: dict[int, tuple[Unit, int]] = {}
        self._messages: dict[tuple[str, str | None, str], int] = {}

    def tools_cost(self, system_text: str, tools: tuple[ToolDefinition, ...]) -> int:
        """Return the tokens offering `tools` adds to a prompt whose system text is given."""
        cached = self._tools
        if (
            cached is not None
            and cached[0] == system_text
            and len(cached[1]) == len(tools)
            and all(a is b for a, b in zip(cached[1], tools, strict=True))
        ):
            return cached[2]
        system = ChatMessage(role="system", content=system_text)
        messages, wire_tools = self.prompt_format.render([system], tools)
        with_tools = (
            self.counter.count_messages(messages)
            - REPLY_PRIMING_TOKENS
            + self.counter.count_tools(wire_tools)
        )
        cost = max(0, with_tools - self.counter.count_message(system))
        self._tools = (system_text, tools, cost)
        return cost

    def unit_cost(self, unit: Unit) -> int:
        """Return what `unit` costs rendered on its own (no tools offered)."""
        cached = self._units.get(id(unit))
        if cached is not None and cached[0] is unit:
            return cached[1]
        messages, _ = self.prompt_format.render(unit.messages, ())
        cost = sum(self._message_cost(message) for message in messages)
        self._units[id(unit)] = (unit, cost)  # holding the unit keeps its id from being reused
        return cost

    def unit_costs(self, units: Sequence[Unit]) -> list[int]:
        """Return `unit_cost` of each unit, forgetting units no longer in the history."""
        costs = [self.unit_cost(unit) for unit in units]
        if len(self._units) > 2 * len(units) + _SLACK:
            self._units = {id(unit): (unit, cost) for unit, cost in zip(units, costs, strict=True)}
        return costs

    def count(self, messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]) -> int:
        """Return the exact tokens of the prompt as sent (reply priming included)."""
        wire, wire_tools = self.prompt_format.render(messages, tools)
        costs = [self._message_cost(message) for message in wire]
        if len(self._messages) > 2 * len(wire) + _SLACK:
            self._messages = {
                (m.role, m.name, m.content): cost
                for m, cost in zip(wire, costs, strict=True)
                if not m.tool_calls
            }
        return REPLY_PRIMING_TOKENS + self.counter.count_tools(wire_tools) + sum(costs)

    def _message_cost(self, message: ChatMessage) -> int:
        if message.tool_calls:  # native calls are counted by the counter's own rules
            return self.counter.count_message(message)
        key = (message.role, message.name, message.content)
        cost = self._messages.get(key)
        if cost is None:
            cost = self.counter.count_message(message)
            self._messages[key] = cost
        return cost
