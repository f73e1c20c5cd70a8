"""The neutral chat-message model every part of agent_flow speaks.

History renders to these messages, the ContextManager counts and assembles them, and only
the LLM clients convert them to and from a provider's wire format. They mirror the
chat-completions roles because every OpenAI-compatible server understands those, but they
carry no vendor types.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_flow._types import JsonObject

__all__ = ["ChatMessage", "Role", "ToolCallRequest", "ToolDefinition"]

Role = Literal["system", "user", "assistant", "tool"]


class ToolCallRequest(BaseModel):
    """A tool call as the model asked for it.

    Attributes:
        id: The call id that ties the call to its result.
        name: The tool name.
        arguments: The arguments exactly as the model wrote them (a JSON string, perhaps invalid).
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = "{}"


class ChatMessage(BaseModel):
    """One message of a prompt.

    Attributes:
        role: Who speaks.
        content: The text.
        tool_calls: The calls an assistant message makes (assistant only).
        tool_call_id: The call a tool message answers (tool only).
        name: The tool's name on a tool message.
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()
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
