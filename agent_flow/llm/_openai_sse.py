"""The chunks of a streamed chat completion, read from the response's server-sent events.

Private to `agent_flow.llm`. `SSEChunks` reads the body of a stream the SDK opened
(`AsyncStream.response`) and yields each event's JSON data, as the SDK's own iteration of
an `AsyncStream[object]` does, with the same errors: an event whose data carries an
``error`` is an `openai.APIError`, a timeout while reading an `openai.APITimeoutError`, a
lost connection an `openai.APIConnectionError`; data that is not JSON (or not UTF-8)
raises the decoder's error. ``[DONE]`` ends the iteration; `SSEChunks.finish` then drains
the rest of the body (for a while at most, never an error), outside the answer's deadlines.

Why not the SDK's iteration: it stops at ``[DONE]`` with its generators (its event reader,
its SSE decoder, httpx's byte iterators) suspended, and asyncio finalizes each suspended
async generator by waking the event loop through its self-pipe and running a task to close
it: four system calls and four tasks per streamed answer, and its drain enters two AnyIO
cancel scopes. This reads the body to its end, so every generator under it finishes, and
parses each network read's lines at once instead of one generator step per line.

Events are parsed as the HTML standard says (a leading byte-order mark is skipped; lines end
in CRLF, LF or CR; ``:`` starts a comment; one space after the field's colon is dropped;
``data`` lines join with LF; an event is dispatched at an empty line, one with no data is
not, and one the body ends inside is dropped). Where the SDK's decoder differs, this follows
the standard: the SDK reads a byte-order mark as part of the first field's name, fails on an
event with no data (``event: ping``; it parses the empty data as JSON) and on bytes that are
not UTF-8 in a line it ignores (a comment, an ``id``).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from collections import deque
from collections.abc import AsyncIterator

import anyio
import httpx2
import openai

__all__ = ["DRAIN_SECONDS", "SSEChunks"]

#: The longest wait for the rest of the body after ``[DONE]`` (as the SDK's own drain).
DRAIN_SECONDS = 0.1
_BOM = b"\xef\xbb\xbf"
_STREAM_ERROR = "An error occurred during streaming"  # the SDK's message for one without


def _transport_errors() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """What a read of the body raises on a timeout, and on a failed connection.

    As the SDK maps them: httpx2's, and the original httpx's when it is loaded (an
    `AsyncOpenAI` may be given an ``httpx.AsyncClient``).
    """
    timeouts: tuple[type[Exception], ...] = (httpx2.TimeoutException,)
    failures: tuple[type[Exception], ...] = (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream)
    legacy = sys.modules.get("httpx")
    if legacy is not None and legacy is not httpx2:
        timeouts += (legacy.TimeoutException,)
        failures += (legacy.RequestError,)
    return timeouts, failures


class _Raise:
    """An error found while parsing: raised when the consumer reaches it.

    The chunks parsed before it from the same network read come first.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class SSEChunks:
    """An async iterator of a stream's chunks (each event's JSON data); see the module.

    Args:
        response: The streamed response, not read yet. The caller closes it.
    """

    def __init__(self, response: httpx2.Response) -> None:
        self._response = response
        self._bytes: AsyncIterator[bytes] = response.aiter_bytes()
        self._timeouts, self._failures = _transport_errors()
        self._drain_errors: tuple[type[Exception], ...] = (
            TimeoutError,
            *self._timeouts,
            *self._failures,
        )
        self._ready: deque[object] = deque()
        self._partial = bytearray()  # the start of a line whose end has not arrived
        self._data: list[bytes] = []
        self._first = True
        self._done = False  # [DONE] seen: the rest of the body is not parsed
        self._ended = False

    def __aiter__(self) -> SSEChunks:
        return self

    @property
    def buffered(self) -> bool:
        """Whether the next chunk (or error) is already read: `next_buffered` needs no wait."""
        return bool(self._ready)

    def next_buffered(self) -> object:
        """The next chunk, parsed from an earlier read (see `buffered`); raise its error."""
        item = self._ready.popleft()
        if type(item) is _Raise:
            raise item.error
        return item

    async def __anext__(self) -> object:
        """The next chunk; the iteration stops at the end of the body or at ``[DONE]``."""
        ready = self._ready
        while not ready:
            if self._ended or self._done:
                raise StopAsyncIteration
            await self._read()
        return self.next_buffered()

    async def finish(self) -> None:
        """After ``[DONE]``: read the rest of the body, for `DRAIN_SECONDS` at most.

        Call it outside any deadline of the answer: a completed answer is never turned into
        an error by what comes after it. On HTTP/1.1 the connection is reused once the body
        is read to its end (as the SDK drains it); a body that does not end in time, or one
        that fails, closes the response. Over HTTP/2 the stream is closed at once (the
        connection stays), as the SDK does.
        """
        if not self._done or self._ended:
            return
        self._ended = True
        if self._response.http_version != "HTTP/1.1":
            await self._response.aclose()
            return
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                async for _ in self._bytes:
                    pass
        except self._drain_errors:
            await self._response.aclose()

    async def _read(self) -> None:
        try:
            chunk = await anext(self._bytes)
        except StopAsyncIteration:
            self._ended = True
            self._feed(b"", end=True)  # an event the body ended inside is dropped
            return
        except self._timeouts as err:
            raise openai.APITimeoutError(request=self._response.request) from err
        except self._failures as err:
            raise openai.APIConnectionError(request=self._response.request) from err
        self._feed(chunk)

    def _feed(self, chunk: bytes, *, end: bool = False) -> None:
        """Parse the lines `chunk` completes; keep the line it leaves unfinished."""
        if self._first:
            text = bytes(self._partial) + chunk
            if not end and len(text) < len(_BOM) and _BOM.startswith(text):
                self._partial = bytearray(text)  # maybe a byte-order mark cut by the read
                return
            self._first = False
            self._partial = bytearray()
            chunk = text.removeprefix(_BOM)
        if not end and b"\n" not in chunk and b"\r" not in chunk:
            self._partial += chunk  # a long line in many reads: no copy of what came before
            return
        text = bytes(self._partial) + chunk if self._partial else chunk
        held = b""
        if b"\r" in text:
            if not end and text.endswith(b"\r"):
                # Maybe the first half of a CRLF: decided by the next read.
                text, held = text[:-1], b"\r"
            lines = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        else:
            lines = text.split(b"\n")
        self._partial = bytearray(lines.pop() + held)
        self._lines(lines)

    def _lines(self, lines: list[bytes]) -> None:
        for line in lines:
            if self._done:
                return
            if not line:
                self._dispatch()
            elif line[0] != 58:  # ":" starts a comment
                field, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if field == b"data":  # event names, ids and retry times are not used
                    self._data.append(value)

    def _dispatch(self) -> None:
        data, self._data = self._data, []
        if not data:
            return
        try:
            text = b"\n".join(data).decode()
            if text.startswith("[DONE]"):
                self._done = True
                return
            chunk = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            self._ready.append(_Raise(err))
            return
        if isinstance(chunk, dict) and chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            if not message or not isinstance(message, str):
                message = _STREAM_ERROR
            failure = openai.APIError(message, request=self._response.request, body=error)
            self._ready.append(_Raise(failure))
            return
        self._ready.append(chunk)
