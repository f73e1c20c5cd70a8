"""An MCP server that dies in the middle of a session when asked to."""

from __future__ import annotations

import os

from _run import run
from mcp.server.mcpserver import MCPServer

server = MCPServer("crashy")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def pid() -> int:
    """Return the server's process id (so a test can kill it while it is idle)."""
    return os.getpid()


@server.tool()
def crash() -> str:
    """Exit the process at once, without answering."""
    os._exit(3)


if __name__ == "__main__":
    run(server)
