"""The test doubles that play the model: `ScriptedLLM` and `FunctionLLM`.

Both implement `agent_flow.llm.LLMClient` — `complete` and `stream` — so an agent, its
tools and its events can be exercised end to end without a server::

    from agent_flow.testing import ScriptedLLM, call, fail, reply

    llm = ScriptedLLM([
        reply("Let me look.", tool_calls=[call("read_file", path="a.py")]),
        reply(tool_calls=[call("write_file", raw='{"path": "b.py", ')]),  # invalid JSON
        fail(ModelRateLimitError("slow down", status_code=429)),
        "All done.",                                                      # plain text
    ])
    ...
    llm.assert_all_consumed()
    assert llm.requests[1].messages[-1].role == "tool"

A step may also be a function of the request (sync or async) returning a reply, to answer
from what the model was sent. Streams replay each reply as chunks (words by default,
`chunk_size` characters otherwise); usage is estimated with a token counter, so budgets and
cost accounting see plausible numbers. Call ids are deterministic (``call_1``, ``call_2``,
...) unless given.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from agent_flow._types import JsonValue
from agent_flow.errors import UserError
from agent_flow.llm.base import (
    Completion,
    FinishReason,
    LLMRequest,
    StreamEvent,
    TextChunk,
    Usage,
    completion_events,
)
from agent_flow.messages import ToolCall
from agent_flow.tokens import ApproxCounter, TokenCounter

if TYPE_CHECKING:
    from agent_flow.llm.base import LLMClient

__all__ = [
    "FunctionLLM",
    "Reply",
    "ScriptExhaustedError",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedFailure",
    "ScriptedLLM",
    "ScriptedReply",
    "call",
    "fail",
    "reply",
]


class ScriptExhaustedError(UserError):
    """A `ScriptedLLM` was called more often than its script has steps."""


@dataclass(frozen=True)
class ScriptedCall:
    """A tool call a scripted reply makes (build it with `call`)."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class ScriptedReply:
    """One scripted answer (build it with `reply`)."""

    text: str = ""
    tool_calls: tuple[ScriptedCall, ...] = ()
    thinking: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    chunk_size: int | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScriptedFailure:
    """A scripted failure (build it with `fail`): the call raises `error`.

    When streamed, `partial_text` is sent as chunks first, as a server that fails mid-answer.
    """

    error: BaseException
    partial_text: str = ""


#: What a reply function may return: a reply, a failure, a ready `Completion`, or plain text.
Reply: TypeAlias = ScriptedReply | ScriptedFailure | Completion | str
#: One step of a script: a reply, or a function of the request returning one.
ScriptStep: TypeAlias = Reply | Callable[[LLMRequest], Reply | Awaitable[Reply]]


def call(
    name: str,
    arguments: Mapping[str, JsonValue] | None = None,
    /,
    *,
    call_id: str | None = None,
    raw: str | None = None,
    **kwargs: JsonValue,
) -> ScriptedCall:
    """A scripted tool call: ``call("read_file", path="a.py")``.

    Args:
        name: The tool name.
        arguments: The arguments as a dict (for names that clash with `call_id` / `raw`).
        call_id: The call id; default ``call_<n>``.
        raw: The exact argument text, e.g. invalid JSON to test recovery.
        **kwargs: The arguments, merged over `arguments`.

    Raises:
        UserError: `raw` was combined with structured arguments.
    """
    if raw is not None:
        if arguments or kwargs:
            raise UserError(
                f"call({name!r}) got both raw= and structured arguments; pass only one of them"
            )
        return ScriptedCall(name=name, arguments=raw, id=call_id)
    merged = {**(arguments or {}), **kwargs}
    return ScriptedCall(name=name, arguments=json.dumps(merged, ensure_ascii=False), id=call_id)


def reply(
    text: str = "",
    *,
    tool_calls: Sequence[ScriptedCall] = (),
    thinking: str = "",
    finish_reason: FinishReason | None = None,
    usage: Usage | None = None,
    chunk_size: int | None = None,
    warnings: Sequence[str] = (),
) -> ScriptedReply:
    """A scripted answer.

    Args:
        text: The visible text.
        tool_calls: Calls made with `call`.
        thinking: Reasoning, streamed as thinking chunks.
        finish_reason: Default ``"tool_calls"`` when there are calls, else ``"stop"``; pass
            ``"length"`` to play a model that ran out of tokens.
        usage: Reported usage; default estimated with the double's token counter.
        chunk_size: Characters per streamed chunk for this reply (default: the double's).
        warnings: Warnings the completion carries (streamed as `StreamWarning`).
    """
    return ScriptedReply(
        text=text,
        tool_calls=tuple(tool_calls),
        thinking=thinking,
        finish_reason=finish_reason,
        usage=usage,
        chunk_size=chunk_size,
        warnings=tuple(warnings),
    )


def fail(error: BaseException, *, partial_text: str = "") -> ScriptedFailure:
    """A scripted failure: the call raises `error` (after streaming `partial_text`)."""
    return ScriptedFailure(error=error, partial_text=partial_text)


class _Double:
    """What both doubles share: turning replies into completions and streams."""

    def __init__(
        self, *, model: str, chunk_size: int | None, counter: TokenCounter | None, delay: float
    ) -> None:
        if chunk_size is not None and chunk_size < 1:
            raise UserError(f"chunk_size must be at least 1, got {chunk_size}")
        self.model = model
        self.chunk_size = chunk_size
        self.counter: TokenCounter = counter if counter is not None else ApproxCounter()
        self.delay = delay
        #: Every request received, in order.
        self.requests: list[LLMRequest] = []
        self._calls = 0
        self._responses = 0

    @property
    def last_request(self) -> LLMRequest:
        """The most recent request (raises `IndexError` if there was none)."""
        return self.requests[-1]

    def _completion(
        self, answer: ScriptedReply | Completion | str, request: LLMRequest
    ) -> Completion:
        if isinstance(answer, Completion):
            return answer
        if isinstance(answer, str):
            answer = ScriptedReply(text=answer)
        self._responses += 1
        taken = {c.id for message in request.messages for c in message.tool_calls}
        parts: list[ToolCall] = []
        for scripted in answer.tool_calls:
            call_id = scripted.id
            if call_id is None:
                self._calls += 1
                call_id = f"call_{self._calls}"
                while call_id in taken:
                    self._calls += 1
                    call_id = f"call_{self._calls}"
            taken.add(call_id)
            parts.append(ToolCall.from_raw(call_id, scripted.name, scripted.arguments))
        finish: FinishReason = answer.finish_reason or ("tool_calls" if parts else "stop")
        usage = answer.usage or self._estimate(request, answer)
        return Completion(
            text=answer.text.strip(),
            thinking=answer.thinking.strip(),
            tool_calls=tuple(parts),
            finish_reason=finish,
            raw_finish_reason=finish,
            usage=usage,
            model=request.model or self.model,
            response_id=f"{self.model}-{self._responses}",
            warnings=answer.warnings,
        )

    def _estimate(self, request: LLMRequest, answer: ScriptedReply) -> Usage:
        count = self.counter.count
        prompt = self.counter.count_messages(request.messages) + self.counter.count_tools(
            request.tools
        )
        completion = count(answer.text) + count(answer.thinking)
        completion += sum(count(c.name) + count(c.arguments) for c in answer.tool_calls)
        return Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        )

    async def _resolve(self, step: ScriptStep, request: LLMRequest) -> Reply:
        if callable(step):
            result = step(request)
            if inspect.isawaitable(result):
                result = await result
            return result
        return step

    async def _answer(self, answer: Reply, request: LLMRequest) -> Completion:
        if isinstance(answer, ScriptedFailure):
            raise answer.error
        return self._completion(answer, request)

    async def _stream_answer(
        self, answer: Reply, request: LLMRequest
    ) -> AsyncIterator[StreamEvent]:
        if isinstance(answer, ScriptedFailure):
            for event in completion_events(
                Completion(text=answer.partial_text), chunk_size=self.chunk_size
            ):
                if isinstance(event, TextChunk):
                    await self._pause()
                    yield event
            raise answer.error
        completion = self._completion(answer, request)
        size = answer.chunk_size if isinstance(answer, ScriptedReply) else None
        for event in completion_events(completion, chunk_size=size or self.chunk_size):
            await self._pause()
            yield event

    async def _pause(self) -> None:
        if self.delay > 0:
            await asyncio.sleep(self.delay)


class ScriptedLLM(_Double):
    """A model that answers from a script, one step per call, and records every request.

    Args:
        steps: The script: replies (`reply`, plain strings, `Completion`s), failures
            (`fail`), or functions of the request returning one of those.
        model: The model name completions report.
        chunk_size: Characters per streamed chunk; ``None`` streams word by word.
        counter: Estimates usage when a reply gives none (default `ApproxCounter`).
        delay: Seconds to wait before each streamed chunk (for demos; 0 in tests).
    """

    def __init__(
        self,
        steps: Iterable[ScriptStep] = (),
        *,
        model: str = "scripted",
        chunk_size: int | None = None,
        counter: TokenCounter | None = None,
        delay: float = 0.0,
    ) -> None:
        super().__init__(model=model, chunk_size=chunk_size, counter=counter, delay=delay)
        self._script: deque[ScriptStep] = deque(steps)
        self._total = len(self._script)

    def __repr__(self) -> str:
        return (
            f"ScriptedLLM(model={self.model!r}, remaining={self.remaining}, "
            f"calls={len(self.requests)})"
        )

    def add(self, *steps: ScriptStep) -> None:
        """Append steps to the script."""
        self._script.extend(steps)
        self._total += len(steps)

    @property
    def remaining(self) -> int:
        """Steps not yet used."""
        return len(self._script)

    def assert_all_consumed(self) -> None:
        """Check that every scripted step was used.

        Raises:
            AssertionError: Some steps were never reached (the message says how many).
        """
        if self._script:
            raise AssertionError(
                f"ScriptedLLM used {self._total - len(self._script)} of its {self._total} "
                f"steps; {len(self._script)} were never reached (the agent made fewer model "
                f"calls than scripted); the next unused step: {self._script[0]!r}"
            )

    def _next(self, request: LLMRequest) -> ScriptStep:
        self.requests.append(request)
        if not self._script:
            last = request.messages[-1].content[:80] if request.messages else ""
            raise ScriptExhaustedError(
                f"ScriptedLLM got call #{len(self.requests)} but its script had only "
                f"{self._total} step(s); add a step for this call (its last message: {last!r})"
            )
        return self._script.popleft()

    async def complete(self, request: LLMRequest) -> Completion:
        """Answer with the next step of the script.

        Raises:
            ScriptExhaustedError: The script has no step left.
            BaseException: Whatever a `fail` step scripted.
        """
        step = self._next(request)
        return await self._answer(await self._resolve(step, request), request)

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        """Stream the next step of the script as chunks, ending with its `Completion`.

        Raises:
            ScriptExhaustedError: The script has no step left.
            BaseException: Whatever a `fail` step scripted (after its partial text).
        """
        step = self._next(request)
        answer = await self._resolve(step, request)
        async for event in self._stream_answer(answer, request):
            yield event


class FunctionLLM(_Double):
    """A model played by a function of the request (sync or async); records every request.

    The function returns a `reply(...)`, a `fail(...)`, a `Completion` or plain text, or
    raises. Useful when the answer depends on what the model was sent::

        def model(request: LLMRequest) -> Reply:
            if request.messages[-1].role == "tool":
                return "Done."
            return reply(tool_calls=[call("search", query=request.messages[-1].content)])

    Args:
        fn: Plays the model.
        model: The model name completions report.
        chunk_size: Characters per streamed chunk; ``None`` streams word by word.
        counter: Estimates usage when a reply gives none (default `ApproxCounter`).
        delay: Seconds to wait before each streamed chunk.
    """

    def __init__(
        self,
        fn: Callable[[LLMRequest], Reply | Awaitable[Reply]],
        *,
        model: str = "function",
        chunk_size: int | None = None,
        counter: TokenCounter | None = None,
        delay: float = 0.0,
    ) -> None:
        super().__init__(model=model, chunk_size=chunk_size, counter=counter, delay=delay)
        self.fn = fn

    def __repr__(self) -> str:
        return f"FunctionLLM({getattr(self.fn, '__name__', self.fn)!r}, model={self.model!r})"

    async def complete(self, request: LLMRequest) -> Completion:
        """Answer with what the function returns for `request`."""
        self.requests.append(request)
        return await self._answer(await self._resolve(self.fn, request), request)

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        """Stream what the function returns for `request`, ending with its `Completion`."""
        self.requests.append(request)
        answer = await self._resolve(self.fn, request)
        async for event in self._stream_answer(answer, request):
            yield event


if TYPE_CHECKING:  # mypy checks that both doubles implement the real client protocol

    def _implements_protocol(scripted: ScriptedLLM, function: FunctionLLM) -> list[LLMClient]:
        return [scripted, function]
