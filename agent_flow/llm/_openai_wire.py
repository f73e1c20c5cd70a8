"""The chat-completions wire format: neutral messages out, normalized completions in.

Private to `agent_flow.llm`: the only place where OpenAI-style dicts exist. Bodies are built
as plain dicts (no SDK types, no per-call transform), and answers, streamed or not, go
through one `Assembler` that applies every normalization the client promises.
"""

from __future__ import annotations

import json
import re
import uuid
import weakref
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TypeGuard

from pydantic_core import to_json

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import IncompleteStreamError, MalformedChunkError, ModelResponseError
from agent_flow.llm._openai_errors import transient_code
from agent_flow.llm.base import (
    Completion,
    StreamEvent,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
    normalize_finish_reason,
)
from agent_flow.llm.xml_tools import XmlPiece, XmlToolParser, parse_tool_block
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition

__all__ = [
    "Assembler",
    "corrupt_chunk",
    "encode_body",
    "message_to_wire",
    "messages_to_wire",
    "offered_tools_to_wire",
    "tool_choice_to_wire",
    "tools_to_wire",
]

_STANDARD_CHOICES = frozenset({"auto", "none", "required"})
_EMPTY_FENCE = re.compile(r"```[\w-]*\s*```")


def corrupt_chunk(message: str) -> MalformedChunkError:
    """The error of a stream chunk that is not a JSON object: retryable.

    A corrupt chunk is most often the transport's doing (a proxy, a connection cut inside a
    line), so it is tried again like a cut stream; the same corruption of the same request
    twice in a row is not tried a third time (`RetryPolicy`).
    """
    err = MalformedChunkError(message)
    err.retryable = True
    return err


def message_to_wire(message: ChatMessage) -> JsonObject:
    """Convert one neutral message to a chat-completions message dict."""
    role = message.role
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content,
        }
    if role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            # "", never null: llama-cpp-python answers HTTP 500 to a null content, and every
            # server accepts an empty string next to tool calls.
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.tool_calls
            ],
        }
    if message.name:
        return {"role": role, "content": message.content, "name": message.name}
    return {"role": role, "content": message.content}


def messages_to_wire(messages: Sequence[ChatMessage]) -> list[JsonObject]:
    """Convert neutral messages to chat-completions message dicts."""
    return [message_to_wire(message) for message in messages]


# The encoded JSON of each live message, keyed by identity. Messages are immutable and a
# History hands the same objects to every turn, so a turn encodes only its new messages and
# the cost of building a body stays flat as the conversation grows. Entries leave with
# their message (weak references), so the cache holds nothing the caller dropped.
_encoded: dict[int, tuple[weakref.ref[ChatMessage], bytes]] = {}


def _forget(key: int, ref: weakref.ref[ChatMessage]) -> None:
    entry = _encoded.get(key)
    if entry is not None and entry[0] is ref:
        del _encoded[key]


def _message_json(message: ChatMessage) -> bytes:
    key = id(message)
    entry = _encoded.get(key)
    if entry is not None and entry[0]() is message:
        return entry[1]
    data = to_json(message_to_wire(message))
    _encoded[key] = (weakref.ref(message, partial(_forget, key)), data)
    return data


def encode_body(messages: Sequence[ChatMessage], fields: Mapping[str, JsonValue]) -> bytes:
    """Encode a request body: `fields` plus the messages, as compact UTF-8 JSON.

    Args:
        messages: The prompt (each message's encoding is cached while it lives).
        fields: Every other body field; a ``"messages"`` key here replaces the prompt. A
            ``"tools"`` list made by `offered_tools_to_wire` goes in as its cached encoding
            (last in the body).
    """
    if "messages" in fields:
        return to_json(dict(fields))
    joined = b",".join([_message_json(message) for message in messages])
    tools = fields.get("tools")
    known = _tool_lists_json.get(id(tools)) if tools is not None else None
    if known is not None and known[0] is tools:
        rest = to_json({key: value for key, value in fields.items() if key != "tools"})
        rest = (rest[:-1] + b',"tools":' if rest != b"{}" else b'{"tools":') + known[1] + b"}"
    else:
        rest = to_json(dict(fields))
    if rest == b"{}":
        return b'{"messages":[' + joined + b"]}"
    return b'{"messages":[' + joined + b"]," + rest[1:]


def tools_to_wire(tools: Sequence[ToolDefinition]) -> list[JsonObject]:
    """Convert tool definitions to the chat-completions ``tools`` list."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


# The wire form of each offered list of tools, and its encoding, by the definitions' identities.
# An agent offers the same frozen definitions turn after turn (and agents built per run, run
# after run): the schemas are converted and encoded once, not again for every request. The
# definitions are kept with them, so the ids in a key stay theirs.
_tool_lists: dict[tuple[int, ...], tuple[tuple[ToolDefinition, ...], list[JsonObject]]] = {}
# The same lists' encodings, by the wire list's identity (what `encode_body` sees).
_tool_lists_json: dict[int, tuple[list[JsonObject], bytes]] = {}
_MAX_TOOL_LISTS = 64


def offered_tools_to_wire(tools: Sequence[ToolDefinition]) -> list[JsonObject]:
    """`tools_to_wire`, made once per list of definitions: the result is shared, read-only.

    `encode_body` sends a list made here as its cached encoding.
    """
    key = tuple(map(id, tools))
    found = _tool_lists.get(key)
    if found is not None:
        return found[1]
    wire = tools_to_wire(tools)
    if len(_tool_lists) >= _MAX_TOOL_LISTS:
        _tool_lists.clear()
        _tool_lists_json.clear()
    _tool_lists[key] = (tuple(tools), wire)
    _tool_lists_json[id(wire)] = (wire, to_json(wire))
    return wire


def tool_choice_to_wire(choice: str) -> JsonValue:
    """Convert ``"auto"`` / ``"none"`` / ``"required"`` / a tool name to the wire value."""
    if choice in _STANDARD_CHOICES:
        return choice
    return {"type": "function", "function": {"name": choice}}


def _text_of(content: object) -> str:
    """Return the text of a message's content (a string, or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text") or ""
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _usage(raw: object) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    prompt = _int(raw.get("prompt_tokens"))
    completion = _int(raw.get("completion_tokens"))
    total = _int(raw.get("total_tokens")) or prompt + completion
    prompt_details = raw.get("prompt_tokens_details")
    completion_details = raw.get("completion_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
    reasoning = (
        completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None
    )
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cached_tokens=cached if _is_count(cached) else None,
        reasoning_tokens=reasoning if _is_count(reasoning) else None,
    )


#: More tokens than any call has: a server's count past it is garbage, read as none (it could
#: not be priced, summed into a session's totals or stored in a 64-bit column).
_MAX_TOKENS = 1 << 48


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_TOKENS


def _int(value: object) -> int:
    return value if _is_count(value) else 0


def _fragment_name(fragment: Mapping[str, object]) -> str:
    function = fragment.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


class _PartialCall:
    """A tool call being assembled from stream fragments."""

    __slots__ = ("arguments", "id", "index", "name", "position", "problem", "raw_id", "started")

    def __init__(self, index: int) -> None:
        self.index = index  # the server's fragment index (the key fragments are joined by)
        self.position = -1  # the call's place in the completion, fixed when it starts
        self.raw_id: str | None = None
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []
        self.started = False
        self.problem: str | None = None  # a block-level problem (XML mode)


class Assembler:
    """Turns chat-completions chunks (or one whole response) into stream chunks and a `Completion`.

    Normalizations: tool-call fragments are joined by ``index`` (or by id, for servers that
    omit it); calls without an id, or with an id already used in this answer or anywhere in
    the prompt, get a fresh one; the legacy ``function_call`` field is a tool call; argument
    text sent as an object is serialized; ``reasoning_content`` / ``reasoning`` become
    thinking; chunks without choices (usage, prompt-filter results) are read for what they
    carry; ``"stop"`` with tool calls present becomes ``"tool_calls"``; the final text is
    stripped. In XML mode the content goes through an `XmlToolParser`.

    Args:
        prompt: The request's messages; their tool-call ids must not be reused.
        xml: Parse tool calls out of the text (XML tool-call mode).
    """

    def __init__(self, prompt: Sequence[ChatMessage], *, xml: bool = False) -> None:
        self._prompt = prompt
        self._taken: set[str] | None = None
        self._xml = XmlToolParser() if xml else None
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._by_raw_id: dict[str, _PartialCall] = {}
        self._last_call: _PartialCall | None = None
        self._legacy: list[Mapping[str, object]] = []  # legacy function_call fragments
        self._started = 0
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._model: str | None = None
        self._response_id: str | None = None
        self.chunks = 0

    @property
    def finished(self) -> bool:
        """Whether the answer has its finish reason (only usage may still follow)."""
        return self._finish_reason is not None

    # -- ids -------------------------------------------------------------------------------

    def _unique_id(self, raw: str | None) -> str:
        taken = self._taken
        if taken is None:
            # Computed on the first tool call only: plain text answers never pay for it.
            taken = self._taken = {
                call.id for message in self._prompt for call in message.tool_calls
            }
        if raw and raw not in taken:
            taken.add(raw)
            return raw
        fresh = f"call_{uuid.uuid4().hex[:24]}"
        taken.add(fresh)
        return fresh

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, chunk: object) -> list[StreamEvent]:
        """Read one streamed chunk and return the stream chunks it carries.

        Raises:
            MalformedChunkError: The chunk is not a JSON object.
        """
        if not isinstance(chunk, dict):
            raise corrupt_chunk(
                f"a stream chunk was a JSON {type(chunk).__name__}, not an object: "
                f"{json.dumps(chunk)[:200]}"
            )
        self.chunks += 1
        events: list[StreamEvent] = []
        if self._response_id is None and isinstance(chunk.get("id"), str) and chunk["id"]:
            self._response_id = chunk["id"]
        if self._model is None and isinstance(chunk.get("model"), str) and chunk["model"]:
            self._model = chunk["model"]
        usage = chunk.get("usage")
        if usage:
            self._usage = _usage(usage)
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list):
            return events
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                continue  # n > 1 is not requested; ignore stray choices
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                delta = choice.get("message")
            if isinstance(delta, dict):
                self._read_delta(delta, events)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish_reason = reason
        return events

    def feed_response(self, response: object) -> list[StreamEvent]:
        """Read a whole (non-streamed) response and return the stream chunks it amounts to.

        Raises:
            ModelResponseError: The response is not a chat completion or has no choices.
        """
        if not isinstance(response, dict):
            text = response if isinstance(response, str) else json.dumps(response)
            raise ModelResponseError(
                f"the server's answer is not a JSON object: {text[:200]!r}; check the base URL"
            )
        choices = response.get("choices")
        error = response.get("error")
        if not choices and isinstance(error, dict) and isinstance(error.get("message"), str):
            # Proxies (OpenRouter, LiteLLM) answer 200 with the upstream's error in the body.
            code = error.get("code") or error.get("type")
            failed = ModelResponseError(
                f"the server answered with an error instead of a completion"
                f"{f' ({code})' if isinstance(code, str | int) else ''}: {error['message'][:500]}"
            )
            failed.retryable = transient_code(code)  # a 429 or 5xx upstream: tried again
            raise failed
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ModelResponseError(
                f"the server's answer has no choices: {json.dumps(response)[:300]}"
            )
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            message = {}
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            # Whole responses carry no fragment indexes; their order is the index.
            message = {
                **message,
                "tool_calls": [
                    {**call, "index": i} if isinstance(call, dict) else call
                    for i, call in enumerate(calls)
                ],
            }
        pseudo = {
            "id": response.get("id"),
            "model": response.get("model"),
            "usage": response.get("usage"),
            "choices": [
                {
                    "index": 0,
                    "delta": message,
                    # A whole response is complete by construction: no reason means "stop".
                    "finish_reason": choice.get("finish_reason") or "stop",
                }
            ],
        }
        return self.feed(pseudo)

    def _read_delta(self, delta: Mapping[str, object], events: list[StreamEvent]) -> None:
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self._thinking.append(reasoning)
            events.append(ThinkingChunk(text=reasoning))
        content = delta.get("content")
        if content:
            text = _text_of(content)
            if text:
                if self._xml is None:
                    self._text.append(text)
                    events.append(TextChunk(text=text))
                else:
                    self._read_xml(self._xml.feed(text), events)
        calls = delta.get("tool_calls")
        if calls and isinstance(calls, list):
            for fragment in calls:
                if isinstance(fragment, dict):
                    self._read_call(fragment, events)
        legacy = delta.get("function_call")
        if isinstance(legacy, dict) and legacy:
            # Held back until the answer ends: servers that send both describe one call
            # twice, and tool_calls (with its id) is the one kept (see `finish`).
            self._legacy.append(legacy)

    def _call_for(self, fragment: Mapping[str, object]) -> _PartialCall:
        index = fragment.get("index")
        raw_id = fragment.get("id")
        raw_id = raw_id if isinstance(raw_id, str) and raw_id else None
        if isinstance(index, int) and not isinstance(index, bool):
            call = self._calls.get(index)
            if call is None:
                call = self._calls[index] = _PartialCall(index)
        elif raw_id is not None and raw_id in self._by_raw_id:
            call = self._by_raw_id[raw_id]
        elif (
            raw_id is None
            and self._last_call is not None
            and not (_fragment_name(fragment) and self._last_call.name)
        ):
            call = self._last_call  # an index-less continuation of the current call
        else:
            index = max(self._calls, default=-1) + 1
            call = self._calls[index] = _PartialCall(index)
        if raw_id is not None and call.raw_id is None:
            call.raw_id = raw_id
            self._by_raw_id.setdefault(raw_id, call)
        self._last_call = call
        return call

    def _read_call(self, fragment: Mapping[str, object], events: list[StreamEvent]) -> None:
        call = self._call_for(fragment)
        function = fragment.get("function")
        arguments = ""
        if isinstance(function, dict):
            name = function.get("name")
            if isinstance(name, str) and name and not call.name:
                call.name = name
            raw = function.get("arguments")
            if isinstance(raw, str):
                arguments = raw
            elif raw is not None:
                arguments = json.dumps(raw, ensure_ascii=False)  # servers that send an object
        if arguments:
            call.arguments.append(arguments)
        if not call.started:
            if call.name:
                self._start(call)
                events.append(ToolCallChunk(index=call.position, id=call.id, name=call.name))
                if call.arguments:
                    events.append(
                        ToolCallArgumentsChunk(
                            index=call.position, id=call.id, delta="".join(call.arguments)
                        )
                    )
        elif arguments:
            events.append(ToolCallArgumentsChunk(index=call.position, id=call.id, delta=arguments))

    def _start(self, call: _PartialCall) -> None:
        call.started = True
        call.id = self._unique_id(call.raw_id)
        call.position = self._started
        self._started += 1

    def _read_xml(self, pieces: Sequence[XmlPiece], events: list[StreamEvent]) -> None:
        for kind, text in pieces:
            if kind == "text":
                self._text.append(text)
                events.append(TextChunk(text=text))
            elif kind == "thinking":
                self._thinking.append(text)
                events.append(ThinkingChunk(text=text))
            else:
                self._xml_call(text, closed=kind == "tool", events=events)

    def _xml_call(self, block: str, *, closed: bool, events: list[StreamEvent]) -> None:
        name, arguments, problem = parse_tool_block(block)
        if not closed:
            problem = "the <tool> block was never closed with </tool>; the call is incomplete"
            arguments = block.strip()
        call = _PartialCall(max(self._calls, default=-1) + 1)
        self._calls[call.index] = call
        call.name = name
        call.arguments = [arguments]
        call.problem = problem
        self._start(call)
        events.append(ToolCallChunk(index=call.position, id=call.id, name=name))
        events.append(ToolCallArgumentsChunk(index=call.position, id=call.id, delta=arguments))

    # -- finishing ---------------------------------------------------------------------------

    def finish(
        self, *, warnings: Sequence[str] = (), require_finish_reason: bool = True
    ) -> tuple[list[StreamEvent], Completion]:
        """Close the answer: return the last stream chunks (XML held back) and the `Completion`.

        Raises:
            IncompleteStreamError: No finish reason arrived: the answer was cut short.
        """
        events: list[StreamEvent] = []
        if self._xml is not None:
            self._read_xml(self._xml.finish(), events)
        if self._legacy and not self._calls:
            for fragment in self._legacy:
                self._read_call({"index": -1, "function": fragment}, events)
        if require_finish_reason and self._finish_reason is None:
            raise IncompleteStreamError(
                f"the stream ended after {self.chunks} chunk(s) without a finish reason "
                f"({sum(map(len, self._text))} characters and {len(self._calls)} tool call(s) "
                "so far): the answer is truncated; retry the request"
            )
        calls: list[ToolCall] = []
        for call in sorted(self._calls.values(), key=lambda c: c.index):
            if not call.started:  # never named: still a call, marked invalid
                self._start(call)
        for call in sorted(self._calls.values(), key=lambda c: c.position):
            calls.append(
                ToolCall.from_raw(call.id, call.name, "".join(call.arguments), problem=call.problem)
            )
        finish = normalize_finish_reason(self._finish_reason)
        notes = list(warnings)
        if calls and finish in ("stop", "other"):
            finish = "tool_calls"
        elif not calls and finish == "tool_calls":
            finish = "stop"
            notes.append("the server reported finish reason 'tool_calls' but sent no tool call")
        text = "".join(self._text)
        if self._xml is not None and "```" in text:
            # A tool block the model wrapped in a code fence leaves the empty fence behind.
            text = _EMPTY_FENCE.sub("", text)
        text = text.strip()
        completion = Completion(
            text=text,
            thinking="".join(self._thinking).strip(),
            tool_calls=tuple(calls),
            finish_reason=finish,
            raw_finish_reason=self._finish_reason,
            usage=self._usage,
            model=self._model,
            response_id=self._response_id,
            warnings=tuple(notes),
        )
        return events, completion
