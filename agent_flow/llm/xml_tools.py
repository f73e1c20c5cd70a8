"""XML tool-call mode, for models without native tool calling.

The tool schemas and the calling rules go into the system prompt; the model answers with::

    <thinking>optional reasoning</thinking>
    Some words for the user.
    <tool>
    {"tool_name": "read_file", "arguments": {"path": "a.py"}}
    </tool>

`to_xml_messages` rewrites a neutral prompt for such a model (earlier tool calls become
``<tool>`` blocks in the assistant's text, tool results become ``<tool_result>`` blocks in
user messages), and `XmlToolParser` reads the answer back, incrementally: fed the text as it
streams in, it only ever releases text that cannot be part of a tag, so the XML of a call is
never shown as user-visible text even when ``<tool>`` is split across chunks. The
``<tool_call>`` / ``<think>`` spellings that several open models use are read too.

`XML_FORMAT` is the `agent_flow.llm.base.PromptFormat` of a client in XML mode: the
`ContextManager` counts the prompt through it, so the tools prompt in the system message and
the rewritten tool turns are inside the budget, not on top of it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Literal, TypeAlias

from agent_flow.messages import ChatMessage, Role, ToolDefinition

__all__ = [
    "XML_FORMAT",
    "XmlFormat",
    "XmlPiece",
    "XmlToolParser",
    "parse_tool_block",
    "render_tool_call",
    "render_tools_prompt",
    "to_xml_messages",
]

#: What the parser releases: user-visible text, reasoning, a closed tool block's inner text,
#: or the text of a tool block the answer never closed.
XmlPiece: TypeAlias = tuple[Literal["text", "thinking", "tool", "unclosed_tool"], str]

_OPENERS: dict[str, tuple[Literal["thinking", "tool"], str]] = {
    "<tool>": ("tool", "</tool>"),
    "<tool_call>": ("tool", "</tool_call>"),
    "<thinking>": ("thinking", "</thinking>"),
    "<think>": ("thinking", "</think>"),
}


class XmlToolParser:
    """Splits a model's answer into text, thinking and tool blocks as it streams in.

    Feed it the answer's text in any chunking; `feed` and `finish` return the pieces that are
    certain. Text that might still become a tag (a trailing ``"<to"``) is held back until the
    next chunk decides it.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._mode: Literal["text", "thinking", "tool"] = "text"
        self._closer = ""
        self._scan_from = 0

    def feed(self, text: str) -> list[XmlPiece]:
        """Consume the next piece of the answer and return what is now certain."""
        self._buffer += text
        out: list[XmlPiece] = []
        while self._buffer:
            if self._mode == "text":
                if not self._step_text(out):
                    break
            elif self._mode == "thinking":
                if not self._step_thinking(out):
                    break
            elif not self._step_tool(out):
                break
        return out

    def finish(self) -> list[XmlPiece]:
        """Release everything still held back; the answer is complete."""
        rest, self._buffer = self._buffer, ""
        self._scan_from = 0
        if not rest:
            self._mode = "text"
            return []
        mode, self._mode = self._mode, "text"
        if mode == "tool":
            return [("unclosed_tool", rest)]
        return [(mode, rest)]

    def _step_text(self, out: list[XmlPiece]) -> bool:
        buffer = self._buffer
        at = buffer.find("<")
        if at < 0:
            out.append(("text", buffer))
            self._buffer = ""
            return False
        if at > 0:
            out.append(("text", buffer[:at]))
            buffer = self._buffer = buffer[at:]
        for opener, (mode, closer) in _OPENERS.items():
            if buffer.startswith(opener):
                self._mode, self._closer = mode, closer
                self._buffer = buffer[len(opener) :]
                self._scan_from = 0
                return True
        if any(opener.startswith(buffer) for opener in _OPENERS):
            return False  # "<thi": wait for the next chunk to decide
        out.append(("text", "<"))
        self._buffer = buffer[1:]
        return True

    def _step_thinking(self, out: list[XmlPiece]) -> bool:
        buffer, closer = self._buffer, self._closer
        at = buffer.find(closer)
        if at >= 0:
            if at:
                out.append(("thinking", buffer[:at]))
            self._buffer = buffer[at + len(closer) :]
            self._mode = "text"
            return True
        keep = _partial_suffix(buffer, closer)
        if len(buffer) > keep:
            out.append(("thinking", buffer[: len(buffer) - keep]))
            self._buffer = buffer[len(buffer) - keep :]
        return False

    def _step_tool(self, out: list[XmlPiece]) -> bool:
        buffer, closer = self._buffer, self._closer
        at = buffer.find(closer, self._scan_from)
        if at < 0:
            # Resume the search where a closer could still begin: linear in the block's size.
            self._scan_from = max(0, len(buffer) - len(closer) + 1)
            return False
        out.append(("tool", buffer[:at]))
        self._buffer = buffer[at + len(closer) :]
        self._mode = "text"
        self._scan_from = 0
        return True


def _partial_suffix(text: str, tag: str) -> int:
    """Return the length of the longest end of `text` that begins `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
_NAME_HINT = re.compile(r'"(?:tool_name|name)"\s*:\s*"([^"]+)"')


def parse_tool_block(block: str) -> tuple[str, str, str | None]:
    """Read the inside of a ``<tool>`` block.

    Accepts ``{"tool_name": ..., "arguments": {...}}`` (``name`` / ``parameters`` and
    arguments given as a JSON string are accepted too).

    Args:
        block: The text between ``<tool>`` and ``</tool>``.

    Returns:
        ``(name, raw_arguments, problem)``: when the block itself is malformed, the raw
        arguments are the whole block, the name is recovered if it can be, and `problem`
        says what is wrong; otherwise `problem` is ``None`` and the arguments still need
        `parse_tool_arguments`.
    """
    text = block.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        hint = _NAME_HINT.search(text)
        detail = (
            f"{err.msg} at character {err.pos}" if isinstance(err, json.JSONDecodeError) else ""
        )
        return (
            hint.group(1) if hint else "",
            text,
            f"the <tool> block is not valid JSON ({detail or 'nested too deeply'}); write "
            '{"tool_name": ..., "arguments": {...}}',
        )
    if not isinstance(value, dict):
        return (
            "",
            text,
            'the <tool> block must hold a JSON object {"tool_name": ..., "arguments": {...}}',
        )
    name = value.get("tool_name", value.get("name", value.get("tool")))
    if not isinstance(name, str) or not name:
        return "", text, 'the <tool> block has no "tool_name"'
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return name, arguments, None
    return name, json.dumps(arguments, ensure_ascii=False), None


@functools.lru_cache(maxsize=4096)
def render_tool_call(name: str, arguments: str) -> str:
    """Render one call as the ``<tool>`` block the model is asked to write.

    Cached: every request (and every budget count) renders all the calls of the history
    again, and parsing and re-encoding their arguments dominated that.
    """
    try:
        parsed: object = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        parsed = arguments
    payload = json.dumps({"tool_name": name, "arguments": parsed}, ensure_ascii=False)
    return f"<tool>\n{payload}\n</tool>"


def render_tools_prompt(tools: Sequence[ToolDefinition], *, tool_choice: str | None = None) -> str:
    """Return the system-prompt section that teaches the model the XML tool protocol.

    Args:
        tools: The tools the model may call.
        tool_choice: ``"required"`` or a tool name adds a rule forcing a call.
    """
    rules = [
        '- "arguments" is a JSON object that matches the tool\'s parameter schema.',
        "- You may write several <tool> blocks in one answer; after them, stop and wait: the "
        "results come back in the next message inside <tool_result> blocks. Never write a "
        "<tool_result> yourself.",
        "- Before acting you may think inside <thinking>...</thinking>; the user does not see it.",
        "- When no tool is needed, answer the user directly, without any <tool> block.",
    ]
    if tool_choice == "required":
        rules.append("- In this answer you must call at least one tool.")
    elif tool_choice not in (None, "auto", "none"):
        rules.append(f'- In this answer you must call the tool "{tool_choice}".')
    listing = "\n".join(
        json.dumps(
            {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
            ensure_ascii=False,
        )
        for tool in tools
    )
    return (
        "<tool_calling>\n"
        "You can call tools. To call one, write a block in exactly this form, with valid JSON "
        "inside:\n"
        "<tool>\n"
        '{"tool_name": "NAME", "arguments": {...}}\n'
        "</tool>\n"
        "Rules:\n" + "\n".join(rules) + "\n</tool_calling>\n"
        "<available_tools>\n" + listing + "\n</available_tools>"
    )


def _render_result(message: ChatMessage, names: dict[str, str]) -> str:
    call_id = message.tool_call_id or ""
    name = message.name or names.get(call_id, "")
    return (
        f'<tool_result tool_name="{name}" call_id="{call_id}">\n{message.content}\n</tool_result>'
    )


def to_xml_messages(
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolDefinition],
    *,
    tool_choice: str | None = None,
) -> list[ChatMessage]:
    """Rewrite a neutral prompt for a model that only reads and writes text.

    The tools prompt is appended to the first system message (or becomes one); assistant
    tool calls become ``<tool>`` blocks in the assistant's text; tool results become
    ``<tool_result>`` blocks in user messages; consecutive messages of one role are merged,
    since many chat templates insist on alternating roles.

    Args:
        messages: The neutral prompt.
        tools: The tools on offer (none, or ``tool_choice="none"``: no tools prompt).
        tool_choice: As in `LLMRequest.tool_choice`.
    """
    # Each output message is a first message and the texts merged into it, joined once at the
    # end: a request (and every budget count) renders the whole history, so this stays linear.
    groups: list[tuple[ChatMessage, list[str]]] = []
    names: dict[str, str] = {}
    offer = bool(tools) and tool_choice != "none"
    prompt = render_tools_prompt(tools, tool_choice=tool_choice) if offer else ""
    if prompt and not any(message.role == "system" for message in messages):
        groups.append((_text_message("system", prompt), []))
        prompt = ""
    for message in messages:
        if message.role == "system" and prompt:
            content = f"{message.content}\n\n{prompt}" if message.content else prompt
            converted = _text_message("system", content)
            prompt = ""
        elif message.role == "assistant" and message.tool_calls:
            blocks = []
            for call in message.tool_calls:
                names[call.id] = call.name
                blocks.append(render_tool_call(call.name, call.arguments))
            text = "\n".join(blocks)
            content = f"{message.content}\n{text}" if message.content else text
            converted = _text_message("assistant", content)
        elif message.role == "tool":
            converted = _text_message("user", _render_result(message, names))
        else:
            converted = message
        previous = groups[-1][0] if groups else None
        if (
            previous is not None
            and previous.role == converted.role
            and converted.role != "system"
            and previous.name == converted.name
        ):
            groups[-1][1].append(converted.content)
        else:
            groups.append((converted, []))
    return [
        first
        if not merged
        else _text_message(first.role, "\n\n".join([first.content, *merged]), name=first.name)
        for first, merged in groups
    ]


def _text_message(role: Role, content: str, *, name: str | None = None) -> ChatMessage:
    return ChatMessage(role=role, content=content, name=name)


class XmlFormat:
    """The `PromptFormat` of XML tool mode: the prompt `to_xml_messages` makes, no native tools."""

    name = "xml"

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolDefinition],
        *,
        tool_choice: str | None = None,
    ) -> tuple[list[ChatMessage], tuple[ToolDefinition, ...]]:
        """Return the rewritten messages (tools described in the system message) and no tools."""
        return to_xml_messages(messages, tools, tool_choice=tool_choice), ()

    def __repr__(self) -> str:
        return "XML_FORMAT"


#: The prompt format of a client in XML tool mode.
XML_FORMAT = XmlFormat()
