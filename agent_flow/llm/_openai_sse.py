"""The chunks of a streamed chat completion, read from the response's server-sent events.

Private to `agent_flow.llm`. `SSEChunks` reads the body of a stream the SDK opened
(`AsyncStream.response`) and yields each event's JSON data, as the SDK's own iteration of
an `AsyncStream[object]` does, with the same errors: an event whose data carries an
``error`` is an `openai.APIError`, a timeout while reading an `openai.APITimeoutError`, a
lost connection an `openai.APIConnectionError`; data that is not JSON (or not UTF-8)
raises the decoder's error. ``[DONE]`` ends the answer and the rest of the body is drained
(for a while at most, never an error).

Why not the SDK's iteration: it stops at ``[DONE]`` with its generators (its event reader,
its SSE decoder, httpx's byte iterators) suspended, and asyncio finalizes each suspended
async generator by waking the event loop through its self-pipe and running a task to close
it: four system calls and four tasks per streamed answer, and its drain enters two AnyIO
cancel scopes. This reads the body to its end, so every generator under it finishes, and
parses each network chunk's lines at once instead of one generator step per line.

Events are parsed as the HTML standard says (lines end in CRLF, LF or CR; ``:`` starts a
comment; one space after the field's colon is dropped; ``data`` lines join with LF; an
event is dispatched at an empty line, and one the body ends inside is dropped).
"""

from __future__ import annotations

import asyncio
import json
import ssl
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
        self._ready: deque[object] = deque()
        self._partial = b""  # the start of a line whose end has not arrived
        self._data: list[bytes] = []
        self._first = True
        self._done = False  # [DONE] seen: the rest of the body is drained, not parsed
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
        ready = self._ready
        while not ready:
            if self._ended:
                raise StopAsyncIteration
            if self._done:
                await self._drain()
            else:
                await self._read()
        return self.next_buffered()

    async def _read(self) -> None:
        try:
            chunk = await anext(self._bytes)
        except StopAsyncIteration:
            self._ended = True
            if self._partial.endswith(b"\r"):  # a line end held back for a possible LF
                self._lines([self._partial[:-1]])
            return  # an event the body ended inside is dropped
        except httpx2.TimeoutException as err:
            raise openai.APITimeoutError(request=self._response.request) from err
        except (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream) as err:
            raise openai.APIConnectionError(request=self._response.request) from err
        self._feed(chunk)

    async def _drain(self) -> None:
        """Read what follows ``[DONE]`` to the end of the body, for `DRAIN_SECONDS` at most.

        A completed answer is never turned into an error by what comes after it.
        """
        self._ended = True
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                async for _ in self._bytes:
                    pass
        except (TimeoutError, httpx2.HTTPError, ssl.SSLError, anyio.EndOfStream):
            await self._response.aclose()

    def _feed(self, chunk: bytes) -> None:
        text = self._partial + chunk if self._partial else chunk
        if self._first:
            if len(text) < len(_BOM) and _BOM.startswith(text):
                self._partial = text  # maybe a byte-order mark cut by the read
                return
            self._first = False
            text = text.removeprefix(_BOM)
        if b"\r" in text:
            # A CR at the end may be the first half of a CRLF: keep it for the next read.
            held = b"\r" if text.endswith(b"\r") else b""
            if held:
                text = text[:-1]
            lines = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            self._partial = lines.pop() + held
        else:
            lines = text.split(b"\n")
            self._partial = lines.pop()
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
