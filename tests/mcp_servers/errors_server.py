"""An MCP server whose tools fail in both MCP styles: is_error results and JSON-RPC errors."""

from __future__ import annotations

from _run import run
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent

# Rendering the traceback of `raises` with rich costs seconds; the test needs none of it.
server = MCPServer("errors", log_level="CRITICAL")


@server.tool()
def reported_failure(path: str) -> CallToolResult:
    """Return an is_error result."""
    return CallToolResult(
        content=[TextContent(type="text", text=f"file {path} not found")], is_error=True
    )


@server.tool()
def raises(text: str) -> str:
    """Raise inside the tool: the server turns it into an is_error result."""
    raise ValueError(f"cannot handle {text}")


@server.tool()
def rpc_error(text: str) -> str:
    """Raise a JSON-RPC error: the client SDK raises MCPError."""
    raise MCPError(code=INVALID_PARAMS, message=f"rejected {text}", data={"field": "text"})


if __name__ == "__main__":
    run(server)
