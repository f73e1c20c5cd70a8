"""An MCP server for the command line's sake: its environment, and look-alike tool names.

Started with ``noisy`` as its first argument, it prints a line that is not JSON on stdout
before serving, as some servers' start-up banners do.
"""

from __future__ import annotations

import os
import sys

from _run import run
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("env")
# Read-only, and said so: a tool without annotations is destructive by the spec's defaults.
_READ_ONLY = ToolAnnotations(read_only_hint=True)


@server.tool(annotations=_READ_ONLY)
def getenv(name: str) -> str:
    """Return the value of one of the server's environment variables ('(unset)' if none)."""
    return os.environ.get(name, "(unset)")


@server.tool(name="get.sum", annotations=_READ_ONLY)
def get_sum_dotted(a: int, b: int) -> str:
    """Add two numbers (the dotted tool)."""
    return f"dotted {a + b}"


@server.tool(name="get_sum", annotations=_READ_ONLY)
def get_sum_plain(a: int, b: int) -> str:
    """Add two numbers (the plain tool)."""
    return f"plain {a + b}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["noisy"]:
        print("env server 1.0 starting (this banner is not JSON)", flush=True)
        del sys.argv[1]
    run(server)
