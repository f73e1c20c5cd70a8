"""A well-behaved MCP server: plain, structured and progress-reporting tools."""

from __future__ import annotations

import sys

from _run import run
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("basic")


class Sum(BaseModel):
    total: int
    terms: list[int]


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(numbers: list[int]) -> Sum:
    """Add numbers (structured result)."""
    return Sum(total=sum(numbers), terms=numbers)


@server.tool()
async def count_to(n: int, ctx: Context) -> str:
    """Count to n, reporting progress at each step."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
    return f"counted to {n}"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """Return an HTTP request header ('(none)' over stdio or when absent)."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return str(headers.get(name, "(none)")) if headers is not None else "(none)"


@server.tool()
def shout(text: str) -> str:
    """Write to stderr, then answer."""
    print(f"STDERR-MARKER {text}", file=sys.stderr, flush=True)
    return text.upper()


@server.tool()
def repeat(text: str, times: int) -> str:
    """Return text repeated (a result as large as asked)."""
    return text * times


if __name__ == "__main__":
    print("basic server starting", file=sys.stderr, flush=True)
    run(server)
