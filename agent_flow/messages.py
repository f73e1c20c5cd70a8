"""The neutral chat-message model every part of agent_flow speaks.

History renders to these messages, the ContextManager counts and assembles them, and only
the LLM clients convert them to and from a provider's wire format. They mirror the
chat-completions roles because every OpenAI-compatible server understands those, but they
carry no vendor types.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from agent_flow._types import FrozenModel, JsonObject
from agent_flow._unicode import json_is_clean, mend_json
from agent_flow._utils import loads_json

__all__ = ["ChatMessage", "Role", "ToolCall", "ToolDefinition", "parse_tool_arguments"]

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(FrozenModel):
    """A tool call as the model made it: the one call type from the model to the history.

    The LLM clients build it, the tool executor runs it, the history records it (inside a
    `agent_flow.history.ToolCallEntry`) and the prompt sends it back. Its arguments are
    parsed once, on first use, by `parse_tool_arguments`; the raw text is what is kept and
    sent, so a call the model wrote badly is shown back to it exactly as written.

    Attributes:
        id: The call id that ties the call to its result (unique within a conversation).
        name: The tool name as the model wrote it (empty if the model sent none).
        arguments: The arguments exactly as the model wrote them (a JSON text, perhaps invalid).
        problem: Why the call as a whole is unusable, when the LLM layer found out while
            reading it (a malformed XML tool block, say); not persisted.
    """

    id: str
    name: str
    arguments: str = "{}"
    problem: str | None = Field(default=None, exclude=True, repr=False)

    @classmethod
    def from_raw(
        cls, id: str, name: str, arguments: str, *, problem: str | None = None
    ) -> ToolCall:
        """Build a call from the text a model streamed (trimmed; empty text means ``{}``).

        Args:
            id: The call id.
            name: The tool name.
            arguments: The raw argument text.
            problem: A call-level problem the reader found, if any.
        """
        return cls(id=id, name=name, arguments=arguments.strip() or "{}", problem=problem)

    @cached_property
    def _parsed(self) -> tuple[JsonObject | None, str | None]:
        # Computed on first use and kept: not a field, so not persisted or compared.
        if self.problem is not None:
            return None, self.problem
        if not self.name:
            return None, "the tool call has no tool name"
        return parse_tool_arguments(self.arguments)

    @property
    def parsed_arguments(self) -> JsonObject | None:
        """The arguments as a JSON object, or ``None`` when the call is invalid."""
        return self._parsed[0]

    @property
    def parse_error(self) -> str | None:
        """Why the call is invalid (no name, arguments that are not a JSON object), or ``None``."""
        return self._parsed[1]

    @property
    def is_valid(self) -> bool:
        """Whether the call has a name and its arguments parse to a JSON object."""
        return self.parse_error is None


def parse_tool_arguments(raw: str) -> tuple[JsonObject | None, str | None]:
    """Parse a tool call's raw argument text: the one argument parser of agent_flow.

    Empty text means "no arguments" (``{}``), as many servers send for parameterless tools.
    A JSON string that itself holds a JSON object (some models encode the object twice) is
    decoded once more.

    Args:
        raw: The arguments exactly as the model wrote them.

    Returns:
        ``(arguments, None)`` when the text is a JSON object, else ``(None, problem)`` where
        the problem is one sentence the tool executor hands back to the model.
    """
    text = raw.strip()
    if not text:
        return {}, None
    try:
        value = loads_json(text)
        if isinstance(value, str) and value.strip().startswith("{"):
            value = loads_json(value)
    except json.JSONDecodeError as err:
        return None, (
            f"the arguments are not valid JSON ({err.msg} at character {err.pos}); "
            "send a JSON object"
        )
    except RecursionError:
        return None, "the arguments are not valid JSON (nested too deeply); send a JSON object"
    except ValueError as err:
        return None, f"the arguments are not valid JSON ({err}); send a JSON object"
    if not isinstance(value, dict):
        kind = _JSON_KIND.get(type(value), type(value).__name__)
        return None, f"the arguments must be a JSON object, not a JSON {kind}"
    if "\\u" in text and not json_is_clean(value):  # an escaped lone surrogate
        value = mend_json(value)
    return cast(JsonObject, value), None


_JSON_KIND: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


class ChatMessage(FrozenModel):
    """One message of a prompt.

    Attributes:
        role: Who speaks.
        content: The text.
        tool_calls: The calls an assistant message makes (assistant only).
        tool_call_id: The call a tool message answers (tool only).
        name: The tool's name on a tool message.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


def _empty_parameters() -> JsonObject:
    return {"type": "object", "properties": {}}


class ToolDefinition(BaseModel):
    """What the model is told about a tool: its name, description and parameter schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: JsonObject = Field(default_factory=_empty_parameters)
