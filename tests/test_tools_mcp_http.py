"""MCP over streamable HTTP, against a real server the test starts on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agent_flow.errors import MCPServerError
from agent_flow.tools import MCPServerHTTP, MCPServers, ToolExecutor, ToolPolicy
from tests.helpers import start_http_server, stop_process
from tests.helpers import tool_call as call
from tests.openai_server import OpenAIServer, json_reply


@pytest_asyncio.fixture
async def http_server(tmp_path: Path) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    with (tmp_path / "http_server.log").open("w") as log:
        port, process = await start_http_server(log)
        try:
            yield f"http://127.0.0.1:{port}/mcp", process
        finally:
            await stop_process(process)


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


async def test_a_restarted_server_gets_a_new_session_and_large_results_come_whole(
    tmp_path: Path,
) -> None:
    """A server that restarted no longer knows the session: the call runs on a new one.

    Before, every later call failed as "refused" (the server's 404 read as its answer) and the
    session was never opened again. A result over the SDK's 1 MiB event limit was read as a
    lost connection and cost a restart each time.
    """
    with (tmp_path / "http_server.log").open("w") as log:
        port, process = await start_http_server(log)
        try:
            config = MCPServerHTTP(
                name="web", url=f"http://127.0.0.1:{port}/mcp", max_restarts=3, policy=ToolPolicy()
            )
            executor = ToolExecutor()
            async with MCPServers([config]) as servers:
                servers.register(executor)
                first = await executor.execute_one(call("web_echo", '{"text": "before"}'))
                assert first.result.content == "before"
                await stop_process(process)
                _, process = await start_http_server(log, port)
                for text in ("after", "again"):
                    used = await executor.execute_one(call("web_echo", f'{{"text": "{text}"}}'))
                    assert (used.result.is_error, used.result.content) == (False, text)
                assert servers["web"].restarts == 1
                for _ in range(4):  # more than max_restarts, were each one a restart
                    big = await executor.execute_one(
                        call("web_repeat", '{"text": "big result ", "times": 200000}')
                    )
                    # Whole (2 MB), then cut to the output limit for the model.
                    assert not big.result.is_error, big.result.content[:300]
                    assert big.result.truncated and big.result.content.startswith("big result ")
                assert servers["web"].restarts == 1
        finally:
            await stop_process(process)


@pytest.mark.parametrize(
    ("status", "reason"), [(401, "Unauthorized"), (500, "Internal Server Error")]
)
async def test_an_http_error_is_named_by_its_status(status: int, reason: str) -> None:
    """Bad credentials and a failing server read differently (the SDK says neither)."""
    async with OpenAIServer() as server:
        server.routes[("POST", "/mcp")] = json_reply({"error": "scripted"}, status=status)
        url = server.base_url.removesuffix("/v1") + "/mcp"
        config = MCPServerHTTP(name="web", url=url, connect_timeout=5)
        with pytest.raises(MCPServerError) as raised:
            async with MCPServers([config]):
                pass
    assert f"(the server answered HTTP {status} {reason})" in str(raised.value)
