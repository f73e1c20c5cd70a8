"""An MCP server with resources, a resource template and prompts whose lists change.

Its tools change what it offers and say so with a list_changed notification, so a client's
refresh can be tested: ``add_prompt`` adds a prompt (prompts/list_changed), ``add_note`` adds a
resource (resources/list_changed), ``add_tool`` adds a tool (tools/list_changed) and
``drop_tool`` removes ``ephemeral``.
"""

from __future__ import annotations

from _run import run
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.server.mcpserver.resources.types import TextResource
from mcp_types import ToolAnnotations

server = MCPServer("resources")


@server.resource("notes://readme", name="readme", mime_type="text/markdown")
def readme() -> str:
    """The project's readme."""
    return "# Notes\nThe deploy key lives in vault path ops/deploy."


@server.resource("notes://config", name="config", mime_type="application/json")
def config() -> str:
    """The service configuration."""
    return '{"region": "eu-west-1", "replicas": 3}'


@server.resource("notes://by-id/{note_id}", name="note", mime_type="text/plain")
def note(note_id: str) -> str:
    """A note by its id."""
    return f"note {note_id}: remember to rotate keys"


@server.prompt()
def reviewer(language: str, strictness: str = "normal") -> str:
    """A code reviewer's instructions."""
    return f"You review {language} code with {strictness} strictness. Cite line numbers."


@server.prompt()
def greeting() -> str:
    """A plain greeting."""
    return "Say hello."


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def ephemeral() -> str:
    """A tool that ``drop_tool`` removes."""
    return "still here"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
async def add_prompt(name: str, text: str, ctx: Context) -> str:
    """Add a prompt returning `text`, and notify the client."""

    def render() -> str:
        return text

    server.add_prompt(Prompt.from_function(render, name=name, description=f"added {name}"))
    await ctx.session.send_prompt_list_changed()
    return f"added prompt {name}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
async def add_note(name: str, text: str, ctx: Context) -> str:
    """Add a resource ``notes://<name>``, and notify the client."""
    server.add_resource(TextResource(uri=f"notes://{name}", name=name, text=text))
    await ctx.session.send_resource_list_changed()
    return f"added notes://{name}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
async def add_tool(name: str, ctx: Context) -> str:
    """Add a tool answering its own name, and notify the client."""

    def answer() -> str:
        return name

    server.add_tool(answer, name=name, description=f"added {name}")
    await ctx.session.send_tool_list_changed()
    return f"added tool {name}"


@server.tool()
async def drop_tool(ctx: Context) -> str:
    """Remove ``ephemeral`` (unannotated: destructive by the spec's defaults)."""
    server.remove_tool("ephemeral")
    await ctx.session.send_tool_list_changed()
    return "dropped ephemeral"


if __name__ == "__main__":
    run(server)
