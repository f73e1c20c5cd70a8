"""MCP servers as agent_flow tools (through the ``mcp`` SDK 2.x).

Configuration is data: `MCPServerStdio` (command, args, env, cwd) and `MCPServerHTTP`
(streamable HTTP: URL, headers) are frozen pydantic models, tagged by ``kind``, so they load
from a config file (`MCP_SERVER_CONFIG_ADAPTER`). Each names the server (the namespace of its
tools: ``<server>_<tool>``), allow/deny lists of tool names (globs; deny wins), the call
timeout, and how often the server may be restarted.

`MCPConnection` (in `_mcp_connection`) owns one live session, in a task of its own. A call
never raises for a failure: an error the server reports, a JSON-RPC error, a timeout or a
lost connection each becomes an error result saying what happened; a server that fails or
stops answering is restarted on its next use, at most ``max_restarts`` times within
``restart_window`` seconds (ten minutes by default; None: over the connection's life).

A stdio server's stderr never reaches the terminal: it goes to the file named by
``stderr_log`` or, by default, line by line to the ``agent_flow.tools.mcp`` logger
(`_mcp_transport`).

`MCPServers` starts several servers at once as one ``async with`` block and registers their
tools with a `ToolExecutor`. Each server tool becomes an `MCPTool`, and its results are
converted for the model by `convert_call_result` (both in `_mcp_tool`): text as is,
structured content as data, images, audio and binary resources described and kept as
`Attachment`s, never pasted as base64.

Besides tools, a connection lists the server's resources, resource templates and prompts,
reads resources (`MCPConnection.read_resource`), renders prompts (`get_prompt`), subscribes
to resources where the server supports it, and notes the server's ``list_changed`` and
``resources/updated`` notifications (`MCPConnection.notices`) until `MCPConnection.refresh`
lists again. How an agent uses them is in `agent_flow.tools.mcp_resources`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Self

from agent_flow.errors import MCPServerError, MCPServerTimeoutError, ToolDefinitionError
from agent_flow.tools._mcp_catalog import ListChange
from agent_flow.tools._mcp_connection import MCPConnection
from agent_flow.tools._mcp_tool import MCPTool, convert_call_result
from agent_flow.tools.filters import MCPFilter
from agent_flow.tools.mcp_config import (
    MCP_SERVER_CONFIG_ADAPTER,
    MCPServerConfig,
    MCPServerHTTP,
    MCPServerStdio,
    add_server_secrets,
)

if TYPE_CHECKING:
    from agent_flow.tools.executor import ToolExecutor

__all__ = [
    "MCP_SERVER_CONFIG_ADAPTER",
    "ListChange",
    "MCPConnection",
    "MCPServerConfig",
    "MCPServerHTTP",
    "MCPServerStdio",
    "MCPServers",
    "MCPTool",
    "convert_call_result",
]

logger = logging.getLogger(__name__)


class MCPServers:
    """Several MCP servers started and stopped together.

    ```python
    async with MCPServers([MCPServerStdio(name="fs", command="mcp-fs")]) as servers:
        servers.register(executor)  # fs_read_file, fs_write_file, ...
    ```

    Servers start concurrently. A required server that fails to start makes entering fail
    (the others are stopped again); an optional one is skipped with a warning.

    Args:
        servers: Configurations or connections.

    Raises:
        ToolDefinitionError: Two servers share a name.
    """

    def __init__(self, servers: Iterable[MCPServerConfig | MCPConnection]) -> None:
        self.connections: dict[str, MCPConnection] = {}
        for server in servers:
            connection = server if isinstance(server, MCPConnection) else MCPConnection(server)
            if connection.name in self.connections:
                raise ToolDefinitionError(
                    f"two MCP servers are named {connection.name!r}; give each a unique name"
                )
            self.connections[connection.name] = connection
        self.failed: dict[str, str] = {}

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __getitem__(self, name: str) -> MCPConnection:
        return self.connections[name]

    async def start(self) -> None:
        """Start every server concurrently.

        Raises:
            MCPServerTimeoutError: Required servers did not answer within their
                ``connect_timeout``.
            MCPServerError: A required server could not be started.
        """
        connections = list(self.connections.values())
        try:
            outcomes = await asyncio.gather(
                *(connection.start() for connection in connections), return_exceptions=True
            )
        except BaseException:
            # Cancelled while starting (the gather ends once every start has): those that
            # had started would be left running with nobody to stop them.
            await self.aclose()
            raise
        errors: list[Exception] = []
        for connection, outcome in zip(connections, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    await self.aclose()
                    raise outcome
                self.failed[connection.name] = str(outcome)
                if connection.config.required:
                    errors.append(outcome)
                else:
                    logger.warning("skipping optional MCP server: %s", outcome)
                    del self.connections[connection.name]
                    await connection.aclose()
        if errors:
            await self.aclose()
            message = "; ".join(str(error) for error in errors)
            if all(isinstance(error, MCPServerTimeoutError) for error in errors):
                raise MCPServerTimeoutError(message)
            raise MCPServerError(message)

    def tools(self) -> list[tuple[str, MCPTool]]:
        """Every offered tool, with its server's name (its namespace)."""
        return [
            (name, tool)
            for name, connection in self.connections.items()
            for tool in connection.tools
        ]

    def register(self, executor: ToolExecutor, *, mcp_filter: MCPFilter | None = None) -> list[str]:
        """Register every offered tool with `executor` as ``<server>_<tool>``; return the names.

        With `mcp_filter`, only the tools of the servers it allows, and not excluded by it,
        are registered (as an agent's ``[agent.mcp]`` table does).

        A tool whose name differs from another's only in characters providers refuse
        (``get.sum`` beside ``get_sum``) is registered with a hash suffix
        (``<server>_get_sum_1a2b3c4d``).

        A tool whose input schema is not a JSON schema is not offered (its server's
        ``refused`` says why, and a warning is logged); the server's other tools are.

        Raises:
            DuplicateToolError: A resulting name is taken.
        """
        chosen = mcp_filter if mcp_filter is not None else MCPFilter()
        names: list[str] = []
        for server, connection in self.connections.items():
            tools = [t for t in connection.tools if chosen.allows(server, "tools", t.name)]
            names += executor.register_all(tools, namespace=server)
            add_server_secrets(executor, connection.config)
        return names

    async def aclose(self) -> None:
        """Stop every server (each one's stop goes on when the caller is cancelled meanwhile)."""
        closing = (connection.aclose() for connection in self.connections.values())
        await asyncio.shield(asyncio.gather(*closing, return_exceptions=True))
