"""Opening an MCP server's transport: a stdio child process or a streamable HTTP session.

A stdio server's stderr never reaches the terminal: it goes to the file named by
``stderr_log`` or, by default, line by line to the ``agent_flow.tools.mcp`` logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TextIO

import httpx2
from mcp import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agent_flow.tools.mcp_config import MCPServerConfig, MCPServerHTTP

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

# Logged under the public module's name: users configure MCP logs (servers' stderr included)
# on ``agent_flow.tools.mcp``.
logger = logging.getLogger("agent_flow.tools.mcp")


@contextlib.asynccontextmanager
async def _transport(
    config: MCPServerConfig, stack: contextlib.AsyncExitStack
) -> AsyncIterator[TransportStreams]:
    """Open the server's transport: streamable HTTP, or a stdio child with its stderr logged."""
    if isinstance(config, MCPServerHTTP):
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=config.headers,
                timeout=httpx2.Timeout(config.connect_timeout, read=max(config.timeout, 30.0)),
            )
        )
        async with streamable_http_client(config.url, http_client=http) as streams:
            yield streams
        return
    parameters = StdioServerParameters(
        command=config.command, args=list(config.args), env=config.env, cwd=config.cwd
    )
    if config.stderr_log is not None:
        log_file: TextIO = await asyncio.to_thread(open, config.stderr_log, "a", encoding="utf-8")
        try:
            async with stdio_client(parameters, errlog=log_file) as streams:
                yield streams
        finally:
            log_file.close()
        return
    async with (
        _stderr_to_logger(config.name) as errlog,
        stdio_client(parameters, errlog=errlog) as streams,
    ):
        _close_quietly(errlog)  # the child has its own copy now
        yield streams


def _close_quietly(handle: TextIO) -> None:
    with contextlib.suppress(OSError):
        handle.close()


@contextlib.asynccontextmanager
async def _stderr_to_logger(server: str) -> AsyncIterator[TextIO]:
    """A pipe whose write end becomes the server's stderr; its lines go to the logger."""
    read_fd, write_fd = os.pipe()
    writer = os.fdopen(write_fd, "w", encoding="utf-8")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
    )

    async def forward() -> None:
        while line := await reader.readline():
            logger.info("[%s] %s", server, line.decode("utf-8", errors="replace").rstrip())

    task = asyncio.create_task(forward(), name=f"mcp-stderr-{server}")
    try:
        yield writer
    finally:
        _close_quietly(writer)
        # The server is gone; its last lines are in the pipe. A straggling child that still
        # holds the pipe open must not hold us up.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.shield(task)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        transport.close()
