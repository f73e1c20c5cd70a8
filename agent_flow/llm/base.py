"""The provider-neutral model interface: requests, completions, stream chunks, `LLMClient`.

Everything here is plain data that the rest of agent_flow may hold on to: an `LLMRequest`
built from the neutral `ChatMessage` / `ToolDefinition` model, the `Completion` a client
returns, and the `StreamEvent` chunks a streaming call yields before that completion.
Provider wire formats never appear here; clients convert at their own boundary.

A stream is a sequence of chunks (pieces of the model's answer as it writes it) and
warnings that always ends with exactly one `Completion`::

    TextChunk | ThinkingChunk | ToolCallChunk | ToolCallArgumentsChunk | StreamWarning
    ... → Completion

`Completion` normalizes what servers disagree about: tool calls always have a unique id,
their raw argument text is kept and parsed (`parsed_arguments`) or marked invalid
(`parse_error`), and `finish_reason` is one of a closed set.

A client that rewrites the neutral prompt before sending it (XML tool mode puts the tool
schemas into the system message and tool turns into text) says how through its
`prompt_format` (a `PromptFormat`), so that the `agent_flow.context.ContextManager` budgets
the prompt that is actually sent; `prompt_format_of` reads it (`NATIVE_FORMAT` otherwise).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Annotated, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from agent_flow._types import FrozenModel, JsonObject
from agent_flow._utils import conforms
from agent_flow.errors import ModelResponseError
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition

__all__ = [
    "NATIVE_FORMAT",
    "RETRY_LISTENER",
    "STREAM_EVENT_ADAPTER",
    "Completion",
    "FinishReason",
    "LLMClient",
    "LLMRequest",
    "NativeFormat",
    "PromptFormat",
    "RetryNotice",
    "StreamEvent",
    "StreamWarning",
    "TextChunk",
    "ThinkingChunk",
    "ToolCallArgumentsChunk",
    "ToolCallChunk",
    "ToolMode",
    "Usage",
    "completion_events",
    "final_completion",
    "normalize_finish_reason",
    "prompt_format_of",
]

#: Why the model stopped: ``"stop"`` (it finished), ``"length"`` (it hit ``max_tokens`` or the
#: context limit: the answer is cut), ``"tool_calls"`` (it wants tools run),
#: ``"content_filter"`` (the provider withheld output), ``"other"`` (anything else; see
#: `Completion.raw_finish_reason`).
FinishReason: TypeAlias = Literal["stop", "length", "tool_calls", "content_filter", "other"]

#: How tools reach the model: the API's native ``tools`` field, or an XML protocol in the
#: prompt for models without native tool calling (see `agent_flow.llm.xml_tools`).
ToolMode: TypeAlias = Literal["native", "xml"]

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "end": "stop",
    "length": "length",
    "max_tokens": "length",
    "model_length": "length",
    "tool_calls": "tool_calls",
    "tool_call": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "content_filter": "content_filter",
    "safety": "content_filter",
}


def normalize_finish_reason(raw: str | None) -> FinishReason:
    """Map a provider's finish reason onto the closed `FinishReason` set.

    Args:
        raw: The finish reason as the server sent it (``None`` counts as ``"stop"``).

    Returns:
        The normalized reason; unknown values become ``"other"``.
    """
    if raw is None:
        return "stop"
    return _FINISH_REASONS.get(raw.strip().lower(), "other")


class Usage(FrozenModel):
    """Token usage the server reported for one call.

    Attributes:
        prompt_tokens: Tokens of the prompt.
        completion_tokens: Tokens the model generated (reasoning included).
        total_tokens: The total as the server reported it; when a client leaves it unset (or
            0), ``prompt_tokens + completion_tokens``, so token limits never see 0 for a call
            that used tokens.
        cached_tokens: Prompt tokens served from the provider's cache, where reported.
        reasoning_tokens: Completion tokens spent on hidden reasoning, where reported.
        estimated: Counted by agent_flow because the server reported no usage (its own
            token counts of what was sent and received), not the server's figures.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    estimated: bool = False

    @model_validator(mode="after")
    def _derive_total(self) -> Usage:
        if self.total_tokens == 0:
            # The model is frozen; this runs once, while it is being built.
            object.__setattr__(self, "total_tokens", self.prompt_tokens + self.completion_tokens)
        return self

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cached_tokens=_add_optional(self.cached_tokens, other.cached_tokens),
            reasoning_tokens=_add_optional(self.reasoning_tokens, other.reasoning_tokens),
            estimated=self.estimated or other.estimated,
        )


def _add_optional(a: int | None, b: int | None) -> int | None:
    if a is None and b is None:
        return None
    return (a or 0) + (b or 0)


class TextChunk(BaseModel):
    """A piece of the answer's user-visible text."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["text_chunk"] = "text_chunk"
    text: str


class ThinkingChunk(BaseModel):
    """A piece of the model's reasoning (``reasoning_content`` / ``<thinking>``), not for users."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["thinking_chunk"] = "thinking_chunk"
    text: str


class ToolCallChunk(BaseModel):
    """The first piece of a tool call the model is writing: which call, and which tool.

    Its arguments follow as `ToolCallArgumentsChunk`s. (That the agent began *running* a
    call is a different fact: the event `agent_flow.events.ToolCallStarted`.)

    Attributes:
        index: The call's position in the completion's ``tool_calls``.
        id: The call id (the same as in the final `Completion`).
        name: The tool name.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["tool_call_chunk"] = "tool_call_chunk"
    index: int
    id: str
    name: str


class ToolCallArgumentsChunk(BaseModel):
    """A piece of the raw argument text of a call its `ToolCallChunk` began.

    Attributes:
        index: The call's position in the completion's ``tool_calls``.
        id: The call id.
        delta: The next piece of the argument text.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["tool_call_arguments_chunk"] = "tool_call_arguments_chunk"
    index: int
    id: str
    delta: str


class StreamWarning(BaseModel):
    """Something the caller should know that did not stop the call.

    Not a piece of the answer (so not a chunk): the client's own note about how it got it.

    Attributes:
        code: A stable identifier, e.g. ``"stream_options_rejected"`` or
            ``"stream_with_tools_unsupported"``.
        message: One sentence for humans.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["warning"] = "warning"
    code: str
    message: str


class RetryNotice(BaseModel):
    """An attempt failed and the client tries again after `delay` seconds.

    Every chunk streamed since the previous notice (or the start) belonged to the abandoned
    attempt: a consumer joining the deltas must discard them.

    Attributes:
        attempt: The attempt that failed (1 for the first).
        max_attempts: The most attempts the client makes.
        delay: Seconds waited before the next attempt (the server's ``Retry-After``, or a
            jittered backoff).
        reason: What went wrong, one sentence.
        discarded: Whether chunks of the abandoned attempt were streamed (and are void).
        error_type: The failed attempt's error class (e.g. ``"ModelServerError"``).
        status_code: Its HTTP status, when the server answered with one.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["retry"] = "retry"
    attempt: int
    max_attempts: int
    delay: float
    reason: str
    discarded: bool = False
    error_type: str | None = None
    status_code: int | None = None

    @classmethod
    def after(
        cls,
        err: Exception,
        *,
        attempt: int,
        max_attempts: int,
        delay: float,
        discarded: bool = False,
    ) -> RetryNotice:
        """The notice of a retry after attempt `attempt` failed with `err`."""
        status = getattr(err, "status_code", None)
        return cls(
            attempt=attempt,
            max_attempts=max_attempts,
            delay=delay,
            reason=str(err),
            discarded=discarded,
            error_type=type(err).__name__,
            status_code=status if isinstance(status, int) else None,
        )


#: Told of each retry of a non-streamed call (`LLMClient.complete`) made in this context;
#: streamed calls yield their `RetryNotice` instead. An agent sets it around its calls.
RETRY_LISTENER: ContextVar[Callable[[RetryNotice], Awaitable[None]] | None] = ContextVar(
    "agent_flow_retry_listener", default=None
)


class Completion(BaseModel):
    """The model's whole answer to one request, normalized.

    Attributes:
        text: The user-visible answer, stripped of surrounding whitespace.
        thinking: Reasoning the server or the model's ``<thinking>`` blocks exposed.
        tool_calls: The calls the model asked for, in order.
        finish_reason: Why the model stopped (``"tool_calls"`` whenever calls are present,
            unless the answer was cut by ``"length"``).
        raw_finish_reason: The finish reason exactly as the server sent it.
        usage: Token usage, when the server reported it.
        model: The model that answered, as the server named it.
        response_id: The provider's id for this response.
        warnings: What the client had to work around to get this answer.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["completion"] = "completion"
    text: str = ""
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason = "stop"
    raw_finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    response_id: str | None = None
    warnings: tuple[str, ...] = ()

    def to_message(self) -> ChatMessage:
        """Return the answer as the assistant `ChatMessage` to append to a prompt."""
        return ChatMessage(
            role="assistant",
            content=self.text,
            tool_calls=self.tool_calls,
        )


#: One item of a streamed answer; the last one is always a `Completion`.
StreamEvent: TypeAlias = Annotated[
    TextChunk
    | ThinkingChunk
    | ToolCallChunk
    | ToolCallArgumentsChunk
    | StreamWarning
    | RetryNotice
    | Completion,
    Field(discriminator="kind"),
]
STREAM_EVENT_ADAPTER: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)


class LLMRequest(BaseModel):
    """What to ask the model: the prompt, the tools and the sampling settings.

    Unset settings (``None``) fall back to the client's defaults, then to the server's.

    Attributes:
        messages: The prompt, in the neutral message model.
        tools: Tools the model may call.
        model: A model name overriding the client's.
        temperature: Sampling temperature.
        top_p: Nucleus sampling.
        max_tokens: The most tokens the model may generate.
        stop: Stop sequences.
        seed: A sampling seed, for servers that honour it.
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or the name of one tool to force.
        parallel_tool_calls: Whether the model may call several tools in one answer.
        response_format: The provider's ``response_format`` object (e.g. JSON mode).
        extra_body: Provider-specific fields merged into the request body last.
    """

    model_config = ConfigDict(frozen=True)

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolDefinition, ...] = ()
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    response_format: JsonObject | None = None
    extra_body: JsonObject = Field(default_factory=dict)


@runtime_checkable
class LLMClient(Protocol):
    """What agent_flow needs from a model: one answer, whole or streamed.

    Implementations: `agent_flow.llm.OpenAIClient` (any OpenAI-compatible server) and the
    test doubles `agent_flow.testing.ScriptedLLM` / `FunctionLLM`.
    """

    async def complete(self, request: LLMRequest) -> Completion:
        """Return the model's whole answer to `request`.

        Raises:
            ModelError: A subclass saying precisely what failed.
        """
        ...

    def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        """Yield the answer as chunks, ending with the final `Completion`.

        Raises:
            ModelError: A subclass saying precisely what failed (a truncated stream is an
                error, never a silently shorter answer).
        """
        ...


@runtime_checkable
class PromptFormat(Protocol):
    """How a client puts a neutral prompt on the wire: what a token budget must count."""

    @property
    def name(self) -> str:
        """A short name for reports, e.g. ``"native"`` or ``"xml"``."""
        ...

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolDefinition],
        *,
        tool_choice: str | None = None,
    ) -> tuple[list[ChatMessage], tuple[ToolDefinition, ...]]:
        """Return the messages and the native tool schemas exactly as the client sends them."""
        ...


class NativeFormat:
    """The prompt goes out as it is: messages as messages, tools in the API's ``tools`` field."""

    name = "native"

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolDefinition],
        *,
        tool_choice: str | None = None,
    ) -> tuple[list[ChatMessage], tuple[ToolDefinition, ...]]:
        """Return the messages and tools unchanged."""
        return list(messages), tuple(tools)

    def __repr__(self) -> str:
        return "NATIVE_FORMAT"


#: The format of clients that send the neutral prompt unchanged (native tool calling).
NATIVE_FORMAT = NativeFormat()


def prompt_format_of(client: object) -> PromptFormat:
    """Return how `client` sends prompts: its ``prompt_format``, else `NATIVE_FORMAT`."""
    found = getattr(client, "prompt_format", None)
    if conforms(found, PromptFormat):  # type: ignore[type-abstract]  # see conforms
        return found
    return NATIVE_FORMAT


async def final_completion(events: AsyncIterator[StreamEvent]) -> Completion:
    """Drain a stream and return its final `Completion`.

    Raises:
        ModelResponseError: The stream ended without a completion.
    """
    last: StreamEvent | None = None
    async for event in events:
        last = event
    if not isinstance(last, Completion):
        raise ModelResponseError("the stream ended without a final completion; the answer is lost")
    return last


_WORDS = re.compile(r"\s*\S+\s*|\s+")


def _chunks(text: str, size: int | None) -> Iterator[str]:
    if not text:
        return
    if size is None:
        yield from _WORDS.findall(text)
        return
    for start in range(0, len(text), size):
        yield text[start : start + size]


def completion_events(
    completion: Completion, *, chunk_size: int | None = None
) -> Iterator[StreamEvent]:
    """Replay a whole completion as the chunks a streaming server would have sent.

    Args:
        completion: The answer to replay; it is the last event.
        chunk_size: Characters per text / argument chunk; ``None`` splits at words.
    """
    for message in completion.warnings:
        yield StreamWarning(code="warning", message=message)
    for piece in _chunks(completion.thinking, chunk_size):
        yield ThinkingChunk(text=piece)
    for piece in _chunks(completion.text, chunk_size):
        yield TextChunk(text=piece)
    for index, call in enumerate(completion.tool_calls):
        yield ToolCallChunk(index=index, id=call.id, name=call.name)
        for piece in _chunks(call.arguments, chunk_size):
            yield ToolCallArgumentsChunk(index=index, id=call.id, delta=piece)
    yield completion
