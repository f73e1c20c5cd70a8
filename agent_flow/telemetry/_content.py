"""Message contents in the GenAI conventions' JSON shapes (recorded only when asked for).

``gen_ai.input.messages`` and ``gen_ai.output.messages`` follow the conventions' input and
output messages JSON schemas: a list of ``{"role", "parts": [...]}`` messages whose parts are
``text``, ``reasoning``, ``tool_call`` (``id``, ``name``, ``arguments`` parsed as JSON when
they are valid) and ``tool_call_response`` (``id``, ``response``); an output message has a
``finish_reason`` (``stop``, ``length``, ``content_filter``, ``tool_call``, or the server's
own word). ``gen_ai.tool.definitions`` is the list of offered tools as the chat-completions
API describes them (``type``, ``name``, ``description``, ``parameters``). Spans hold them as
JSON strings: the SDK's span attributes take no structured values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_flow._utils import compact_json
from agent_flow.llm.base import Completion
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition

__all__ = ["input_messages", "output_messages", "text_message", "tool_definitions"]

# The conventions' finish reasons, from agent_flow's (`agent_flow.llm.base.FinishReason`).
_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_call",
    "content_filter": "content_filter",
}


def _call_part(call: ToolCall) -> dict[str, Any]:
    parsed = call.parsed_arguments
    return {
        "type": "tool_call",
        "id": call.id,
        "name": call.name,
        "arguments": parsed if parsed is not None else call.arguments,
    }


def _message(message: ChatMessage) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        )
    elif message.content:
        parts.append({"type": "text", "content": message.content})
    parts.extend(_call_part(call) for call in message.tool_calls)
    return {"role": message.role, "parts": parts}


def input_messages(messages: Sequence[ChatMessage]) -> str:
    """The prompt as ``gen_ai.input.messages``: every message, in the order sent."""
    return compact_json([_message(message) for message in messages])


def output_messages(completion: Completion) -> str:
    """The answer as ``gen_ai.output.messages``: one assistant message (one choice)."""
    parts: list[dict[str, Any]] = []
    if completion.thinking:
        parts.append({"type": "reasoning", "content": completion.thinking})
    if completion.text:
        parts.append({"type": "text", "content": completion.text})
    parts.extend(_call_part(call) for call in completion.tool_calls)
    finish = _FINISH_REASONS.get(completion.finish_reason)
    if finish is None:
        finish = completion.raw_finish_reason or completion.finish_reason
    return compact_json([{"role": "assistant", "parts": parts, "finish_reason": finish}])


def text_message(role: str, text: str, finish_reason: str | None = None) -> str:
    """One text message (a run's task, its final answer) in the same shape."""
    message: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": text}]}
    if finish_reason is not None:
        message["finish_reason"] = finish_reason
    return compact_json([message])


def tool_definitions(tools: Sequence[ToolDefinition]) -> str:
    """The offered tools as ``gen_ai.tool.definitions``."""
    return compact_json(
        [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            }
            for tool in tools
        ]
    )
