"""An MCP server (low-level API) listing a tool whose input schema is not a JSON schema, and
a tool twice under one name.

Beside them, a tool that works: one broken tool of a third-party server must not take the
others down.
"""

from __future__ import annotations

import mcp_types as types
from _run import run_stdio
from mcp.server.lowlevel import Server

TOOLS = [
    types.Tool(
        name="broken",
        description="Its schema names a type JSON schema does not have.",
        input_schema={"type": "object", "properties": {"x": {"type": "nonsense"}}},
    ),
    types.Tool(
        name="echo",
        description="Return the text.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    ),
    types.Tool(
        name="echo",
        description="Listed again (a server's bug): the first is the one offered.",
        input_schema={"type": "object", "properties": {}},
    ),
]


async def list_tools(
    ctx: object, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("bad-schema", on_list_tools=list_tools, on_call_tool=call_tool)


if __name__ == "__main__":
    run_stdio(server)
