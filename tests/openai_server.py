"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benchmarks.

A plain ``asyncio.start_server`` HTTP/1.1 server (keep-alive, chunked streaming), so the real
`AsyncOpenAI` talks to it over real sockets and nothing reaches the internet. Each request
is answered by the next scripted reply (a `Reply`, or a function request -> reply, sync or
async), else by the server's `handler`; every request is recorded.

    async with OpenAIServer() as server:
        server.script(sse_reply(text_chunks("Hello there")), error_reply(429), ...)
        client = OpenAIClient("m", base_url=server.base_url, api_key="k")

Replies are encoded once, up front, so a benchmark can reuse one `Reply` object and the
server answers as fast as asyncio can write::

    answer = sse_reply(text_chunks("done"))
    server = OpenAIServer(handler=lambda request: answer)   # or a function of the request
    server.record = False                                    # keep no history in long runs

Everything a test needs from a real server is scriptable: streams in many small chunks
(`text_chunks`, `tool_call_chunks`, `split_bytes`), whole JSON answers (`json_reply`,
`completion_body`), HTTP errors with instant retries (`error_reply`, which sends
``retry-after-ms: 1``), a connection dropped mid-stream (``drop_after``), streams without a
finish reason (``finish_reason=None``), corrupt chunks (raw strings or bytes in
`sse_reply`), a server that never answers (``Reply(hang=True)``), and conditional answers
such as rejecting ``stream_options`` (a function of the request).

Requests to other routes than chat completions (a client asking ``GET /props`` for the
server's context size, as `agent-flow run` does of a local server) never take a scripted
reply: they are answered from `routes` by method and path (a llama.cpp-like ``/props``, say),
else with 404, and recorded in `side_requests`, not `requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Any, TypeAlias

__all__ = [
    "OpenAIServer",
    "RecordedRequest",
    "Reply",
    "completion_body",
    "error_reply",
    "json_reply",
    "llama_cpp_like",
    "sse_reply",
    "stream_error_reply",
    "text_chunks",
    "tool_call_chunks",
]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    raw_body: bytes

    @property
    def body(self) -> Any:
        """The JSON body, parsed."""
        return json.loads(self.raw_body) if self.raw_body else None


@dataclass(frozen=True)
class Reply:
    """A scripted answer, pre-encoded.

    Attributes:
        status: HTTP status.
        headers: Extra response headers.
        body: The whole body (non-streamed replies).
        events: SSE frames, already encoded (streamed replies).
        split_bytes: Write the stream in HTTP chunks of at most this many bytes (an SSE frame
            then arrives in pieces).
        drop_after: Close the connection abruptly after this many frames (mid-stream).
        hang: Never answer (for timeout tests); the request still counts.
        stall_after: Send this many frames, then go silent without closing (a stalled
            server mid-stream).
        close_at_once: Read the request, then close the connection without a byte of answer
            (a server that accepts and then closes).
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    events: tuple[bytes, ...] | None = None
    split_bytes: int | None = None
    drop_after: int | None = None
    hang: bool = False
    stall_after: int | None = None
    close_at_once: bool = False
    _encoded: bytes = field(default=b"", repr=False)

    def encoded_head(self) -> bytes:
        reason = _REASONS.get(self.status, "Status")
        lines = [f"HTTP/1.1 {self.status} {reason}"]
        if self.events is None:
            lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(self.body)}")
        else:
            lines.append("Content-Type: text/event-stream")
            lines.append("Transfer-Encoding: chunked")
        lines.extend(f"{k}: {v}" for k, v in self.headers)
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


ReplyLike: TypeAlias = Reply | Callable[[RecordedRequest], "Reply | Awaitable[Reply]"]


def _prepare(reply: Reply) -> Reply:
    """Encode a whole, undisturbed reply once, so serving it is a single write."""
    if (
        reply.split_bytes
        or reply.drop_after is not None
        or reply.hang
        or reply.stall_after is not None
        or reply.close_at_once
    ):
        return reply
    head = reply.encoded_head()
    if reply.events is None:
        payload = head + reply.body
    else:
        stream = b"".join(reply.events)
        # An empty stream is just the last chunk (a zero-length chunk would end it early).
        body = f"{len(stream):x}\r\n".encode() + stream + b"\r\n" if stream else b""
        payload = head + body + b"0\r\n\r\n"
    return Reply(
        status=reply.status,
        headers=reply.headers,
        body=reply.body,
        events=reply.events,
        _encoded=payload,
    )


def json_reply(
    body: object, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> Reply:
    """A non-streamed JSON answer."""
    return _prepare(
        Reply(status=status, headers=tuple((headers or {}).items()), body=json.dumps(body).encode())
    )


def error_reply(
    status: int,
    message: str = "scripted error",
    *,
    code: str | None = None,
    type: str | None = None,
    headers: Mapping[str, str] | None = None,
    retry_after_ms: int | None = 1,
) -> Reply:
    """An OpenAI-style error answer; ``retry-after-ms`` keeps the SDK's retries instant."""
    extra = dict(headers or {})
    if retry_after_ms is not None:
        extra.setdefault("retry-after-ms", str(retry_after_ms))
        extra.setdefault("retry-after", "0")
    error = {
        "message": message,
        "type": type or "invalid_request_error",
        "code": code,
        "param": None,
    }
    return json_reply({"error": error}, status=status, headers=extra)


def stream_error_reply(message: str = "scripted stream error") -> Reply:
    """HTTP 200 and a stream whose only event is an error (how llama-cpp-python refuses)."""
    return sse_reply([{"error": {"message": message, "type": "server_error", "code": 500}}])


def llama_cpp_like(reply: Reply) -> Callable[[RecordedRequest], Reply]:
    """`reply`, unless the request has an assistant message with ``"content": null``.

    llama-cpp-python's server answers such a request with HTTP 500 (its template cannot
    render a null content), and the same request fails the same way however often it is sent.
    """

    def answer(request: RecordedRequest) -> Reply:
        for message in request.body.get("messages", []):
            if message.get("role") == "assistant" and message.get("content", "") is None:
                return error_reply(
                    500, 'can only concatenate str (not "NoneType") to str', retry_after_ms=None
                )
        return reply

    return answer


def sse_reply(
    chunks: Iterable[object],
    *,
    done: bool = True,
    split_bytes: int | None = None,
    drop_after: int | None = None,
    stall_after: int | None = None,
) -> Reply:
    """A streamed answer: each chunk is one frame (a dict as JSON; str/bytes sent as is)."""
    frames = [b"data: " + _frame_data(chunk) + b"\n\n" for chunk in chunks]
    if done:
        frames.append(b"data: [DONE]\n\n")
    return _prepare(
        Reply(
            events=tuple(frames),
            split_bytes=split_bytes,
            drop_after=drop_after,
            stall_after=stall_after,
        )
    )


def _frame_data(chunk: object) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, str):
        return chunk.encode()
    return json.dumps(chunk).encode()


def _chunk(
    delta: Mapping[str, object] | None, *, finish: str | None = None, model: str = "test-model"
) -> dict[str, object]:
    choices = [] if delta is None else [{"index": 0, "delta": dict(delta), "finish_reason": finish}]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": choices,
    }


def _usage(
    prompt: int, completion: int, *, cached: int | None = None, reasoning: int | None = None
) -> dict[str, object]:
    usage: dict[str, object] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def text_chunks(
    text: str,
    *,
    chunk_size: int = 3,
    finish_reason: str | None = "stop",
    usage: tuple[int, int] | None = (11, 7),
    reasoning: str = "",
    reasoning_field: str = "reasoning_content",
    role_chunk: bool = True,
) -> list[dict[str, object]]:
    """Chunks of a streamed text answer, `chunk_size` characters each.

    Usage (prompt, completion) comes in a last chunk with empty choices, as with
    ``stream_options.include_usage``; ``finish_reason=None`` leaves the finish reason out.
    """
    chunks: list[dict[str, object]] = []
    if role_chunk:
        chunks.append(_chunk({"role": "assistant", "content": ""}))
    for piece in _pieces(reasoning, chunk_size) if reasoning else []:
        chunks.append(_chunk({reasoning_field: piece}))
    for piece in _pieces(text, chunk_size) if text else []:
        chunks.append(_chunk({"content": piece}))
    if finish_reason is not None:
        chunks.append(_chunk({}, finish=finish_reason))
    if usage is not None:
        chunk = _chunk(None)
        chunk["usage"] = _usage(*usage)
        chunks.append(chunk)
    return chunks


def tool_call_chunks(
    calls: Sequence[tuple[str | None, str, str]],
    *,
    chunk_size: int = 4,
    text: str = "",
    finish_reason: str | None = "tool_calls",
    usage: tuple[int, int] | None = (20, 9),
    interleave: bool = False,
    with_index: bool = True,
) -> list[dict[str, object]]:
    """Chunks of a streamed answer with tool calls ``(id or None, name, arguments)``.

    Id and name come only in each call's first fragment, keyed by ``index``; arguments
    follow in `chunk_size` pieces, call after call (or round-robin with `interleave`).
    """
    chunks: list[dict[str, object]] = [_chunk({"role": "assistant", "content": None})]
    for piece in _pieces(text, chunk_size) if text else []:
        chunks.append(_chunk({"content": piece}))
    per_call: list[list[dict[str, object]]] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        first: dict[str, object] = {"type": "function", "function": {"name": name, "arguments": ""}}
        if call_id is not None:
            first["id"] = call_id
        fragments = [first] + [
            {"function": {"arguments": p}} for p in _pieces(arguments, chunk_size)
        ]
        if with_index:
            for fragment in fragments:
                fragment["index"] = index
        per_call.append([_chunk({"tool_calls": [f]}) for f in fragments])
    if interleave:
        longest = max((len(c) for c in per_call), default=0)
        for i in range(longest):
            chunks.extend(c[i] for c in per_call if i < len(c))
    else:
        for c in per_call:
            chunks.extend(c)
    if finish_reason is not None:
        chunks.append(_chunk({}, finish=finish_reason))
    if usage is not None:
        chunk = _chunk(None)
        chunk["usage"] = _usage(*usage)
        chunks.append(chunk)
    return chunks


def completion_body(
    text: str | None = None,
    *,
    tool_calls: Sequence[tuple[str | None, str, object]] = (),
    finish_reason: str | None = "stop",
    usage: tuple[int, int] | None = (11, 7),
    cached: int | None = None,
    reasoning_tokens: int | None = None,
    reasoning: str | None = None,
    function_call: tuple[str, str] | None = None,
    model: str = "test-model",
) -> dict[str, object]:
    """A non-streamed chat completion body."""
    message: dict[str, object] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {
                **({"id": call_id} if call_id is not None else {}),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for call_id, name, arguments in tool_calls
        ]
    if function_call is not None:
        message["function_call"] = {"name": function_call[0], "arguments": function_call[1]}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    body: dict[str, object] = {
        "id": "chatcmpl-whole",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = _usage(*usage, cached=cached, reasoning=reasoning_tokens)
    return body


_NOT_FOUND = json_reply({"error": {"message": "no such route", "type": "not_found"}}, status=404)


class OpenAIServer:
    """The scripted server. Use as ``async with OpenAIServer() as server``.

    Args:
        handler: Answers requests when the script is empty (a benchmark's fixed reply).
        ssl: Serve HTTPS with this context (`base_url` then says ``https``).
    """

    def __init__(
        self,
        handler: Callable[[RecordedRequest], Reply | Awaitable[Reply]] | None = None,
        *,
        ssl: SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.ssl = ssl
        #: Connections accepted so far, and the most open at once.
        self.connections = 0
        self.most_open = 0
        self.requests: list[RecordedRequest] = []
        self.unexpected: list[RecordedRequest] = []
        #: Answers to requests other than chat completions, by (method, path without query).
        self.routes: dict[tuple[str, str], Reply] = {}
        #: The requests answered from `routes` (or with 404), in order.
        self.side_requests: list[RecordedRequest] = []
        self.record = True
        self._script: deque[ReplyLike] = deque()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()
        self.port = 0

    @property
    def base_url(self) -> str:
        """The API root to give the client."""
        scheme = "https" if self.ssl is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    def script(self, *replies: ReplyLike) -> None:
        """Queue replies, answered in order, one per request."""
        self._script.extend(replies)

    @property
    def remaining(self) -> int:
        """Scripted replies not yet used."""
        return len(self._script)

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the requests received, in order."""
        return [request.body for request in self.requests]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._closing.set()  # releases hanging replies
        for writer in list(self._writers):
            writer.close()
        if self._tasks:
            # Closing the sockets ends every handler; the timeout only guards against a bug.
            _, pending = await asyncio.wait(list(self._tasks), timeout=5)
            for task in pending:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def close_idle(self) -> None:
        """Close every open connection, as a server's keep-alive timeout closes idle ones.

        Over TLS the socket is closed at once, as nginx does, not after waiting for the
        client's own TLS close (which an idle client does not send until it reads again).
        """
        writers = list(self._writers)
        for writer in writers:
            if self.ssl is not None:
                writer.transport.abort()
            else:
                writer.close()
        for writer in writers:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def __aenter__(self) -> OpenAIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _next_reply(self, request: RecordedRequest) -> Reply:
        item: ReplyLike | None = None
        if self._script:
            item = self._script.popleft()
        elif self.handler is not None:
            item = self.handler
        if item is None:
            self.unexpected.append(request)
            return error_reply(500, "the test server's script is exhausted", retry_after_ms=None)
        if isinstance(item, Reply):
            return item
        result = item(request)
        if not isinstance(result, Reply):
            result = await result
        return result

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        self.most_open = max(self.most_open, len(self._writers))
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                request = RecordedRequest(method, path, headers, body)
                route = path.split("?", 1)[0]
                if not route.endswith("/chat/completions"):
                    self.side_requests.append(request)
                    reply = self.routes.get((method, route)) or _NOT_FOUND
                else:
                    if self.record:
                        self.requests.append(request)
                    reply = await self._next_reply(request)
                if not await self._write(reply, writer):
                    return
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.close()

    async def _write(self, reply: Reply, writer: asyncio.StreamWriter) -> bool:
        """Send `reply`; return whether the connection can be reused."""
        if reply.hang:
            await self._closing.wait()
            return False
        if reply.close_at_once:
            writer.transport.abort()
            return False
        if reply._encoded:
            writer.write(reply._encoded)
            await writer.drain()
            return True
        writer.write(reply.encoded_head())
        if reply.events is None:
            writer.write(reply.body)
            await writer.drain()
            return True
        for number, frame in enumerate((*reply.events, None)):
            if reply.drop_after is not None and number >= reply.drop_after:
                await writer.drain()
                writer.transport.abort()
                return False
            if reply.stall_after is not None and number >= reply.stall_after:
                await writer.drain()
                await self._closing.wait()
                return False
            if frame is None:  # every frame sent
                break
            size = reply.split_bytes or len(frame)
            for start in range(0, len(frame), size):
                piece = frame[start : start + size]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
