"""Reading a `RunAgentInput`: the new message, the answers, the front end's tools and context.

What a run takes from the input (`read_turn`):

- **the new message and the answers**: the messages after the last assistant message. Their
  user messages are the run's new message (several are joined by blank lines); their tool
  messages answer the calls the session's last run handed over: a front-end tool's result, or
  (a tool message for ``approval:<call id>``) the answer to an approval. Tool messages for
  calls the session does not wait for (answered already) are ignored; the messages before the
  last assistant message are the client's copy of what the server already has.
- **a new thread's history**: when the session's history is empty, every message but the new
  user message seeds it (`seed_entries`): user and assistant messages, tool calls and their
  results; a call the messages leave unanswered gets an error result, a result without its call
  is left out, system, developer, reasoning and activity messages are left out (the server's
  system prompt rules; `context` is the way to tell the agent more).
- **tools**: the front end's tools, offered to the model for this run beside the server's
  (`frontend_tools`). A tool named ``approve_tool_call`` is not one: it says the client
  answers approvals itself (`APPROVAL_TOOL`).
- **context**: the entries, as ``[{"description": ..., "value": ...}]``, at
  ``/knowledge/extra/client_context`` (`CONTEXT_POINTER`), replaced by each run's (removed
  when a run brings none).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ag_ui.core import AssistantMessage, Message, RunAgentInput, ToolMessage, UserMessage

from agent_flow._types import JsonValue
from agent_flow._unicode import mend
from agent_flow.environment import Environment
from agent_flow.errors import ToolDefinitionError
from agent_flow.history import (
    AgentMessage,
    HistoryEntry,
    ToolCallEntry,
    ToolResultEntry,
)
from agent_flow.history import UserMessage as HistoryUserMessage
from agent_flow.messages import ToolCall
from agent_flow.server._errors import ApiError
from agent_flow.tools import ApprovalResponse, ExternalTool, ToolResult
from agent_flow.tools._registry import ToolRegistry

__all__ = [
    "APPROVAL_PREFIX",
    "APPROVAL_TOOL",
    "CONTEXT_POINTER",
    "FrontendTool",
    "Turn",
    "frontend_tools",
    "read_approval",
    "read_turn",
    "seed_entries",
    "write_context",
]

#: The tool a client declares to answer approvals itself: each approval the run needs reaches
#: it as a call of this tool, answered by a tool message (see `read_approval`).
APPROVAL_TOOL = "approve_tool_call"
#: The id of that call: this prefix and the id of the call waiting for approval.
APPROVAL_PREFIX = "approval:"
#: Where the run input's context lands in the environment.
CONTEXT_POINTER = "/knowledge/extra/client_context"
#: The names a front-end tool may have (what every model provider accepts).
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NO_ANSWER = "no result was given for this call"


class FrontendTool(ExternalTool):
    """An AG-UI front end's tool, registered in the session's tool executor for one run."""


def _text(content: object) -> str:
    """The text of a message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [getattr(part, "text", None) for part in content]
        return "".join(part for part in parts if isinstance(part, str))
    return ""


@dataclass(frozen=True)
class Turn:
    """What one run input asks of its thread.

    Attributes:
        text: The new user message (None: none).
        results: Front-end tool results, by call id (the client's tool messages).
        approvals: Approval answers, by the id of the call waiting for approval.
        seed: The messages that seed a new thread's history (all but the new message).
        approvals_in_band: The client answers approvals itself (it declared `APPROVAL_TOOL`).
    """

    text: str | None
    results: dict[str, ToolResult] = field(default_factory=dict)
    approvals: dict[str, ApprovalResponse] = field(default_factory=dict)
    seed: tuple[Message, ...] = ()
    approvals_in_band: bool = False


def read_approval(content: str) -> ApprovalResponse:
    """An approval answer from a tool message's text; anything unclear is a refusal.

    ``{"approved": true}`` approves (``"reason"`` may say why); so does a bare ``true``.
    ``{"approved": false, "reason": ...}`` or ``false`` refuse; any other text refuses, with
    the text as the reason.
    """
    try:
        value = json.loads(content)
    except ValueError:
        return ApprovalResponse(approved=False, reason=content.strip()[:500])
    if isinstance(value, bool):
        return ApprovalResponse(approved=value)
    if isinstance(value, dict):
        reason = value.get("reason")
        return ApprovalResponse(
            approved=value.get("approved") is True,
            # The text was UTF-8, but an escape in it may still make a lone surrogate.
            reason=mend(reason[:500]) if isinstance(reason, str) else "",
        )
    return ApprovalResponse(approved=False, reason=content.strip()[:500])


def read_turn(run_input: RunAgentInput) -> Turn:
    """The new message and answers of `run_input` (see the module doc).

    Raises:
        ApiError: 422 when the input has no messages.
    """
    messages = list(run_input.messages)
    if not messages:
        raise ApiError(
            422, "invalid_field", "messages is empty: send the conversation", field="messages"
        )
    last_assistant = max(
        (i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)), default=-1
    )
    tail = messages[last_assistant + 1 :]
    texts = [t for m in tail if isinstance(m, UserMessage) and (t := _text(m.content))]
    results: dict[str, ToolResult] = {}
    approvals: dict[str, ApprovalResponse] = {}
    for message in tail:
        if not isinstance(message, ToolMessage):
            continue
        content = _text(message.content)
        if message.tool_call_id.startswith(APPROVAL_PREFIX):
            approvals[message.tool_call_id[len(APPROVAL_PREFIX) :]] = read_approval(content)
        elif message.error is not None:
            results[message.tool_call_id] = ToolResult.error(message.error or content)
        else:
            results[message.tool_call_id] = ToolResult(content=content)
    seed = (
        *messages[: last_assistant + 1],
        *(m for m in tail if not isinstance(m, UserMessage)),
    )
    declared = {tool.name for tool in run_input.tools or ()}
    return Turn(
        text="\n\n".join(texts) or None,
        results=results,
        approvals=approvals,
        seed=seed,
        approvals_in_band=APPROVAL_TOOL in declared,
    )


def seed_entries(messages: Sequence[Message]) -> list[HistoryEntry]:
    """History entries for a new thread from its messages (see the module doc).

    Every call gets exactly one result, right after its assistant turn: the client's, or an
    error result saying none was given; results without their call are left out.
    """
    entries: list[HistoryEntry] = []
    open_calls: dict[str, str] = {}  # the last assistant turn's calls without a result
    seen: set[str] = set()

    def close() -> None:
        for call_id, name in open_calls.items():
            entries.append(
                ToolResultEntry(call_id=call_id, tool_name=name, content=_NO_ANSWER, is_error=True)
            )
        open_calls.clear()

    for message in messages:
        if isinstance(message, ToolMessage):
            name = open_calls.pop(message.tool_call_id, None)
            if name is not None:
                error = message.error
                entries.append(
                    ToolResultEntry(
                        call_id=message.tool_call_id,
                        tool_name=name,
                        content=error if error else _text(message.content),
                        is_error=error is not None,
                    )
                )
            continue
        if isinstance(message, UserMessage):
            close()
            if text := _text(message.content):
                entries.append(HistoryUserMessage(content=text))
        elif isinstance(message, AssistantMessage):
            close()
            if message.content:
                entries.append(AgentMessage(content=message.content))
            for tool_call in message.tool_calls or ():
                if tool_call.id in seen or not tool_call.id or not tool_call.function.name:
                    continue
                seen.add(tool_call.id)
                entries.append(
                    ToolCallEntry(
                        call=ToolCall(
                            id=tool_call.id,
                            name=tool_call.function.name,
                            arguments=tool_call.function.arguments,
                        )
                    )
                )
                open_calls[tool_call.id] = tool_call.function.name
    close()
    return entries


def frontend_tools(run_input: RunAgentInput, taken: Sequence[str]) -> list[ExternalTool]:
    """The front end's tools of `run_input` as `FrontendTool` s (`APPROVAL_TOOL` left out).

    Args:
        run_input: The run input.
        taken: The names of the server's own tools (a front-end tool may not take one).

    Raises:
        ApiError: 422 (field ``tools``) for a name providers refuse, a name given twice or
            taken by a server tool, or parameters that are not a JSON schema of an object.
    """
    tools: list[ExternalTool] = []
    check = ToolRegistry()
    for declared in run_input.tools or ():
        name = declared.name
        if name == APPROVAL_TOOL:
            continue
        if not _TOOL_NAME.match(name):
            raise _bad_tools(
                f"tool name {name!r} is not one a model provider accepts; use 1 to 64 of "
                "a-z, A-Z, 0-9, _ and -"
            )
        if name in taken:
            raise _bad_tools(f"tool {name!r} is a tool of the server's; name yours otherwise")
        parameters: Any = declared.parameters
        if parameters is None or parameters == {}:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise _bad_tools(f"the parameters of tool {name!r} must be a JSON schema object")
        tool = FrontendTool(name, declared.description, parameters)
        try:
            check.register(tool)
        except ToolDefinitionError as err:
            raise _bad_tools(f"tool {name!r}: {err}") from None
        tools.append(tool)
    return tools


def _bad_tools(message: str) -> ApiError:
    return ApiError(422, "invalid_field", message, field="tools")


def write_context(environment: Environment, run_input: RunAgentInput) -> None:
    """Put the input's context at `CONTEXT_POINTER` (removed when there is none)."""
    entries: list[JsonValue] = [
        {"description": entry.description, "value": entry.value}
        for entry in run_input.context or ()
    ]
    present = environment.has(CONTEXT_POINTER)
    if not entries:
        if present:
            environment.delete(CONTEXT_POINTER)
        return
    if not present or environment.get(CONTEXT_POINTER) != entries:
        environment.set(CONTEXT_POINTER, entries)
