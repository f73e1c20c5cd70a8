"""The fields of one chat-completions request body, from a neutral request and client defaults.

Private to `agent_flow.llm`. `BodyDefaults` holds what an `OpenAIClient` sends when a request
does not say (model, ``tool_choice``, temperature, the output limit and its field name, extra
provider fields); `body_fields` merges a request into them. The messages are encoded
separately (see `agent_flow.llm._openai_wire.encode_body`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

from agent_flow._types import JsonObject, JsonValue
from agent_flow.llm._openai_wire import offered_tools_to_wire, tool_choice_to_wire
from agent_flow.llm.base import LLMRequest
from agent_flow.messages import ToolDefinition

__all__ = ["BodyDefaults", "body_fields"]


@dataclass
class BodyDefaults:
    """What a client sends when a request does not set it.

    Attributes:
        model: The model name.
        tool_choice: Sent whenever tools are offered and the request sets none.
        temperature: The sampling temperature.
        max_tokens: The output limit: sent when a request sets none, and caps a request's own.
        max_tokens_field: The body field the limit goes in.
        extra_body: Provider-specific fields merged into every body.
    """

    model: str
    tool_choice: str | None = "auto"
    temperature: float | None = None
    max_tokens: int | None = None
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    extra_body: JsonObject = field(default_factory=dict)


def body_fields(
    request: LLMRequest,
    tools: Sequence[ToolDefinition],
    defaults: BodyDefaults,
    *,
    stream: bool,
    stream_usage: bool,
) -> JsonObject:
    """Every field of the body but ``messages``.

    Args:
        request: The neutral request.
        tools: The tools to offer natively (none in XML tool mode, which puts them in the prompt).
        defaults: The client's defaults.
        stream: Whether to ask for a streamed answer.
        stream_usage: Whether a streamed answer should carry usage (``stream_options``).
    """
    fields: JsonObject = {"model": request.model or defaults.model}
    if stream:
        fields["stream"] = True
        if stream_usage:
            fields["stream_options"] = {"include_usage": True}
    if tools:
        # Shared and encoded once per list of definitions (see `encode_body`).
        fields["tools"] = cast(list[JsonValue], offered_tools_to_wire(tools))
        choice = request.tool_choice or defaults.tool_choice
        if choice is not None:
            fields["tool_choice"] = tool_choice_to_wire(choice)
        if request.parallel_tool_calls is not None:
            fields["parallel_tool_calls"] = request.parallel_tool_calls
    temperature = request.temperature if request.temperature is not None else defaults.temperature
    if temperature is not None:
        fields["temperature"] = temperature
    if request.top_p is not None:
        fields["top_p"] = request.top_p
    max_tokens = _smaller(request.max_tokens, defaults.max_tokens)
    if max_tokens is not None:
        fields[defaults.max_tokens_field] = max_tokens
    if request.stop:
        fields["stop"] = list(request.stop)
    if request.seed is not None:
        fields["seed"] = request.seed
    if request.response_format is not None:
        fields["response_format"] = request.response_format
    if defaults.extra_body:
        fields.update(defaults.extra_body)
    if request.extra_body:
        fields.update(request.extra_body)
    return fields


def _smaller(a: int | None, b: int | None) -> int | None:
    """The smaller of two optional limits (``None``: no limit)."""
    if a is None:
        return b
    return a if b is None else min(a, b)
