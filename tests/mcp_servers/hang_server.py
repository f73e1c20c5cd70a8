"""An MCP server with a tool that never answers and one that freezes the whole server."""

from __future__ import annotations

import sys
import time

import anyio
from _run import run
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("hangs")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
async def hang(ctx: Context) -> str:
    """Report that the call arrived, then never answer (the server stays responsive)."""
    await ctx.report_progress(0, None, "hanging")
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
async def freeze() -> str:
    """Block the server's event loop: it stops answering anything, pings included."""
    time.sleep(30)  # noqa: ASYNC251 - blocking the loop is the point
    return "unreachable"


if __name__ == "__main__":
    print("hang server starting", file=sys.stderr, flush=True)
    run(server)
