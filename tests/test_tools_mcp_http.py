"""MCP over streamable HTTP, against a real server the test starts on 127.0.0.1."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from agent_flow.tools import MCPServerHTTP, MCPServers, ToolExecutor, ToolPolicy
from tests.helpers import MCP_SERVERS
from tests.helpers import tool_call as call


@pytest_asyncio.fixture
async def http_server(tmp_path: Path) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    log = (tmp_path / "http_server.log").open("w")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(MCP_SERVERS / "basic_server.py"),
        "http",
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            port = int(await process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        log.close()


async def test_a_streamable_http_server_works_like_a_stdio_one(
    http_server: tuple[str, asyncio.subprocess.Process],
) -> None:
    url, process = http_server
    config = MCPServerHTTP(
        name="web",
        url=url,
        headers={"X-Agent": "agent-flow"},
        max_restarts=1,
        policy=ToolPolicy(),  # its tools carry no annotations: trusted here
    )
    executor = ToolExecutor()
    async with MCPServers([config]) as servers:
        names = servers.register(executor)
        assert "web_echo" in names
        echo, added, header = await executor.execute(
            [
                call("web_echo", '{"text": "over http"}', "1"),
                call("web_add", '{"numbers": [4, 5]}', "2"),
                call("web_header", '{"name": "x-agent"}', "3"),
            ]
        )
        assert echo.result.content == "over http"
        assert added.result.data == {"total": 9, "terms": [4, 5]}
        assert header.result.content == "agent-flow"
        # The server goes away: calls fail with a readable error, nothing raises.
        process.kill()
        await process.wait()
        gone = await executor.execute_one(call("web_echo", '{"text": "anyone?"}'))
        assert gone.result.error_kind == "server_unavailable"
        assert gone.result.content.startswith(
            "MCP server 'web' closed the connection during the call to 'echo'"
        )
        # The next call tries to reconnect (once: max_restarts=1) and reports why it failed.
        again = await executor.execute_one(call("web_echo", '{"text": "still?"}'))
        assert again.result.error_kind == "server_unavailable"
        assert again.result.content == (
            "MCP server 'web' could not be reached: ConnectError: All connection attempts failed"
        )
        assert servers["web"].restarts == 1
