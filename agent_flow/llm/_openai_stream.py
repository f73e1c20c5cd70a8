"""Streaming from servers that stream imperfectly: opening a stream, and reading it to its end.

Private to `agent_flow.llm`. `StreamSupport` opens streams for one client and remembers what
the server refused: a server that rejects ``stream_options`` gets the stream requested again
without it (once; remembered), and a model the server cannot stream for while tools are
offered is asked without streaming (remembered per model). `read_stream` reads an opened
stream: a server that ignored ``stream`` is read as one JSON answer, a connection lost after
the finish reason costs only the usage, and a corrupt chunk is a (retryable) error, never a
silently shorter answer. Each workaround has a stable code and one sentence (`WARNINGS`) for
the `StreamWarning` that reports it, when it is learned: the stream-with-tools fallback is
said once per client and model, not on every call that takes it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import TracebackType
from typing import cast

import openai
from openai import AsyncStream

from agent_flow._types import JsonObject
from agent_flow.errors import IncompleteStreamError, ModelTimeoutError
from agent_flow.llm._openai_sse import SSEChunks
from agent_flow.llm._openai_wire import Assembler, corrupt_chunk
from agent_flow.llm.base import StreamEvent, StreamWarning

__all__ = [
    "CONNECTION_LOST_AFTER_ANSWER",
    "STREAM_OPTIONS_REJECTED",
    "STREAM_WITH_TOOLS_UNSUPPORTED",
    "WARNINGS",
    "StreamClock",
    "StreamSupport",
    "read_stream",
    "refused_in_stream",
]

STREAM_OPTIONS_REJECTED = "stream_options_rejected"
STREAM_WITH_TOOLS_UNSUPPORTED = "stream_with_tools_unsupported"
CONNECTION_LOST_AFTER_ANSWER = "connection_lost_after_answer"

#: The sentence reported for each workaround, by its code.
WARNINGS = {
    STREAM_OPTIONS_REJECTED: (
        "the server rejected stream_options, so the stream was requested again without it; "
        "token usage may be missing from streamed answers"
    ),
    STREAM_WITH_TOOLS_UNSUPPORTED: (
        "the server cannot stream an answer when tools are offered, so this client asks "
        "without streaming whenever tools are offered (answers arrive whole)"
    ),
    CONNECTION_LOST_AFTER_ANSWER: (
        "the connection closed after the answer was complete but before the stream ended; "
        "token usage may be missing"
    ),
}


def _error_text(err: openai.APIStatusError) -> str:
    try:
        body = json.dumps(err.body, default=str)
    except (TypeError, ValueError):
        body = str(err.body)
    return f"{err.message} {body}".lower()


def _rejects_stream_options(err: openai.APIStatusError) -> bool:
    text = _error_text(err)
    return err.status_code in (400, 422) and ("stream_options" in text or "include_usage" in text)


def _rejects_stream_with_tools(err: openai.APIStatusError) -> bool:
    text = _error_text(err)
    return (
        err.status_code in (400, 422, 500, 501)
        and "stream" in text
        and ("tool" in text or "function" in text)
    )


def refused_in_stream(err: Exception, fields: JsonObject, assembler: Assembler) -> bool:
    """Whether a stream offering tools was refused after its HTTP 200, before any chunk.

    llama-cpp-python accepts such a stream and then ends it empty (or, in other versions,
    with an error event): either way not one chunk of an answer arrived.
    """
    refusal = type(err) is openai.APIError or isinstance(
        err, IncompleteStreamError | openai.APIConnectionError
    )
    return refusal and "tools" in fields and assembler.chunks == 0


class _StreamWithToolsRejected(Exception):
    """Internal: the server refused ``stream`` together with ``tools``."""


class StreamSupport:
    """What one server accepts when asked to stream, learned from its refusals.

    Attributes:
        options_accepted: Whether to send ``stream_options`` (until the server rejects it).
    """

    def __init__(self) -> None:
        self.options_accepted = True
        self._no_stream_with_tools: set[str] = set()

    def refuse_stream_with_tools(self, model: str) -> None:
        """Remember that `model`'s answers cannot be streamed while tools are offered."""
        self._no_stream_with_tools.add(model)

    async def open(
        self,
        post: Callable[[JsonObject], Awaitable[AsyncStream[object]]],
        fields: JsonObject,
        codes: list[str],
    ) -> AsyncStream[object] | None:
        """Post `fields` for a stream, working around what the server refuses.

        Args:
            post: Posts a body's fields and returns the opened stream.
            fields: The body's fields (``stream_options`` is removed if the server rejects it).
            codes: Receives the code of each workaround applied.

        Returns:
            The stream, or ``None`` when the server cannot stream this model's answer while
            tools are offered: the caller asks without streaming.

        Raises:
            openai.OpenAIError: As the SDK raised it (the client translates it).
        """
        if "tools" in fields and fields["model"] in self._no_stream_with_tools:
            return None  # said when it was learned: once per client and model
        try:
            return await self._open(post, fields, codes)
        except _StreamWithToolsRejected:
            self._no_stream_with_tools.add(cast(str, fields["model"]))
            codes.append(STREAM_WITH_TOOLS_UNSUPPORTED)
            return None

    async def _open(
        self,
        post: Callable[[JsonObject], Awaitable[AsyncStream[object]]],
        fields: JsonObject,
        codes: list[str],
    ) -> AsyncStream[object]:
        try:
            return await post(fields)
        except openai.APIStatusError as err:
            if "stream_options" in fields and _rejects_stream_options(err):
                pass
            elif "tools" in fields and _rejects_stream_with_tools(err):
                raise _StreamWithToolsRejected from err
            else:
                raise
        # Once per client: every later stream is sent without the option.
        self.options_accepted = False
        del fields["stream_options"]
        codes.append(STREAM_OPTIONS_REJECTED)
        try:
            return await post(fields)
        except openai.APIStatusError as err:
            if "tools" in fields and _rejects_stream_with_tools(err):
                raise _StreamWithToolsRejected from err
            raise


async def read_stream(
    sdk_stream: AsyncStream[object],
    assembler: Assembler,
    notes: list[str],
    *,
    where: str,
    clock: StreamClock | None = None,
) -> AsyncGenerator[StreamEvent, None]:
    """Yield the chunks of an opened stream, then its `Completion`; close the stream.

    Args:
        sdk_stream: The stream the server answered with.
        assembler: Assembles the answer (and knows the prompt's tool-call ids).
        notes: Warnings for the completion; a connection lost after the answer adds one.
        where: The server's base URL, named in errors.
        clock: The attempt's timeouts (first chunk, between chunks, whole request).

    Raises:
        openai.OpenAIError: As the SDK raised it (the client translates it).
        MalformedChunkError: A chunk is not valid JSON (retryable).
        IncompleteStreamError: The stream ended without a finish reason.
    """
    try:
        content_type = sdk_stream.response.headers.get("content-type", "")
        if content_type.startswith("application/json"):
            # The server ignored "stream": read its whole answer instead.
            async with _Deadline(clock, first=True, where=where):
                raw = await sdk_stream.response.aread()
            data = json.loads(raw)
            for event in assembler.feed_response(data):
                yield event
            events, completion = assembler.finish(warnings=notes, require_finish_reason=False)
        else:
            try:
                chunks = SSEChunks(sdk_stream.response)
                while True:
                    if chunks.buffered:  # parsed from an earlier read: no wait to bound
                        chunk = chunks.next_buffered()
                    else:
                        async with _Deadline(clock, first=assembler.chunks == 0, where=where):
                            try:
                                chunk = await anext(chunks)
                            except StopAsyncIteration:
                                break
                    for event in assembler.feed(chunk):
                        yield event
                await chunks.finish()  # after [DONE], outside every deadline of the answer
            except openai.APIConnectionError:
                if not assembler.finished:
                    raise
                # The answer was complete (it had its finish reason); only the stream's
                # tail (usage, [DONE]) was lost, as with proxies that cut the connection.
                notes.append(WARNINGS[CONNECTION_LOST_AFTER_ANSWER])
                yield StreamWarning(
                    code=CONNECTION_LOST_AFTER_ANSWER,
                    message=WARNINGS[CONNECTION_LOST_AFTER_ANSWER],
                )
            events, completion = assembler.finish(warnings=notes)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise corrupt_chunk(
            f"chunk {assembler.chunks + 1} of the stream from {where} is not valid "
            f"JSON ({_excerpt(err)}); the answer cannot be trusted"
        ) from err
    finally:
        await sdk_stream.close()
    for event in events:
        yield event
    yield completion


class StreamClock:
    """The deadlines of one streamed attempt.

    Args:
        first_byte: Seconds from the request to the first chunk.
        chunk: Seconds allowed between two chunks.
        request: Seconds for the whole attempt.
    """

    def __init__(self, *, first_byte: float, chunk: float, request: float) -> None:
        now = asyncio.get_running_loop().time()
        self.first_byte = first_byte
        self.chunk = chunk
        self.request = request
        self.end = now + request
        self.first_chunk_by = min(self.end, now + first_byte)

    def next_deadline(self, *, first: bool) -> tuple[float, str]:
        """The deadline of the next wait, and the sentence naming the timeout that sets it."""
        if first:
            if self.first_chunk_by < self.end:
                return self.first_chunk_by, (
                    f"did not start answering within the first-byte timeout of "
                    f"{self.first_byte:g} s; raise first_byte_timeout"
                )
        else:
            by = asyncio.get_running_loop().time() + self.chunk
            if by < self.end:
                return by, (
                    f"sent nothing for the chunk timeout of {self.chunk:g} s mid-answer; "
                    "raise chunk_timeout"
                )
        return self.end, (
            f"did not finish within the request timeout of {self.request:g} s; "
            "raise it (--timeout, or timeout in the LLM config)"
        )

    def timeout_error(self, when: float, sentence: str, *, where: str) -> ModelTimeoutError:
        """The error of a missed deadline: one that used up the whole request is not retried.

        An attempt that ran for the whole request timeout (a model generating without end,
        a server that ignores ``max_tokens``) would only run as long again, while the server
        may still be busy with the abandoned attempt.
        """
        err = ModelTimeoutError(f"the model server at {where} {sentence}")
        if when >= self.end:
            err.retryable = False
        return err


class _Deadline:
    """Run the body under the clock's next deadline; a missed one is a `ModelTimeoutError`.

    A class rather than a generator-based context manager: one is entered for every chunk of
    every stream, and this costs a fraction of the generator machinery.
    """

    __slots__ = ("_clock", "_first", "_sentence", "_timeout", "_when", "_where")

    def __init__(self, clock: StreamClock | None, *, first: bool, where: str) -> None:
        self._clock = clock
        self._first = first
        self._where = where
        self._timeout: asyncio.Timeout | None = None
        self._when = 0.0
        self._sentence = ""

    async def __aenter__(self) -> None:
        if self._clock is None:
            return
        self._when, self._sentence = self._clock.next_deadline(first=self._first)
        self._timeout = asyncio.timeout_at(self._when)
        await self._timeout.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timeout is None or self._clock is None:
            return
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError as err:
            raise self._clock.timeout_error(self._when, self._sentence, where=self._where) from err


def _excerpt(err: json.JSONDecodeError | UnicodeDecodeError) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg}: {err.doc[:120]!r}"
    return str(err)
