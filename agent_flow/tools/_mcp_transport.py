"""Opening an MCP server's transport: a stdio child process or a streamable HTTP session.

A stdio server's stderr never reaches the terminal: each line goes to the file named by
``stderr_log`` or, by default, to the ``agent_flow.tools.mcp`` logger (level INFO), and the
last `STDERR_TAIL_LINES` are kept in a `ServerOutput`, so that an error about the server can
say what it printed before it failed.

The stream the server's messages arrive on is watched: when it ends (the process exited or
closed its stdout, or the HTTP session broke) `ServerOutput.closed` is set at once, so that a
server that died while idle is noticed and restarted before the next call is sent to it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, TextIO

import anyio
import httpx2
from mcp import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agent_flow._defaults import MCP_HTTP_MAX_MESSAGE_BYTES
from agent_flow._utils import cancel_and_wait
from agent_flow.tools.mcp_config import MCPServerConfig, MCPServerHTTP

if TYPE_CHECKING:
    from mcp.client._transport import ReadStream, TransportStreams
    from mcp.shared.message import SessionMessage

# Logged under the public module's name: users configure MCP logs (servers' stderr included)
# on ``agent_flow.tools.mcp``.
logger = logging.getLogger("agent_flow.tools.mcp")

#: How many of a server's last stderr lines are kept for error messages.
STDERR_TAIL_LINES = 20


class ServerOutput:
    """What one server session printed on stderr (the last lines), and whether it closed."""

    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.closed = False
        #: The last HTTP error status an HTTP server answered (``"401 Unauthorized"``): the
        #: SDK's errors say only that it answered with one.
        self.http_status: str | None = None
        self.on_closed: Callable[[], None] | None = None

    def tail(self, lines: int = 5, *, max_chars: int = 600) -> str:
        """The last `lines` non-empty stderr lines on one line (``" | "``-joined), or ``""``."""
        kept = [line for line in self.lines if line.strip()][-lines:]
        text = " | ".join(line.strip() for line in kept)
        return text if len(text) <= max_chars else "…" + text[-max_chars:]

    def _mark_closed(self) -> None:
        if not self.closed:
            self.closed = True
            if self.on_closed is not None:
                self.on_closed()


@contextlib.asynccontextmanager
async def _transport(
    config: MCPServerConfig, stack: contextlib.AsyncExitStack, output: ServerOutput
) -> AsyncIterator[TransportStreams]:
    """Open the server's transport: streamable HTTP, or a stdio child with its stderr kept."""
    if isinstance(config, MCPServerHTTP):

        async def note_status(response: httpx2.Response) -> None:
            status = f"{response.status_code} {response.reason_phrase}".strip()
            output.http_status = status if response.status_code >= 400 else None

        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=config.headers,
                timeout=httpx2.Timeout(config.connect_timeout, read=max(config.timeout, 30.0)),
                event_hooks={"response": [note_status]},
            )
        )
        async with (
            streamable_http_client(
                config.url, http_client=http, max_sse_event_size=MCP_HTTP_MAX_MESSAGE_BYTES
            ) as streams,
            _watch_closing(streams, output) as watched,
        ):
            yield watched
        return
    parameters = StdioServerParameters(
        command=config.command, args=list(config.args), env=config.env, cwd=config.cwd
    )
    log_file: TextIO | None = None
    if config.stderr_log is not None:
        log_file = await asyncio.to_thread(open, config.stderr_log, "a", encoding="utf-8")
    try:
        async with (
            _stderr_reader(config.name, output, log_file) as errlog,
            stdio_client(parameters, errlog=errlog) as streams,
        ):
            _close_quietly(errlog)  # the child has its own copy now
            async with _watch_closing(streams, output) as watched:
                yield watched
    finally:
        if log_file is not None:
            log_file.close()


@contextlib.asynccontextmanager
async def _watch_closing(
    streams: TransportStreams, output: ServerOutput
) -> AsyncIterator[TransportStreams]:
    """Pass the server's messages through, and mark `output` closed when they end."""
    read, write = streams
    sender, receiver = anyio.create_memory_object_stream["SessionMessage | Exception"](0)

    async def forward(source: ReadStream[SessionMessage | Exception]) -> None:
        try:
            async with sender:
                async for item in source:
                    await sender.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            pass  # the session side went away first: we are shutting down
        finally:
            output._mark_closed()

    async with anyio.create_task_group() as group:
        group.start_soon(forward, read)
        try:
            yield receiver, write
        finally:
            group.cancel_scope.cancel()
            receiver.close()


def _close_quietly(handle: TextIO) -> None:
    with contextlib.suppress(OSError):
        handle.close()


@contextlib.asynccontextmanager
async def _stderr_reader(
    server: str, output: ServerOutput, log_file: TextIO | None
) -> AsyncIterator[TextIO]:
    """A pipe whose write end becomes the server's stderr; its lines are kept and logged.

    Each line goes to `log_file` when given, else to the logger, and into `output.lines`.
    """
    read_fd, write_fd = os.pipe()
    writer = os.fdopen(write_fd, "w", encoding="utf-8")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
    )

    async def forward() -> None:
        while raw := await reader.readline():
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            output.lines.append(line)
            if log_file is not None:
                log_file.write(line + "\n")
                log_file.flush()
            else:
                logger.info("[%s] %s", server, line)

    task = asyncio.create_task(forward(), name=f"mcp-stderr-{server}")
    try:
        yield writer
    finally:
        _close_quietly(writer)
        # The server is gone; its last lines are in the pipe. A straggling child that still
        # holds the pipe open must not hold us up.
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(task)
        finally:  # (cancelled meanwhile: the reader still stops and the pipe still closes)
            try:
                await cancel_and_wait(task)
            finally:
                transport.close()
